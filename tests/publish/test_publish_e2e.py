"""Publish, pull and verify against a real registry: Debian's docker-registry behind TLS with an
htpasswd login (no referrers API, so the fallback tag is what is exercised), with the credentials
in Docker's config.json, cross-checked with oras and cosign from Debian trixie."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml

from fixtures import trixie_tools as tools
from fixtures.paths import ROOT
from fixtures.publication import STACK, make_project, new_image
from fixtures.tls_registry import TlsRegistry, push_stack_image
from servestack import publish
from servestack.cluster import srtctl_tool
from servestack.errors import ClusterToolsMissing, ServestackError, SignatureError
from servestack.publish import sbom, signing
from servestack.records.imageref import ImageRef
from servestack.sources.registry import OCI_MANIFEST, Client, Descriptor, sha256_digest
from servestack.util.fsutil import atomic_write_json
from servestack.util.proc import run
from servestack.util.project import Project

pytestmark = pytest.mark.e2e


def test_publish_then_pull_writes_verified_recipes_bound_to_the_digest(published, tmp_path):
    image, record = published["image"], published["record"]
    assert record["image"] == image and record["referrers"].startswith("fallback tag sha256-")
    titles = [f["title"] for f in record["files"]]
    assert {"pins/dev-cpu.lock", "pins/dev-cpu.yaml", "build/build.json", "build/image.json", "build/smoke.json"} <= set(titles)
    assert any(t.startswith("recipes/") for t in titles)

    out = publish.pull(image, key=published["pub"], out=tmp_path / "pulled")
    recipes = sorted((out / "recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        assert yaml.safe_load(path.read_text())["model"]["container"] == image
    assert (out / "pins" / "dev-cpu.lock").read_bytes() == (ROOT / "pins" / "dev-cpu.lock").read_bytes()
    verified = json.loads((out / "publication.json").read_text())
    assert verified["bundle"] == record["bundle"].split("@")[1]
    document = sbom.read_sbom((out / sbom.SBOM_TITLE).read_bytes(), ImageRef.parse(image), "pulled")
    debs = {p["name"]: p["versionInfo"] for p in document["packages"] if p["SPDXID"].startswith("SPDXRef-deb-")}
    assert debs == {"libc6": "2.36-9+deb12u14", "python3.11-minimal": "3.11.2-6+deb12u8"}  # the base layer's dpkg
    assert ("plain-lib", "1.0") in sbom.python_distributions(document)  # build.json's wheels
    _srtctl_accepts(recipes)

    # Same inputs, same bundle digest (created comes from the lock's SOURCE_DATE_EPOCH).
    again = publish.publish(published["project"], STACK, key=published["key"])
    assert again["bundle"] == record["bundle"]


def _srtctl_accepts(recipes: list[Path]) -> None:
    """The real srtctl (from the vendored srt-slurm) plans each pulled recipe: `srtctl dry-run -f`."""
    try:
        srtctl = srtctl_tool.ensure_srtctl(ROOT)
    except ClusterToolsMissing as missing:
        warnings.warn(f"srtctl dry-run not checked: {missing}", stacklevel=2)
        return
    from concurrent.futures import ThreadPoolExecutor

    def dry_run(recipe: Path) -> str:
        done = run(srtctl.argv("dry-run", "-f", str(recipe)), env=srtctl.env, check=False, timeout=300)
        return "" if done.returncode == 0 and "DRY-RUN" in done.stdout else f"{recipe}: {done.stdout[-1500:]}"

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(dry_run, recipes) if f]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("same_image", [True, False])
def test_the_per_pr_report_goes_into_the_bundle_only_for_the_image_it_was_made_on(env, tmp_path, same_image):
    image, _ = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    other = image.rsplit("@", 1)[0] + "@sha256:" + "0" * 64
    report = {"stack": STACK, "image": image if same_image else other,
              "prs": [{"pr": "vllm-project/vllm#41869", "necessary": "not run"}]}
    atomic_write_json(project.artifacts(STACK) / "prs.json", report)
    private, _ = signing.keygen(tmp_path / "keys" / "publisher.key")
    record = publish.publish(project, STACK, key=private)
    assert ("build/prs.json" in {f["title"] for f in record["files"]}) is same_image


def test_a_cluster_publishes_its_run_for_a_pulled_image_and_pull_then_takes_the_results(published, tmp_path):
    """What the GB200 job does: pull the build's bundle, run, then publish the run's results with
    the pulled records from a checkout that never built the image."""
    image = published["image"]
    pulled = publish.pull(image, key=published["pub"], out=tmp_path / "bundle")
    cluster = Project(root=tmp_path / "cluster")
    for name in ("pins", "recipes"):
        shutil.copytree(ROOT / name, cluster.root / name)
    run = cluster.artifacts(STACK) / "runs" / "gha-1" / "accuracy"
    atomic_write_json(run / "results.json", {"accuracy": 0.5})
    (run / "report.md").write_text("# accuracy\n")
    record = publish.publish(cluster, STACK, key=published["key"], image=image, run_id="gha-1", records_dir=pulled)
    assert "runs/gha-1/accuracy/results.json" in [f["title"] for f in record["files"]]
    out = publish.pull(image, key=published["pub"], out=tmp_path / "after")
    assert json.loads((out / "runs/gha-1/accuracy/results.json").read_text()) == {"accuracy": 0.5}
    first = publish.pull(image, key=published["pub"], out=tmp_path / "first",
                         bundle=published["record"]["bundle_digest"])
    assert not (first / "runs").exists()
    with pytest.raises(ServestackError, match="is for .*, not"):  # records for another digest are refused
        other, _ = new_image(published["registry"])
        publish.publish(cluster, STACK, key=published["key"], image=other, records_dir=pulled)


def test_oras_discovers_the_bundle_and_cosign_verifies_the_attestation(published, tmp_path):
    image = ImageRef.parse(published["image"])
    oras = tools.trixie_tool("oras")
    # oras reads Docker's config.json; it is told the CA (it does not read certs.d).
    ca = Path(os.environ["SERVESTACK_CERTS_D"]) / image.registry / "ca.crt"
    listing = subprocess.run([str(oras), "discover", "--ca-file", str(ca), "--format", "json", str(image)],
                             check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert listing.returncode == 0, listing.stderr
    found = json.loads(listing.stdout)
    digests = json.dumps(found)
    assert published["record"]["bundle"].split("@")[1] in digests
    assert publish.PUBLICATION_TYPE in digests
    assert published["record"]["sbom"]["referrer"].split("@")[1] in digests and sbom.SPDX_JSON in digests

    client = published["client"]
    attestation = json.loads(client.get_manifest(published["record"]["attestation"].split("@")[1])[0])
    envelope = tmp_path / "envelope.json"
    envelope.write_bytes(client.get_blob(attestation["layers"][0]["digest"]))
    lock = ROOT / "pins" / f"{STACK}.lock"  # one of the statement's subjects
    cosign = tools.trixie_tool("cosign")
    checked = subprocess.run([str(cosign), "verify-blob-attestation", "--key", str(published["pub"]), "--signature",
                              str(envelope), "--type", "slsaprovenance1", "--insecure-ignore-tlog", str(lock)],
                             check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Verified OK" in checked.stdout + checked.stderr
    other_key = signing.keygen(tmp_path / "other.key")[1]
    refused = subprocess.run([str(cosign), "verify-blob-attestation", "--key", str(other_key), "--signature",
                              str(envelope), "--type", "slsaprovenance1", "--insecure-ignore-tlog", str(lock)],
                             check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert refused.returncode != 0


def test_stock_cosign_verifies_the_image_signature_its_slsa_provenance_and_its_sbom_offline(published, tmp_path):
    """cosign 2.5.0 as Debian ships it, by the image digest alone: `verify` finds the signature at
    the .sig tag, `verify-attestation --type slsaprovenance1` the SLSA v1 statement and `--type
    spdxjson` the SBOM at .att; another key verifies none. Re-publishing adds no second signature
    or attestation by the same key."""
    image = ImageRef.parse(published["image"])
    cosign = tools.trixie_tool("cosign")
    ca = Path(os.environ["SERVESTACK_CERTS_D"]) / image.registry / "ca.crt"
    env = {**os.environ, "HOME": str(tmp_path), "SSL_CERT_FILE": str(ca)}  # Go reads the CA from here

    def cosign_run(*args: str, key: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(cosign), *args, "--key", str(key), "--insecure-ignore-tlog", str(image)],
                              check=False, capture_output=True, text=True, env=env, timeout=120)

    verified = cosign_run("verify", key=published["pub"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    [claim] = json.loads(verified.stdout)
    assert claim["critical"]["image"]["docker-manifest-digest"] == image.digest
    attested = cosign_run("verify-attestation", "--type", "slsaprovenance1", key=published["pub"])
    assert attested.returncode == 0, attested.stdout + attested.stderr
    statement = json.loads(base64.b64decode(json.loads(attested.stdout.splitlines()[0])["payload"]))
    assert statement["predicateType"] == publish.PROVENANCE_V1
    assert image.hex in [s["digest"]["sha256"] for s in statement["subject"]]
    bom = cosign_run("verify-attestation", "--type", "spdxjson", key=published["pub"])
    assert bom.returncode == 0, bom.stdout + bom.stderr
    statement = json.loads(base64.b64decode(json.loads(bom.stdout.splitlines()[0])["payload"]))
    assert statement["predicateType"] == sbom.SPDX_PREDICATE and statement["predicate"]["spdxVersion"] == "SPDX-2.3"
    other = signing.keygen(tmp_path / "other.key")[1]
    assert cosign_run("verify", key=other).returncode != 0
    assert cosign_run("verify-attestation", "--type", "slsaprovenance1", key=other).returncode != 0
    assert cosign_run("verify-attestation", "--type", "spdxjson", key=other).returncode != 0

    publish.publish(published["project"], STACK, key=published["key"])
    client = published["client"]
    layers = json.loads(client.get_manifest(f"sha256-{image.hex}.sig")[0])["layers"]
    assert len(layers) == 1 and len(json.loads(client.get_manifest(f"sha256-{image.hex}.att")[0])["layers"]) == 2


def test_sigstore_bundles_sit_among_the_referrers_where_cosign_3_looks_and_verify_with_the_key_alone(published, tmp_path):
    """cosign 3's layout (its BUNDLE_SPEC.md): one referrer per bundle, the signature (`cosign sign`'s
    statement), the provenance and the SBOM, found by artifact type with the stock oras; each
    verifies with the public key alone in sigstore-js and names the image digest; another key
    verifies none; re-publishing adds none."""
    from fixtures import sigstore_js
    from servestack.publish import cosign

    image, client = ImageRef.parse(published["image"]), published["client"]
    bundles = [r for r in client.referrers(image.digest)[0] if r.artifact_type == cosign.SIGSTORE_BUNDLE]
    by_type = {r.annotation[cosign.BUNDLE_PREDICATE_TYPE]: r for r in bundles}
    assert set(by_type) == {cosign.COSIGN_SIGN_PREDICATE, publish.PROVENANCE_V1, sbom.SPDX_PREDICATE}
    assert {r.annotation[cosign.BUNDLE_CONTENT] for r in bundles} == {"dsse-envelope"}

    ca = Path(os.environ["SERVESTACK_CERTS_D"]) / image.registry / "ca.crt"
    listing = subprocess.run([str(tools.trixie_tool("oras")), "discover", "--ca-file", str(ca), "--format", "json",
                              "--artifact-type", cosign.SIGSTORE_BUNDLE, str(image)],
                             check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert listing.returncode == 0, listing.stderr
    assert {r.digest for r in bundles} <= set(re.findall(r"sha256:[0-9a-f]{64}", listing.stdout))

    other = signing.keygen(tmp_path / "other.key")[1]
    for predicate_type, referrer in by_type.items():
        manifest = json.loads(client.get_manifest(referrer.digest)[0])
        assert manifest["subject"]["digest"] == image.digest and manifest["config"]["mediaType"] == \
            "application/vnd.oci.empty.v1+json"
        [layer] = manifest["layers"]
        assert layer["mediaType"] == cosign.SIGSTORE_BUNDLE
        path = tmp_path / f"{referrer.digest[7:19]}.sigstore.json"
        path.write_bytes(client.get_blob(layer["digest"]))
        assert [s["keyid"] for s in json.loads(path.read_bytes())["dsseEnvelope"]["signatures"]] == [""]
        checked = sigstore_js.verify(path, published["pub"])
        assert checked.returncode == 0, checked.stderr
        verified = json.loads(checked.stdout)
        assert verified["hint"] == verified["keyHint"]  # the bundle names the key as cosign would
        statement = verified["statement"]
        assert statement["predicateType"] == predicate_type
        assert image.hex in [s["digest"]["sha256"] for s in statement["subject"]]  # cosign's artifact digest check
        refused = sigstore_js.verify(path, other)
        assert refused.returncode == 1 and "not verified" in refused.stderr

    publish.publish(published["project"], STACK, key=published["key"])
    again = [r for r in client.referrers(image.digest)[0] if r.artifact_type == cosign.SIGSTORE_BUNDLE]
    assert sorted(r.digest for r in again) == sorted(r.digest for r in bundles)


def _blob_file(reg: TlsRegistry, digest: str) -> Path:
    hexdigest = digest.split(":")[1]
    return reg.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


def test_one_changed_byte_in_a_published_file_fails_the_pull(published, env, tmp_path):
    # A byte changed in a file nobody else shares: the registry's stored copy of one recipe.
    recipe = next(f for f in published["record"]["files"] if f["title"].startswith("recipes/"))
    blob = _blob_file(env, recipe["digest"])
    original = blob.read_bytes()
    blob.write_bytes(original[:10] + bytes([original[10] ^ 1]) + original[11:])
    out = tmp_path / "pulled"
    try:
        with pytest.raises(ServestackError, match=rf"{recipe['title']}.*does not match its digest"):
            publish.pull(published["image"], key=published["pub"], out=out)
    finally:
        blob.write_bytes(original)
    assert not out.exists()


def test_an_sbom_referrer_no_publication_signs_is_named_and_the_real_one_gone_fails_the_pull(published, tmp_path, capsys):
    """Scanners read the plain application/spdx+json referrers, not the signed copy. One beside the
    real SBOM that no verified publication signs (a document without a vulnerable package; or
    another tool's) is named as a warning and in publication.json, not refused: like a replayed
    publication it must not block the real one. The real one gone, or replaced, fails the pull."""
    from servestack.sources.registry import OCI_INDEX

    client, image = published["client"], ImageRef.parse(published["image"])
    genuine = published["record"]["sbom"]["referrer"].split("@")[1]
    manifest = json.loads(client.get_manifest(genuine)[0])
    document = json.loads(client.get_blob(manifest["layers"][0]["digest"]))
    document["packages"] = [p for p in document["packages"] if p["name"] != "libc6"]
    forged = json.dumps(document).encode()
    manifest["layers"][0] |= {"digest": client.push_blob(forged), "size": len(forged)}
    data = json.dumps(manifest).encode()
    client.put_manifest(sha256_digest(data), data, OCI_MANIFEST)
    tag = client.fallback_tag(image.digest)
    genuine_index = json.loads(client.get_manifest(tag)[0])
    forged_entry = {"mediaType": OCI_MANIFEST, "digest": sha256_digest(data), "size": len(data),
                    "artifactType": sbom.SPDX_JSON}
    client.put_manifest(tag, json.dumps({**genuine_index, "manifests": [*genuine_index["manifests"], forged_entry]}
                                        ).encode(), OCI_INDEX)
    capsys.readouterr()
    out = publish.pull(str(image), key=published["pub"], out=tmp_path / "beside")
    said = capsys.readouterr().out
    assert f"WARNING: {sbom.SPDX_JSON} referrer {sha256_digest(data)} holds an SBOM no publication" in said
    assert json.loads((out / "publication.json").read_text())["unsigned_sboms"] == [sha256_digest(data)]

    instead = [forged_entry if e["digest"] == genuine else e for e in genuine_index["manifests"]]
    gone = [e for e in genuine_index["manifests"] if e["digest"] != genuine]
    for manifests in (instead, gone):
        client.put_manifest(tag, json.dumps({**genuine_index, "manifests": manifests}).encode(), OCI_INDEX)
        with pytest.raises(ServestackError, match=re.escape(f"no {sbom.SPDX_JSON} referrer holds the SBOM the "
                                                            "publication signs")):
            publish.pull(str(image), key=published["pub"], out=tmp_path / "pulled")
        assert not (tmp_path / "pulled").exists()


def test_a_bundle_signed_with_another_key_fails_the_pull(published, tmp_path):
    other = signing.keygen(tmp_path / "other.key")[1]
    # The wrong key is a signature that does not verify (exit 8), not a missing publication (10).
    with pytest.raises(SignatureError, match=r"(?s)no publication signed by .*other\.pub.*1 attestation\(s\) whose "
                                              r"listing this key did not sign .*not fetched"):
        publish.pull(published["image"], key=other, out=tmp_path / "pulled")
    assert not (tmp_path / "pulled").exists()


def test_a_bundle_for_another_digest_fails_the_pull(published, env, tmp_path):
    """Someone attaches image A's signed publication to image B: pull B names the mismatch."""
    client = published["client"]
    other_digest = push_stack_image(client, (ROOT / "pins" / f"{STACK}.lock").read_bytes(), tag="2", salt=b"B")
    other = ImageRef.parse(f"{ImageRef.parse(published['image']).name}@{other_digest}")
    manifest, _ = client.get_manifest(other_digest)
    subject = Descriptor(media_type=OCI_MANIFEST, digest=other_digest, size=len(manifest))
    for key in ("bundle", "attestation"):
        moved = json.loads(client.get_manifest(published["record"][key].split("@")[1])[0])
        moved["subject"] = subject.to_json()
        data = json.dumps(moved).encode()
        digest = sha256_digest(data)
        headers = client.put_manifest(digest, data, OCI_MANIFEST)
        client.add_referrer(other_digest, Descriptor(media_type=OCI_MANIFEST, digest=digest, size=len(data),
                                                     artifact_type=moved["artifactType"]),
                            headers)
    signed = ImageRef.parse(published["image"])
    with pytest.raises(ServestackError, match=rf"signed for {signed.repository}@{signed.digest}, "
                                              rf"not {other.repository}@{other.digest}"):
        publish.pull(str(other), key=published["pub"], out=tmp_path / "pulled")


def test_the_signature_names_the_repository_and_digest_so_another_host_name_verifies(published, env, tmp_path):
    """The same registry as localhost:PORT (a mirror's position): pull verifies. A copy of image and
    publication in another repository is refused, unless the user names the signed repository."""
    image = ImageRef.parse(published["image"])
    port = image.registry.split(":")[1]
    certs, config = Path(os.environ["SERVESTACK_CERTS_D"]), Path(os.environ["DOCKER_CONFIG"]) / "config.json"
    (certs / f"localhost:{port}").mkdir(exist_ok=True)
    shutil.copy(certs / image.registry / "ca.crt", certs / f"localhost:{port}" / "ca.crt")
    auths = json.loads(config.read_text())
    auths["auths"][f"localhost:{port}"] = auths["auths"][image.registry]
    config.write_text(json.dumps(auths))
    elsewhere = f"localhost:{port}/{image.repository}@{image.digest}"
    out = publish.pull(elsewhere, key=published["pub"], out=tmp_path / "mirror")
    assert json.loads((out / "publication.json").read_text())["image"] == elsewhere

    client, copy = published["client"], Client(image.registry, f"{image.repository}-copy")
    referrers, _ = client.referrers(image.digest)
    manifests = [image.digest, *(r.digest for r in referrers)]
    for digest in manifests:  # a plain copy of the image and its referrers, as a mirroring tool makes
        data, media_type = client.get_manifest(digest)
        body = json.loads(data)
        for blob in [body.get("config"), *body.get("layers", [])]:
            if blob:
                copy.push_blob(client.get_blob(blob["digest"]))
        copy.put_manifest(digest, data, media_type)
    fallback = client.get_manifest(client.fallback_tag(image.digest))
    copy.put_manifest(client.fallback_tag(image.digest), *fallback)
    copied = f"{image.registry}/{image.repository}-copy@{image.digest}"
    with pytest.raises(ServestackError, match=rf"signed for {image.repository}@{image.digest}, not "
                                              rf"{image.repository}-copy@.*say which one the signature names"):
        publish.pull(copied, key=published["pub"], out=tmp_path / "copy")
    publish.pull(copied, key=published["pub"], out=tmp_path / "named", repository=image.repository)
