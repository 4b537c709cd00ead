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
import sys
import threading
import uuid
import warnings
from pathlib import Path

import pytest
import yaml
from fixtures.records import write_build_record, write_image_record, write_smoke_record
from fixtures.tls_registry import TlsRegistry, push_stack_image

from servestack import cluster, publish, tools
from servestack.errors import NetworkError, ServestackError
from servestack.publish import sbom, signing
from servestack.records.imageref import ImageRef
from servestack.sources.registry import OCI_MANIFEST, Client, Descriptor, sha256_digest
from servestack.util.fsutil import atomic_write_json
from servestack.util.proc import run
from servestack.util.project import Project, state_home

pytestmark = pytest.mark.e2e
REPO_ROOT = Path(__file__).resolve().parents[1]
STACK = "dev-cpu"


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory) -> TlsRegistry:
    reg = TlsRegistry.create(tmp_path_factory.mktemp("tls-registry"))
    yield reg
    reg.stop()


@pytest.fixture
def env(tls_registry, monkeypatch):
    for name, value in tls_registry.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    return tls_registry


def make_project(root: Path, image: str) -> Project:
    """A checkout (a git repository, as users have) with the real pins and recipes, and the records
    build/image/smoke leave behind for IMAGE."""
    for name in ("pins", "recipes"):
        shutil.copytree(REPO_ROOT / name, root / name)
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pins"]):
        subprocess.run(["git", "-C", str(root), *cmd], check=True)
    project = Project(root)
    out = project.artifacts(STACK)
    write_build_record(out / "build.json", STACK)
    reference = ImageRef.parse(image)
    manifest = json.loads(Client(reference.registry, reference.repository).get_manifest(reference.digest)[0])
    write_image_record(out / "image.json", image, STACK, base_layer=manifest["layers"][0]["digest"])
    write_smoke_record(out / "smoke.json", image, STACK)
    return project


def new_image(reg: TlsRegistry, salt: str = "") -> tuple[str, Client]:
    repository = f"servestack-test/publish-{uuid.uuid4().hex[:8]}"
    client = Client(reg.address, repository)
    digest = push_stack_image(client, (REPO_ROOT / "pins" / f"{STACK}.lock").read_bytes(), salt=salt.encode())
    return f"{reg.address}/{repository}@{digest}", client


@pytest.fixture
def published(env, tmp_path):
    """An image in the TLS registry, published once with a new key."""
    image, client = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    record = publish.publish(project, STACK, key=private, echo=None)
    return {"image": image, "client": client, "project": project, "key": private, "pub": public, "record": record,
            "registry": env}


def test_publish_then_pull_writes_verified_recipes_bound_to_the_digest(published, tmp_path):
    image, record = published["image"], published["record"]
    assert record["image"] == image and record["referrers"].startswith("fallback tag sha256-")
    titles = [f["title"] for f in record["files"]]
    assert {"pins/dev-cpu.lock", "pins/dev-cpu.yaml", "build/build.json", "build/image.json", "build/smoke.json"} <= set(titles)
    assert any(t.startswith("recipes/") for t in titles)

    out = publish.pull(image, key=published["pub"], out=tmp_path / "pulled", echo=None)
    recipes = sorted((out / "recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        assert yaml.safe_load(path.read_text())["model"]["container"] == image
    assert (out / "pins" / "dev-cpu.lock").read_bytes() == (REPO_ROOT / "pins" / "dev-cpu.lock").read_bytes()
    verified = json.loads((out / "publication.json").read_text())
    assert verified["bundle"] == record["bundle"].split("@")[1]
    document = sbom.read_sbom((out / sbom.SBOM_TITLE).read_bytes(), ImageRef.parse(image), "pulled")
    debs = {p["name"]: p["versionInfo"] for p in document["packages"] if p["SPDXID"].startswith("SPDXRef-deb-")}
    assert debs == {"libc6": "2.36-9+deb12u14", "python3.11-minimal": "3.11.2-6+deb12u8"}  # the base layer's dpkg
    assert ("plain-lib", "1.0") in sbom.python_distributions(document)  # build.json's wheels
    _srtctl_accepts(recipes)

    # Same inputs, same bundle digest (created comes from the lock's SOURCE_DATE_EPOCH).
    again = publish.publish(published["project"], STACK, key=published["key"], echo=None)
    assert again["bundle"] == record["bundle"]


def _srtctl_accepts(recipes: list[Path]) -> None:
    """The real srtctl (from the vendored srt-slurm) plans each pulled recipe: `srtctl dry-run -f`."""
    try:
        srtctl = cluster.ensure_srtctl(REPO_ROOT)
    except cluster.ClusterToolsMissing as missing:
        warnings.warn(f"srtctl dry-run not checked: {missing}", stacklevel=2)
        return
    from concurrent.futures import ThreadPoolExecutor

    def dry_run(recipe: Path) -> str:
        done = run(srtctl.argv("dry-run", "-f", str(recipe)), env=srtctl.env, check=False, timeout=300)
        return "" if done.returncode == 0 and "DRY-RUN" in done.stdout else f"{recipe}: {done.stdout[-1500:]}"

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(dry_run, recipes) if f]
    assert not failures, "\n".join(failures)


def test_a_cluster_publishes_its_run_for_a_pulled_image_and_pull_then_takes_the_results(published, tmp_path):
    """What the GB200 job does: pull the build's bundle, run, then publish the run's results with
    the pulled records from a checkout that never built the image."""
    image = published["image"]
    pulled = publish.pull(image, key=published["pub"], out=tmp_path / "bundle", echo=None)
    cluster = Project(tmp_path / "cluster")
    for name in ("pins", "recipes"):
        shutil.copytree(REPO_ROOT / name, cluster.root / name)
    run = cluster.artifacts(STACK) / "runs" / "gha-1" / "accuracy"
    atomic_write_json(run / "results.json", {"accuracy": 0.5})
    (run / "report.md").write_text("# accuracy\n")
    record = publish.publish(cluster, STACK, key=published["key"], image=image, run_id="gha-1", records_dir=pulled,
                             echo=None)
    assert "runs/gha-1/accuracy/results.json" in [f["title"] for f in record["files"]]
    out = publish.pull(image, key=published["pub"], out=tmp_path / "after", echo=None)
    assert json.loads((out / "runs/gha-1/accuracy/results.json").read_text()) == {"accuracy": 0.5}
    first = publish.pull(image, key=published["pub"], out=tmp_path / "first", echo=None,
                         bundle=published["record"]["bundle_digest"])
    assert not (first / "runs").exists()
    with pytest.raises(ServestackError, match="is for .*, not"):  # records for another digest are refused
        other, _ = new_image(published["registry"])
        publish.publish(cluster, STACK, key=published["key"], image=other, records_dir=pulled, echo=None)


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
    lock = REPO_ROOT / "pins" / f"{STACK}.lock"  # one of the statement's subjects
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

    publish.publish(published["project"], STACK, key=published["key"], echo=None)
    client = published["client"]
    layers = json.loads(client.get_manifest(f"sha256-{image.hex}.sig")[0])["layers"]
    assert len(layers) == 1 and len(json.loads(client.get_manifest(f"sha256-{image.hex}.att")[0])["layers"]) == 2


def test_sigstore_bundles_sit_among_the_referrers_where_cosign_3_looks_and_verify_with_the_key_alone(published,
                                                                                                     tmp_path):
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

    publish.publish(published["project"], STACK, key=published["key"], echo=None)
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
            publish.pull(published["image"], key=published["pub"], out=out, echo=None)
    finally:
        blob.write_bytes(original)
    assert not out.exists()


def test_an_sbom_referrer_no_publication_signs_is_named_and_the_real_one_gone_fails_the_pull(published, tmp_path):
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
    said: list[str] = []
    out = publish.pull(str(image), key=published["pub"], out=tmp_path / "beside", echo=said.append)
    assert f"WARNING: {sbom.SPDX_JSON} referrer {sha256_digest(data)} holds an SBOM no publication" in said[0]
    assert json.loads((out / "publication.json").read_text())["unsigned_sboms"] == [sha256_digest(data)]

    instead = [forged_entry if e["digest"] == genuine else e for e in genuine_index["manifests"]]
    gone = [e for e in genuine_index["manifests"] if e["digest"] != genuine]
    for manifests in (instead, gone):
        client.put_manifest(tag, json.dumps({**genuine_index, "manifests": manifests}).encode(), OCI_INDEX)
        with pytest.raises(ServestackError, match=re.escape(f"no {sbom.SPDX_JSON} referrer holds the SBOM the "
                                                            "publication signs")):
            publish.pull(str(image), key=published["pub"], out=tmp_path / "pulled", echo=None)
        assert not (tmp_path / "pulled").exists()


def test_a_bundle_signed_with_another_key_fails_the_pull(published, tmp_path):
    other = signing.keygen(tmp_path / "other.key")[1]
    with pytest.raises(ServestackError, match=r"(?s)no publication signed by .*other\.pub.*no signature verifies"):
        publish.pull(published["image"], key=other, out=tmp_path / "pulled", echo=None)
    assert not (tmp_path / "pulled").exists()


def test_a_bundle_for_another_digest_fails_the_pull(published, env, tmp_path):
    """Someone attaches image A's signed publication to image B: pull B names the mismatch."""
    client = published["client"]
    other_digest = push_stack_image(client, (REPO_ROOT / "pins" / f"{STACK}.lock").read_bytes(), tag="2", salt=b"B")
    other = ImageRef.parse(f"{ImageRef.parse(published['image']).name}@{other_digest}")
    manifest, _ = client.get_manifest(other_digest)
    subject = Descriptor(OCI_MANIFEST, other_digest, len(manifest))
    for key in ("bundle", "attestation"):
        moved = json.loads(client.get_manifest(published["record"][key].split("@")[1])[0])
        moved["subject"] = subject.to_json()
        data = json.dumps(moved).encode()
        digest = sha256_digest(data)
        headers = client.put_manifest(digest, data, OCI_MANIFEST)
        client.add_referrer(other_digest, Descriptor(OCI_MANIFEST, digest, len(data), moved["artifactType"]),
                            headers)
    signed = ImageRef.parse(published["image"])
    with pytest.raises(ServestackError, match=rf"signed for {signed.repository}@{signed.digest}, "
                                              rf"not {other.repository}@{other.digest}"):
        publish.pull(str(other), key=published["pub"], out=tmp_path / "pulled", echo=None)


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
    out = publish.pull(elsewhere, key=published["pub"], out=tmp_path / "mirror", echo=None)
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
        publish.pull(copied, key=published["pub"], out=tmp_path / "copy", echo=None)
    publish.pull(copied, key=published["pub"], out=tmp_path / "named", repository=image.repository, echo=None)


def test_pull_refuses_tags_and_a_missing_bundle(env, tmp_path):
    image, _ = new_image(env)
    key = signing.keygen(tmp_path / "k.key")[1]
    with pytest.raises(ServestackError, match="is a tag, not a digest"):
        publish.pull(image.split("@")[0] + ":1", key=key, out=tmp_path / "o", echo=None)
    with pytest.raises(ServestackError, match="no signed publication"):
        publish.pull(image, key=key, out=tmp_path / "o", echo=None)


def test_two_concurrent_publishes_keep_both_referrers(env, tmp_path, monkeypatch):
    """Both publishers read the empty index before either writes it; the one whose write is lost
    notices on its re-read and merges."""
    image, client = new_image(env)
    projects = []
    for name in ("a", "b"):
        project = make_project(tmp_path / name, image)
        run = project.artifacts(STACK) / "runs" / f"run-{name}" / "accuracy"
        atomic_write_json(run / "results.json", {"run": name})
        projects.append((project, f"run-{name}"))
    key = signing.keygen(tmp_path / "k.key")[0]
    barrier = threading.Barrier(2, timeout=30)
    writes: list[str] = []
    real_put = Client.put_manifest

    def racing_put(self, ref, data, media_type):
        if ref.startswith("sha256-"):
            writes.append(ref)
            if len(writes) <= 2:
                barrier.wait()  # both have read (and re-checked) the index before either writes
        return real_put(self, ref, data, media_type)

    monkeypatch.setattr(Client, "put_manifest", racing_put)
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def run(project, run_id):
        try:
            results[run_id] = publish.publish(project, STACK, key=key, run_id=run_id, echo=None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=p) for p in projects]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    referrers, where = client.referrers(ImageRef.parse(image).digest)
    listed = {r.digest for r in referrers}
    assert where == "tag"
    for record in results.values():
        assert record["bundle"].split("@")[1] in listed
        assert record["attestation"].split("@")[1] in listed
    assert len(writes) > 4  # the lost write was redone (4 entries, 4 writes without any race)


def test_registry_stopped_halfway_retries_then_fails_clearly_and_indexes_nothing_missing(env, tmp_path, monkeypatch):
    image, client = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    key = signing.keygen(tmp_path / "k.key")[0]
    real_push = Client.push_blob
    pushed: list[int] = []

    def push_then_outage(self, data):
        pushed.append(len(data))
        if len(pushed) == 3:
            env.stop()  # the registry goes away in the middle of the upload
        return real_push(self, data)

    monkeypatch.setattr(Client, "push_blob", push_then_outage)
    real_init = Client.__init__
    monkeypatch.setattr(Client, "__init__", _fast_retries(real_init))
    try:
        with pytest.raises(NetworkError, match=r"upload blob .*could not reach registry .* after 4 attempts"):
            publish.publish(project, STACK, key=key, echo=None)
    finally:
        env.start()
    monkeypatch.setattr(Client, "push_blob", real_push)
    monkeypatch.setattr(Client, "__init__", real_init)
    subject = ImageRef.parse(image).digest
    referrers, _ = client.referrers(subject)
    for referrer in referrers:  # whatever is indexed is complete
        manifest = json.loads(client.get_manifest(referrer.digest)[0])
        for blob in (manifest["config"], *manifest["layers"]):
            assert client.has_blob(blob["digest"])
    assert not (project.artifacts(STACK) / "publish.json").exists()
    record = publish.publish(project, STACK, key=key, echo=None)  # and a rerun completes
    assert record["bundle"].split("@")[1] in {r.digest for r in client.referrers(subject)[0]}


def _fast_retries(init):
    def fast(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "retries": 3, "backoff": 0.2})
    return fast


def test_no_password_or_private_key_in_any_log_bundle_layer_or_record(env, tmp_path, registry):
    """The whole user path through the command line, verbose: copy the image into the TLS registry
    (with the login), publish, pull. Then search everything written for the secrets."""
    source_repository = f"servestack-test/publish-src-{uuid.uuid4().hex[:8]}"
    plain = Client(registry, source_repository)
    digest = push_stack_image(plain, (REPO_ROOT / "pins" / f"{STACK}.lock").read_bytes())
    image = f"{registry}/{source_repository}@{digest}"
    project = make_project(tmp_path / "checkout", image)
    keys = tmp_path / "keys"
    cli_env = {**os.environ, **env.environment(), "SERVESTACK_KEY_PASSWORD": "key-" + env.password[::-1]}
    logs = []

    def servestack(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "servestack", "-v", "--project", str(project.root), *args],
                              check=False, capture_output=True, text=True, env=cli_env, cwd=tmp_path)
        logs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout + done.stderr

    servestack("keygen", "--key", str(keys / "publisher.key"))
    to = f"{env.address}/servestack-test/published-{uuid.uuid4().hex[:8]}"
    servestack("publish", "--stack", STACK, "--key", str(keys / "publisher.key"), "--to", to)
    servestack("pull", f"{to}@{digest}", "--key", str(keys / "publisher.pub"), "--out", str(tmp_path / "pulled"))
    assert Client(env.address, to.split("/", 1)[1]).get_manifest(digest) is not None  # the copy is there

    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key((keys / "publisher.key").read_bytes(),
                                                 password=cli_env["SERVESTACK_KEY_PASSWORD"].encode())
    unencrypted = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()).decode()
    secrets = {
        "password": env.password,
        "basic auth": json.loads((Path(env.environment()["DOCKER_CONFIG"]) / "config.json").read_text())["auths"][env.address]["auth"],
        "key password": cli_env["SERVESTACK_KEY_PASSWORD"],
        "private key (PEM body)": "".join(unencrypted.splitlines()[1:-1])[:64],
        "private key (encrypted file)": "".join((keys / "publisher.key").read_text().splitlines()[1:3]),
        "private scalar": format(private.private_numbers().private_value, "x"),
    }
    searched: list[tuple[str, bytes]] = [("command output", "".join(logs).encode())]
    for root in (env.storage, env.home / "registry", project.artifacts(STACK), tmp_path / "pulled"):
        for path in root.rglob("*"):
            if path.is_file():
                searched.append((str(path), path.read_bytes()))
    for path in (state_home() / "registry" / registry.rsplit(":", 1)[1]).rglob("*.log"):
        searched.append((str(path), path.read_bytes()))
    assert len(searched) > 20
    for what, secret in secrets.items():
        needle = secret.encode()
        leaks = [name for name, data in searched if needle in data]
        assert not leaks, f"the {what} appears in {leaks}"


def test_two_published_digests_are_compared_from_their_verified_bundles(env, tmp_path):
    """`compare A B` with two digests: each publication is pulled into a fresh directory, verified,
    and its run's results are the side; the slower image's regression is named at its point."""
    from dataclasses import replace

    from servestack.compare import comparisons
    from servestack.stages.results import StageResult, parse_vllm_result
    from servestack.stages.stage_report import write_run

    data = REPO_ROOT / "tests" / "data" / "dev-cpu"
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    images = []
    for label, factors in (("fast", (1.00, 1.03, 0.98)), ("slow", (0.70, 0.72, 0.69))):
        image, _ = new_image(env, salt=label)
        project = make_project(tmp_path / label, image)
        stage_dir = project.artifacts(STACK) / "runs" / label / "throughput"
        stage_dir.mkdir(parents=True)
        base = parse_vllm_result(data / "4.json", recipe="agg", gpus=1, concurrency=4)
        points = [replace(base, repeat=k, tokens_per_s_per_gpu=base.tokens_per_s_per_gpu * f) for k, f in enumerate(factors)]
        write_run(stage_dir.parent, [StageResult(STACK, STACK, "throughput", image, "local", stage_dir, throughput=points,
                                                 conditions={"agg": {"isl": 128, "osl": 32, "gpu_type": "cpu"}})])
        publish.publish(project, STACK, key=private, run_id=label, echo=None)
        images.append(image)
    here = Project(tmp_path / "reader")
    result, report = comparisons.compare_references(here, STACK, images[0], images[1], key=public)
    assert [(ch.recipe, ch.concurrency, ch.metric) for ch in result.regressions] == [("agg", 4, "tokens_per_s_per_gpu")]
    out = report.parent
    for side in ("a", "b"):
        assert json.loads((out / "pulled" / side / "publication.json").read_text())["image"] in images
    assert f"image `{images[1]}`" in report.read_text()
    with pytest.raises(ServestackError):  # a key that did not sign them verifies nothing
        comparisons.compare_references(here, STACK, images[0], images[1],
                                       key=signing.keygen(tmp_path / "other.key")[1], out=tmp_path / "refused")


def test_of_three_publications_pull_takes_the_newest_in_every_index_order_and_a_replay_blocks_nothing(env, tmp_path):
    """One digest published three times (the build's, then two runs' results), and beside them a
    validly signed publication of another image replayed into its index: pull takes the newest
    whatever the index order, names the others with why, and the replay changes nothing."""
    import itertools

    from servestack.sources.registry import OCI_INDEX

    image, client = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    records = [publish.publish(project, STACK, key=private, echo=None)]
    for run_id in ("run-1", "run-2"):
        stage = project.artifacts(STACK) / "runs" / run_id / "throughput"
        atomic_write_json(stage / "results.json", {"run": run_id})
        records.append(publish.publish(project, STACK, key=private, run_id=run_id, echo=None))
    assert len({r["bundle"] for r in records}) == 3
    again = publish.publish(project, STACK, key=private, run_id="run-2", echo=None)
    assert again["attestation"] == records[2]["attestation"]  # the same content again adds nothing

    other, other_client = new_image(env, salt="other")
    other_record = publish.publish(make_project(tmp_path / "other", other), STACK, key=private, echo=None)
    replayed = other_record["attestation"].split("@")[1]
    other_manifest = other_client.get_manifest(replayed)[0]
    for layer in json.loads(other_manifest)["layers"] + [json.loads(other_manifest)["config"]]:
        client.push_blob(other_client.get_blob(layer["digest"]))
    client.put_manifest(replayed, other_manifest, OCI_MANIFEST)

    tag = client.fallback_tag(ImageRef.parse(image).digest)
    index = json.loads(client.get_manifest(tag)[0])
    attestations = [m for m in index["manifests"] if m.get("artifactType") == publish.bundle.ATTESTATION_TYPE]
    attestations.append({"mediaType": OCI_MANIFEST, "digest": replayed, "size": len(other_manifest),
                         "artifactType": publish.bundle.ATTESTATION_TYPE})
    bundles = [m for m in index["manifests"] if m not in attestations]
    newest = records[2]["attestation"].split("@")[1]
    for n, order in enumerate(itertools.permutations(attestations)):  # the 24 orders of the four candidates
        if n % 5:  # every fifth (with the first and the reversed last): each candidate in each place
            continue
        client.put_manifest(tag, json.dumps({**index, "manifests": [*bundles, *order]}).encode(), OCI_INDEX)
        chosen = publish.fetch.fetch_publication(image, public)
        assert chosen.attestation_digest == newest, n
        assert len(chosen.skipped) == 3
        assert any(replayed in s and f"its subject is {ImageRef.parse(other).digest}" in s for s in chosen.skipped)
        assert sum("older than the one taken" in s for s in chosen.skipped) == 2
    out = publish.pull(image, key=public, out=tmp_path / "pulled", echo=None)
    assert json.loads((out / "runs" / "run-2" / "throughput" / "results.json").read_text()) == {"run": "run-2"}


def test_publish_to_copies_the_real_dev_cpu_image_with_its_zstd_layers_and_it_pulls_back_verified(env, tmp_path):
    """`publish --to` on the image `nox -s image` made (Docker v2s2, zstd layers, 1 GB): every blob
    and the manifest's own bytes go to the TLS registry, and pull verifies it there, stack.json and all.
    Its SBOM, written from the lock and build.json, names exactly the Python distributions whose
    dist-info directories the layers hold (vendored ones too), and stock cosign verifies it."""
    from servestack import image, services
    from servestack import inputs as build

    services.ensure_dockerd()
    services.ensure_registry()
    repo = Project(REPO_ROOT)
    build.build(repo, STACK)  # seconds when nothing changed
    source = image.build_image(repo, STACK).reference
    project = make_project(tmp_path / "checkout", source)
    for name in ("build.json", "image.json"):
        shutil.copy(REPO_ROOT / "build" / STACK / name, project.artifacts(STACK) / name)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    to = f"{env.address}/servestack-test/copied-{uuid.uuid4().hex[:8]}"
    record = publish.publish(project, STACK, key=private, to=to, echo=None)
    copied = ImageRef.parse(record["image"])
    assert copied.digest == ImageRef.parse(source).digest and copied.name == to
    manifest = json.loads(Client(copied.registry, copied.repository).get_manifest(copied.digest)[0])
    assert any(layer["mediaType"].endswith("zstd") for layer in manifest["layers"])
    out = publish.pull(str(copied), key=public, out=tmp_path / "pulled", echo=None)
    assert (out / "pins" / f"{STACK}.lock").read_bytes() == (REPO_ROOT / "pins" / f"{STACK}.lock").read_bytes()

    document = sbom.read_sbom((out / sbom.SBOM_TITLE).read_bytes(), copied, "pulled")
    in_layers = _dist_infos(Client(copied.registry, copied.repository), manifest)
    assert sbom.python_distributions(document) == in_layers
    debs = [p for p in document["packages"] if p["SPDXID"].startswith("SPDXRef-deb-")]
    assert {"libc6", "python3.11-minimal", "ca-certificates"} <= {p["name"] for p in debs}
    system = next(p for p in document["packages"] if p["SPDXID"] == "SPDXRef-OperatingSystem")
    assert system["name"] == "debian" and system["versionInfo"].startswith("12.")  # /etc/os-release is a symlink
    print(f"SBOM: {len(document['packages'])} packages: {len(in_layers)} Python distributions (as many dist-info "
          f"directories in the layers), {len(debs)} Debian packages")

    ca = Path(os.environ["SERVESTACK_CERTS_D"]) / copied.registry / "ca.crt"
    tool_env = {**os.environ, "HOME": str(tmp_path), "SSL_CERT_FILE": str(ca)}
    bom = subprocess.run([str(tools.trixie_tool("cosign")), "verify-attestation", "--key", str(public),
                          "--insecure-ignore-tlog", "--type", "spdxjson", str(copied)],
                         check=False, capture_output=True, text=True, env=tool_env, timeout=120)
    assert bom.returncode == 0, bom.stdout[-2000:] + bom.stderr
    tree = subprocess.run([str(tools.trixie_tool("oras")), "discover", "--ca-file", str(ca), "-o", "tree", str(copied)],
                          check=False, capture_output=True, text=True, env=tool_env, timeout=120)
    assert tree.returncode == 0 and sbom.SPDX_JSON in tree.stdout, tree.stderr
    print(tree.stdout)


def _dist_infos(client: Client, manifest: dict) -> list[tuple[str, str]]:
    """(normalized name, version) of every `*.dist-info/METADATA` in the image's layers, sorted."""
    import io
    import tarfile

    from servestack.publish.layerfiles import decompressed
    from servestack.wheels import normalize

    found = []
    for layer in manifest["layers"]:
        # A whole layer in memory is this test's choice; the declared size is its limit.
        blob = io.BytesIO(client.get_blob(layer["digest"], size=layer["size"], limit=layer["size"]))
        with tarfile.open(fileobj=decompressed(blob, layer["mediaType"]), mode="r|") as tar:
            for member in tar:
                matched = re.search(r"([^/]+)-([^/-]+)\.dist-info/METADATA$", member.name)
                if matched and member.isfile():
                    found.append((normalize(matched[1]), matched[2]))
    return sorted(found)
