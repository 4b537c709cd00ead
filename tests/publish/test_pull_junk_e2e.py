"""Nothing unsigned decides and nothing crowds out the real publication, against the loopback
registry (and, for what no registry would store, the hostile relay in front of it): junk
attestations signed by another key sorted before the real one, 64 stored and 10,000 listed; a
publication signed with the right key from a stale lock, newer than the good one; signed times at
the ends of the calendar; a registry that stalls. Pull runs as the command line, measured alone
(fixtures/measured_pull.py), and must take the real publication each time in bounds."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid

import pytest

from fixtures.hostile_registry import exactly
from fixtures.measured_pull import MEGABYTES, SECONDS, pull_measured, through
from fixtures.paths import ROOT
from fixtures.publication import STACK, make_project, publish_run, signed_at
from fixtures.tls_registry import push_stack_image
from servestack import publish
from servestack.errors import InputError, PublishError, RegistryError
from servestack.publish import listing, push, signing
from servestack.publish.bundle import ATTESTATION_TYPE
from servestack.records.imageref import ImageRef
from servestack.sources.registry import OCI_INDEX, OCI_MANIFEST, Client, sha256_digest

pytestmark = pytest.mark.e2e


@pytest.fixture
def fresh(registry, tmp_path) -> dict:
    """A new image in the loopback registry, published once with a new key."""
    client = Client(registry, f"servestack-test/junk-{uuid.uuid4().hex[:8]}")
    image = f"{registry}/{client.repository}@{push_stack_image(client, (ROOT / 'pins' / f'{STACK}.lock').read_bytes())}"
    project = make_project(tmp_path / "checkout", image)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    record = publish.publish(project, STACK, key=private)
    return {"image": ImageRef.parse(image), "client": client, "project": project, "key": private, "pub": public,
            "record": record}


def _junk_entry(signer, image: ImageRef, envelope: str, digest: str) -> dict:
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": 900, "artifactType": ATTESTATION_TYPE,
            "annotations": listing.listing_annotations(signer, image.digest, envelope)}


def test_64_stored_junk_attestations_of_another_key_sorted_first_never_crowd_out_the_real_one(fresh, tmp_path):
    """What the 64-candidate cap let through: 64 attestations (the real statement signed by another
    key, its listing signed by that key), each ground until its digest sorts before the real one,
    stored in the registry and indexed in the fallback tag. Pull and pull --bundle take the real one
    and count the junk in one line, fetching none of it."""
    image, client = fresh["image"], fresh["client"]
    real = fresh["record"]["attestation"].split("@")[1]
    manifest = json.loads(client.get_manifest(real)[0])
    other = signing.load_signer(signing.keygen(tmp_path / "other.key")[0])
    statement = json.loads(base64.b64decode(json.loads(client.get_blob(manifest["layers"][0]["digest"]))["payload"]))
    envelope = signing.sign_statement(statement, other)
    client.push_blob(envelope)
    junk, salt = [], 0
    while len(junk) < 64:
        salt += 1
        body = {**manifest, "layers": [{**manifest["layers"][0], "digest": sha256_digest(envelope), "size": len(envelope)}],
                "annotations": {**manifest["annotations"], **listing.listing_annotations(other, image.digest, sha256_digest(envelope)),
                                "salt": str(salt)}}
        data = json.dumps(body, sort_keys=True).encode()
        if sha256_digest(data) < real:
            client.put_manifest(sha256_digest(data), data, OCI_MANIFEST)
            junk.append({"mediaType": OCI_MANIFEST, "digest": sha256_digest(data), "size": len(data),
                         "artifactType": ATTESTATION_TYPE, "annotations": body["annotations"]})
    tag = client.fallback_tag(image.digest)
    index = json.loads(client.get_manifest(tag)[0])
    client.put_manifest(tag, json.dumps({**index, "manifests": junk + index["manifests"]}).encode(), OCI_INDEX)
    for extra in ((), ("--bundle", fresh["record"]["bundle_digest"])):
        measured = pull_measured(str(image), fresh["pub"], tmp_path / f"pulled{len(extra)}", fresh["project"].root,
                                 extra=extra)
        assert measured.returncode == 0, measured.output
        assert "64 attestation(s) whose listing this key did not sign" in measured.output
        assert measured.seconds < 3 and measured.peak_mb < 100, measured  # a normal pull's bounds
        taken = json.loads((tmp_path / f"pulled{len(extra)}" / "publication.json").read_text())
        assert taken["bundle"] == fresh["record"]["bundle_digest"]


def test_10000_listed_junk_attestations_sorted_first_are_counted_not_fetched(fresh, hostile, tmp_path):
    """10,000 entries before the real one in the referrers index a relay serves: 5,000 with a listing
    signed by another key, 5,000 without one (as attestations made before listings were signed)."""
    image, client = fresh["image"], fresh["client"]
    other = signing.load_signer(signing.keygen(tmp_path / "other.key")[0])
    tag = client.fallback_tag(image.digest)
    index = json.loads(client.get_manifest(tag)[0])
    junk = []
    for n in range(10_000):
        digest = f"sha256:0000{hashlib.sha256(str(n).encode()).hexdigest()[4:]}"
        envelope = f"sha256:{hashlib.sha256(b'e' + str(n).encode()).hexdigest()}"
        entry = _junk_entry(other, image, envelope, digest)
        junk.append(entry if n % 2 else {k: v for k, v in entry.items() if k != "annotations"})
    flooded = json.dumps({**index, "manifests": junk + index["manifests"]}).encode()
    assert len(flooded) < 4 << 20  # what a registry stores as a manifest
    hostile.answer(f"/v2/{image.repository}/manifests/{tag}", exactly(flooded))
    measured = pull_measured(through(hostile, image), fresh["pub"], tmp_path / "pulled", fresh["project"].root)
    assert measured.returncode == 0, measured.output
    assert "5000 attestation(s) whose listing this key did not sign" in measured.output
    assert "5000 attestation(s) without a signed listing" in measured.output
    assert measured.seconds < SECONDS and measured.peak_mb < MEGABYTES, measured


def test_a_stale_lock_publication_newer_than_the_good_one_is_skipped_and_publish_refuses_to_make_one(
        fresh, tmp_path, monkeypatch):
    """The trusted key publishes the same digest from records holding another lock (publish now refuses
    it, naming the file, as it refuses a run's results of another digest; made here past that check):
    pull warns it is unusable and takes the older, valid one, with and without --not-before."""
    project, lock = fresh["project"], fresh["project"].lock_file(STACK)
    run = project.artifacts(STACK) / "runs" / "elsewhere" / "throughput"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"image": f"{fresh['image'].name}@sha256:{'e' * 64}"}))
    with pytest.raises(PublishError, match=r"build/dev-cpu/runs/elsewhere/throughput/results.json: results of "
                                           r"\S+@sha256:e{64}, not of"):
        publish.publish(project, STACK, key=fresh["key"], run_id="elsewhere")
    lock.write_bytes(lock.read_bytes() + b"\n")  # another lock: the same content, other bytes, another sha256
    with pytest.raises(PublishError, match=rf"{lock}: lock \w+, but .* was built from lock"):
        publish.publish(project, STACK, key=fresh["key"])
    monkeypatch.setattr(push, "check_records_belong", lambda *args: None)
    stale = publish.publish(project, STACK, key=fresh["key"])
    assert stale["bundle"] != fresh["record"]["bundle"]
    good = fresh["record"]["attestation"].split("@")[1]
    for n, extra in enumerate(((), ("--not-before", "2026-01-01"))):
        measured = pull_measured(str(fresh["image"]), fresh["pub"], tmp_path / f"pulled{n}", project.root, extra=extra)
        assert measured.returncode == 0, measured.output
        assert "but unusable" in measured.output and "label io.servestack.lock.sha256 is" in measured.output
        assert json.loads((tmp_path / f"pulled{n}" / "publication.json").read_text())["attestation"] == good


def test_signed_times_at_the_ends_of_the_calendar_are_refused_by_value_and_the_real_one_pulled(fresh, tmp_path, monkeypatch):
    times = ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+23:59")
    for n, finished_on in enumerate(times):
        with monkeypatch.context() as patched:
            patched.setattr(push, "provenance", signed_at(finished_on))
            publish_run(fresh["project"], fresh["key"], f"extreme-{n}")
    measured = pull_measured(str(fresh["image"]), fresh["pub"], tmp_path / "pulled", fresh["project"].root)
    assert measured.returncode == 0, measured.output
    for finished_on in times:
        assert f"finishedOn {finished_on} is out of range" in measured.output
    refused = pull_measured(str(fresh["image"]), fresh["pub"], tmp_path / "floor", fresh["project"].root,
                            extra=("--not-before", times[0]))
    assert refused.returncode == InputError.exit_code and "out of range" in refused.output, refused.output


def _silence():
    def body():
        time.sleep(20)  # longer than the client waits; the relay's thread then ends
        yield b""
    return body


def _trickle(data: bytes, every: float = 10):
    def body():
        for i in range(len(data)):
            yield data[i:i + 1]
            time.sleep(every)
    return body


def test_a_stalling_registry_costs_seconds_and_names_the_blob(fresh, hostile, tmp_path):
    """Through a relay that stalls: an older signed publication's envelope sends headers then nothing
    and a stray SPDX referrer one byte every 10 s; the newest is pulled in seconds. Then the taken
    publication's own file stalls: pull fails within the deadline, naming the registry and the blob."""
    image, client = fresh["image"], fresh["client"]
    newer = publish_run(fresh["project"], fresh["key"], "run-1")
    older = json.loads(client.get_manifest(fresh["record"]["attestation"].split("@")[1])[0])
    hostile.answer(f"/v2/{image.repository}/blobs/{older['layers'][0]['digest']}", _silence(), "application/octet-stream")
    sbom = fresh["record"]["sbom"]["referrer"].split("@")[1]
    stray = json.loads(client.get_manifest(sbom)[0]) | {"annotations": {"stray": "yes"}}
    data = json.dumps(stray).encode()
    client.put_manifest(sha256_digest(data), data, OCI_MANIFEST)
    tag = client.fallback_tag(image.digest)
    index = json.loads(client.get_manifest(tag)[0])
    index["manifests"].append({"mediaType": OCI_MANIFEST, "digest": sha256_digest(data), "size": len(data),
                               "artifactType": "application/spdx+json"})
    client.put_manifest(tag, json.dumps(index).encode(), OCI_INDEX)
    hostile.answer(f"/v2/{image.repository}/manifests/{sha256_digest(data)}", _trickle(data), OCI_MANIFEST)
    measured = pull_measured(through(hostile, image), fresh["pub"], tmp_path / "pulled", fresh["project"].root)
    assert measured.returncode == 0, measured.output
    assert measured.seconds < 20, measured
    assert f"registry {hostile.address} stalled" in measured.output
    taken = json.loads((tmp_path / "pulled" / "publication.json").read_text())
    assert taken["bundle"] == newer["bundle_digest"] and taken["unsigned_sboms"] == [sha256_digest(data)]

    recipe = next(f for f in newer["files"] if f["title"].startswith("recipes/"))
    hostile.answer(f"/v2/{image.repository}/blobs/{recipe['digest']}", _trickle(b"x" * 3700), "application/octet-stream")
    measured = pull_measured(through(hostile, image), fresh["pub"], tmp_path / "failed", fresh["project"].root,
                             extra=("--timeout", "30"))
    assert measured.returncode == PublishError.exit_code, measured.output
    assert f"registry {hostile.address} stalled" in measured.output and recipe["digest"] in measured.output
    assert measured.seconds < 20 and not (tmp_path / "failed").exists(), measured


def test_a_tls_registry_whose_ca_this_machine_lacks_is_named_not_a_bare_http_400(tls_registry, tmp_path, monkeypatch):
    """The registry speaks TLS only; with no ca.crt in certs.d, the error names the file to put it in."""
    monkeypatch.setenv("SERVESTACK_CERTS_D", str(tmp_path / "certs.d"))
    key = signing.keygen(tmp_path / "k.key")[1]
    reference = f"{tls_registry.address}/servestack-test/none@sha256:{'a' * 64}"
    with pytest.raises(RegistryError, match=rf"registry {tls_registry.address} serves TLS with a certificate this "
                                            rf"machine does not trust .*put its CA in {tmp_path}/certs.d/"
                                            rf"{tls_registry.address}/ca.crt"):
        publish.pull(reference, key=key, out=tmp_path / "pulled")


def test_an_attestation_listed_without_its_signature_is_still_examined_when_nothing_signed_is_usable(fresh, tmp_path):
    """A publication made before listings were signed (its entry has no listing annotations): pull
    verifies it one by one, as before, when no signed listing gives a usable publication."""
    image, client = fresh["image"], fresh["client"]
    tag = client.fallback_tag(image.digest)
    index = json.loads(client.get_manifest(tag)[0])
    unlisted = [{k: v for k, v in m.items() if k != "annotations"} if m.get("artifactType") == ATTESTATION_TYPE else m
                for m in index["manifests"]]
    client.put_manifest(tag, json.dumps({**index, "manifests": unlisted}).encode(), OCI_INDEX)
    out = publish.pull(str(image), key=fresh["pub"], out=tmp_path / "pulled")
    assert json.loads((out / "publication.json").read_text())["bundle"] == fresh["record"]["bundle_digest"]


def test_sigterm_as_out_is_staged_leaves_it_whole_and_no_staging_directory(fresh, tmp_path, monkeypatch):
    """SIGTERM delivered the moment pull's staging directory exists (where one pull in ten left an
    empty `.out.*` beside --out): the signal waits until OUT is whole, then ends the pull (Terminated,
    exit 143 on the command line), and nothing else is left."""
    import os
    import signal
    import tempfile as tempfile_module

    from servestack.errors import Terminated
    from servestack.publish import fetch
    from servestack.util.interrupts import signals_unwind

    real = tempfile_module.mkdtemp

    def mkdtemp_then_sigterm(*args, **kwargs):
        made = real(*args, **kwargs)
        if kwargs.get("prefix") == ".out.":  # pull's staging, not another temporary directory
            os.kill(os.getpid(), signal.SIGTERM)  # handled before the next line of pull runs
        return made

    monkeypatch.setattr(fetch.tempfile, "mkdtemp", mkdtemp_then_sigterm)
    with signals_unwind(), pytest.raises(Terminated):
        publish.pull(str(fresh["image"]), key=fresh["pub"], out=tmp_path / "out")
    assert (tmp_path / "out" / "publication.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []
