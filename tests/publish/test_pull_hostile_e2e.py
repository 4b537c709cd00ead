"""Pull under attack, against real registries: publications signed with the right key that lie
about their time or bind another image, a hostile registry serving 2 GiB bodies and a 10,000-entry
referrers index, stray SPDX referrers, and a damaged publication that a re-run of publish repairs.

The size attacks go through a small hostile registry (fixtures/hostile_registry.py) in front of the
plain loopback registry; pull runs as the command line in a child process, so its peak memory is
measured alone (os.wait4) and compared with the bounds the issue sets: 30 s and 200 MB."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from fixtures.hostile_registry import endless, exactly
from fixtures.measured_pull import MEGABYTES, SECONDS, pull_measured, through
from fixtures.paths import ROOT
from fixtures.publication import STACK, make_project, new_image, publish_run, signed_at
from fixtures.tls_registry import push_stack_image
from servestack import publish
from servestack.errors import PublishError, RegistryError, ServestackError
from servestack.publish import cosign, push, sbom, signing
from servestack.publish.bundle import ATTESTATION_TYPE, BundleFile
from servestack.publish.signedtime import parse_rfc3339
from servestack.records.imageref import ImageRef
from servestack.sources.registry import OCI_INDEX, OCI_MANIFEST, Client, sha256_digest

pytestmark = pytest.mark.e2e
GiB = 1 << 30


# ------------------------------------------------------------------ signed with the right key, lying


def test_of_publications_dated_in_the_future_malformed_offset_or_binding_another_image_pull_takes_the_real_one(
        env, tmp_path, monkeypatch, capsys):
    """Five publications of one image, all signed with the right key: the real one; one dated 2030;
    one dated `9999`; one an hour older written with a +05:00 offset (as a string it sorts last);
    one whose recipes bind another digest. Pull takes the real one and names why each other is
    skipped; --bundle on the one binding another digest refuses it, naming the recipe and the
    reference; --not-before after the real one refuses everything (a rollback floor)."""
    image, _ = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    real = publish.publish(project, STACK, key=private)
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).astimezone(timezone(timedelta(hours=5)))
    forged = {}
    for run_id, finished_on in (("future", "2030-01-01T00:00:00Z"), ("malformed", "9999"),
                                ("offset", an_hour_ago.isoformat(timespec="microseconds"))):
        with monkeypatch.context() as patched:
            patched.setattr(push, "provenance", signed_at(finished_on))
            forged[run_id] = publish_run(project, private, run_id)
    other_hex = "0" * 64
    rendered = push.bundle_files

    def binding_another_digest(*args, **kwargs):
        return [BundleFile(title=f.title, data=f.data.replace(ImageRef.parse(image).hex.encode(), other_hex.encode()))
                if f.title.startswith("recipes/") else f for f in rendered(*args, **kwargs)]

    with monkeypatch.context() as patched:
        patched.setattr(push, "bundle_files", binding_another_digest)
        forged["rebound"] = publish_run(project, private, "rebound")

    capsys.readouterr()
    out = publish.pull(image, key=public, out=tmp_path / "pulled")
    said = capsys.readouterr().out
    taken = json.loads((out / "publication.json").read_text())
    assert taken["bundle"] == real["bundle_digest"]
    skipped = "\n".join(taken["skipped"])
    assert f"{forged['future']['attestation'].split('@')[1]}: finishedOn 2030-01-01T00:00:00Z is in the future" in skipped
    assert f"{forged['malformed']['attestation'].split('@')[1]}: finishedOn '9999' is not an RFC 3339 time" in skipped
    assert re.search(rf"{forged['offset']['attestation'].split('@')[1]}: verifies, published .*older than", skipped)
    repository = ImageRef.parse(image).repository
    assert re.search(rf"{forged['rebound']['attestation'].split('@')[1]}: recipes/\S+\.yaml binds "
                     rf"'[^']*{repository}@sha256:{other_hex}', not {repository}@", skipped)
    assert "recipes bound to the digest and lock" in said

    with pytest.raises(ServestackError, match=rf"recipes/\S+ binds '\S+@sha256:{other_hex}'"):
        publish.pull(image, key=public, out=tmp_path / "rebound", bundle=forged["rebound"]["bundle_digest"])
    floor = parse_rfc3339(taken["published"]) + timedelta(seconds=1)
    with pytest.raises(ServestackError, match="no publication signed by .* is not older than"):
        publish.pull(image, key=public, out=tmp_path / "floor", not_before_time=floor.isoformat())
    publish.pull(image, key=public, out=tmp_path / "floor-ok", not_before_time=taken["published"])
    assert not (tmp_path / "rebound").exists() and not (tmp_path / "floor").exists()


# ------------------------------------------------------------------ skip, don't block; a re-run repairs

def test_stray_spdx_referrers_a_replay_and_a_missing_one_are_skipped_with_a_warning(published, tmp_path, capsys):
    """Two SPDX referrers beside the real SBOM: one whose subject is another image (a replay), one
    listed but missing from the registry. Neither blocks the pull; both are named as warnings."""
    client, image = published["client"], ImageRef.parse(published["image"])
    genuine = published["record"]["sbom"]["referrer"].split("@")[1]
    replay = json.loads(client.get_manifest(genuine)[0])
    other = push_stack_image(client, (ROOT / "pins" / f"{STACK}.lock").read_bytes(), tag="other", salt=b"o")
    replay["subject"] = {"mediaType": OCI_MANIFEST, "digest": other, "size": 1}
    data = json.dumps(replay).encode()
    client.put_manifest(sha256_digest(data), data, OCI_MANIFEST)
    gone = json.dumps({**replay, "annotations": {"deleted": "soon"}}).encode()
    missing = sha256_digest(gone)
    client.put_manifest(missing, gone, OCI_MANIFEST)
    tag = client.fallback_tag(image.digest)
    index = json.loads(client.get_manifest(tag)[0])
    index["manifests"] += [{"mediaType": OCI_MANIFEST, "digest": d, "size": len(d_bytes), "artifactType": sbom.SPDX_JSON}
                           for d, d_bytes in ((sha256_digest(data), data), (missing, gone))]
    client.put_manifest(tag, json.dumps(index).encode(), OCI_INDEX)  # the registry checks they exist ...
    client.delete_manifest(missing)  # ... so one is deleted after it is listed

    capsys.readouterr()
    out = publish.pull(str(image), key=published["pub"], out=tmp_path / "pulled")
    said = capsys.readouterr().out
    assert re.search(rf"WARNING: .* referrer {sha256_digest(data)} .*its subject is {other}", said)
    assert re.search(rf"WARNING: .* referrer {missing} .*listed as a referrer but missing", said)
    assert sorted(json.loads((out / "publication.json").read_text())["unsigned_sboms"]) == sorted(
        [sha256_digest(data), missing])


def test_a_rerun_of_publish_restores_a_deleted_bundle_blob_and_reports_a_dangling_cosign_layer(published, tmp_path, capsys):
    """A recipe's blob deleted from the registry breaks the pull; a dangling first layer at the
    `.att` tag (its blob gone, the tag left) is what cosign skips. Publishing again puts the blob
    back, says so, reports the dangling layer and rewrites the tag without it; pull then verifies."""
    client, image = published["client"], ImageRef.parse(published["image"])
    recipe = next(f for f in published["record"]["files"] if f["title"].startswith("recipes/"))
    client.delete_blob(recipe["digest"])
    with pytest.raises(ServestackError, match=rf"{recipe['title']}: .*missing"):
        publish.pull(str(image), key=published["pub"], out=tmp_path / "broken")
    att = cosign.attestation_tag(image)
    manifest = json.loads(client.get_manifest(att)[0])
    dangling = client.push_blob(b"another signer's envelope, since lost")
    manifest["layers"].insert(0, {"mediaType": cosign.DSSE_LAYER, "digest": dangling, "size": 38})
    client.put_manifest(att, json.dumps(manifest).encode(), OCI_MANIFEST)
    client.delete_blob(dangling)

    capsys.readouterr()
    again = publish.publish(published["project"], STACK, key=published["key"])
    said = capsys.readouterr().out
    assert again["attestation"] == published["record"]["attestation"]  # repaired, not re-signed
    assert again["repaired"] == [f"blob {recipe['digest']}"]
    assert again["damaged"] == [f"{att}: layer {dangling} is missing from the registry; left out"]
    assert f"repaired    blob {recipe['digest']}" in said and "damaged     " in said
    assert dangling not in client.get_manifest(att)[0].decode()
    publish.pull(str(image), key=published["pub"], out=tmp_path / "pulled")


# ------------------------------------------------------------------ a hostile registry: bounded reads

@pytest.fixture(scope="module")
def origin(registry, tmp_path_factory) -> dict:
    """One image published once to the plain loopback registry."""
    root = tmp_path_factory.mktemp("origin")
    repository = f"servestack-test/hostile-{uuid.uuid4().hex[:8]}"
    client = Client(registry, repository)
    digest = push_stack_image(client, (ROOT / "pins" / f"{STACK}.lock").read_bytes())
    image = f"{registry}/{repository}@{digest}"
    project = make_project(root / "checkout", image)
    private, public = signing.keygen(root / "keys" / "publisher.key")
    record = publish.publish(project, STACK, key=private)
    return {"image": ImageRef.parse(image), "client": client, "record": record, "pub": public, "project": project}


def test_a_normal_publication_pulls_through_the_relay_within_the_same_bounds(origin, hostile, tmp_path):
    measured = pull_measured(through(hostile, origin["image"]), origin["pub"], tmp_path / "normal",
                             origin["project"].root)
    assert measured.returncode == 0, measured.output
    assert measured.seconds < SECONDS and measured.peak_mb < MEGABYTES


@pytest.mark.parametrize("where", ["referrers index", "attestation envelope", "bundle file"])
def test_a_2_gib_body_is_cut_off_at_its_limit_in_seconds_and_megabytes(origin, hostile, tmp_path, where):
    image, client = origin["image"], origin["client"]
    attestation = json.loads(client.get_manifest(origin["record"]["attestation"].split("@")[1])[0])
    recipe = next(f for f in origin["record"]["files"] if f["title"].startswith("recipes/"))
    path = {"referrers index": f"manifests/{client.fallback_tag(image.digest)}",
            "attestation envelope": f"blobs/{attestation['layers'][0]['digest']}",
            "bundle file": f"blobs/{recipe['digest']}"}[where]
    hostile.answer(f"/v2/{image.repository}/{path}", endless(2 * GiB))
    measured = pull_measured(through(hostile, image), origin["pub"], tmp_path / where.replace(" ", "-"),
                             origin["project"].root)
    # The referrers index is read before any candidate, so the registry's error ends the pull; a
    # candidate's unreadable part only disqualifies it, and no publication verifying is the error.
    code = {"referrers index": RegistryError.exit_code}.get(where, PublishError.exit_code)
    assert measured.returncode == code, measured.output
    assert "not read further" in measured.output and "Traceback" not in measured.output
    assert measured.seconds < SECONDS and measured.peak_mb < MEGABYTES


def test_an_index_listing_the_real_attestation_6000_times_is_deduplicated_and_pulls(origin, hostile, tmp_path):
    """6,000 copies of its entry (with its signed listing, 580 bytes each) is what fits in the 4 MiB a
    referrers index may have."""
    image, client = origin["image"], origin["client"]
    tag = client.fallback_tag(image.digest)
    index = json.loads(client.get_manifest(tag)[0])
    [attestation] = [m for m in index["manifests"] if m.get("artifactType") == ATTESTATION_TYPE]
    flooded = json.dumps({**index, "manifests": index["manifests"] + [attestation] * 6_000}).encode()
    hostile.answer(f"/v2/{image.repository}/manifests/{tag}", exactly(flooded))
    measured = pull_measured(through(hostile, image), origin["pub"], tmp_path / "flooded", origin["project"].root)
    assert measured.returncode == 0, measured.output
    assert "of 1 candidate)" in measured.output
    assert measured.seconds < SECONDS and measured.peak_mb < MEGABYTES
