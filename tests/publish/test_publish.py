"""The publication's parts without a registry: keys, DSSE signatures, the bundle's manifests and
statement, the smoke gate, reading stack.json out of a layer."""

from __future__ import annotations

import base64
import gzip
import json
import stat

import pytest
import zstandard

from fixtures.records import committed_lock, write_smoke_record
from fixtures.tls_registry import tar_layer
from servestack import publish
from servestack.errors import ImageRefError, InputError, ServestackError, SignatureError
from servestack.publish import signing
from servestack.records.smokefile import Check
from servestack.sources.registry import OCI_MANIFEST, Descriptor
from servestack.util.project import Project

IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32


@pytest.fixture
def keys(tmp_path):
    return signing.keygen(tmp_path / "k.key")


def _envelope(keys) -> bytes:
    document = signing.statement([signing.Subject(name="a.txt", sha256="00" * 32)], publish.PROVENANCE_V1, {"x": 1})
    return signing.sign_statement(document, signing.load_signer(keys[0]))


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(keys, tmp_path):
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(InputError, match="a key already exists"):
        signing.keygen(private)


def test_a_private_key_others_may_read_is_warned_about_as_ssh_does(keys):
    private, _ = keys
    assert signing.key_permission_problem(private) is None
    private.chmod(0o644)
    assert signing.key_permission_problem(private) == (
        f"WARNING: UNPROTECTED PRIVATE KEY FILE: permissions 0644 for {private} are too open; anyone who can read it "
        f"can publish as you (chmod 600 {private})")


def test_a_signed_statement_verifies_with_its_key_only(keys, tmp_path):
    envelope = _envelope(keys)
    assert signing.verify_envelope(envelope, signing.load_public_key(keys[1]), "t")["predicate"] == {"x": 1}
    other = signing.keygen(tmp_path / "other.key")[1]
    with pytest.raises(SignatureError, match="no signature verifies"):
        signing.verify_envelope(envelope, signing.load_public_key(other), "t")


def test_cosign_style_empty_key_ids_verify_and_a_changed_payload_does_not(keys):
    envelope = json.loads(_envelope(keys))
    envelope["signatures"][0]["keyid"] = ""
    assert signing.verify_envelope(json.dumps(envelope).encode(), signing.load_public_key(keys[1]), "t")
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["predicate"]["x"] = 2
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    with pytest.raises(SignatureError, match="no signature verifies"):
        signing.verify_envelope(json.dumps(envelope).encode(), signing.load_public_key(keys[1]), "t")


def test_an_encrypted_private_key_needs_its_password_and_the_error_shows_no_key_material(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_KEY_PASSWORD", "correct horse")
    private, _ = signing.keygen(tmp_path / "k.key")
    assert b"ENCRYPTED" in private.read_bytes()
    assert signing.load_signer(private)
    monkeypatch.setenv("SERVESTACK_KEY_PASSWORD", "wrong")
    with pytest.raises(InputError) as error:
        signing.load_signer(private)
    assert "not a PEM private key" in str(error.value) and "BEGIN" not in str(error.value)


def _files() -> list[publish.BundleFile]:
    return [publish.BundleFile(title="pins/dev-cpu.lock", data=b'{"source_date_epoch": 1700000000}'),
            publish.BundleFile(title="recipes/agg.yaml", data=b"name: agg\n")]


def test_the_bundle_manifest_is_an_oci_artifact_whose_digest_depends_only_on_its_inputs():
    subject = Descriptor(media_type=OCI_MANIFEST, digest="sha256:" + "ab" * 32, size=1234)
    created = publish.created_timestamp(committed_lock(source_date_epoch=1700000000))
    first = publish.publication_manifest(_files(), subject, created)
    assert first == publish.publication_manifest(_files(), subject, created)
    manifest = json.loads(first)
    assert manifest["artifactType"] == publish.PUBLICATION_TYPE
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json" and manifest["config"]["size"] == 2
    assert manifest["subject"]["digest"] == subject.digest
    assert manifest["annotations"]["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    assert [(layer["annotations"]["org.opencontainers.image.title"], layer["mediaType"]) for layer in manifest["layers"]] == [
        ("pins/dev-cpu.lock", "application/json"), ("recipes/agg.yaml", "application/yaml")]
    changed = [publish.BundleFile(title="pins/dev-cpu.lock", data=b"{}"), _files()[1]]
    assert publish.publication_manifest(changed, subject, created) != first


def test_the_statement_signs_the_image_the_bundle_and_every_file():
    from servestack.records.imageref import ImageRef

    image = ImageRef.parse(IMAGE)
    document = publish.provenance("dev-cpu", image, "sha256:" + "cd" * 32, _files(),
                                  publish.Source(commit="1" * 40, url=None, dirty=False), None, "2023-11-14T22:13:20Z",
                                  "2026-12-02T20:00:00.000001Z")
    subjects = {s["name"]: s["digest"]["sha256"] for s in document["subject"]}
    signed = IMAGE.split("/", 1)[1]  # the repository path and digest: not the registry's host
    assert subjects[signed] == "ab" * 32 and subjects["publication"] == "cd" * 32
    assert set(subjects) == {signed, "publication", "pins/dev-cpu.lock", "recipes/agg.yaml"}
    assert document["predicateType"] == "https://slsa.dev/provenance/v1"
    definition = document["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["repository"]["commit"] == "1" * 40
    assert {"gitCommit": "1" * 40} in [d["digest"] for d in definition["resolvedDependencies"]]


def test_source_never_records_a_remote_url_carrying_credentials(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", "https://user:hunter2@example.org/r.git"],
                   check=True)
    assert publish.Source.of(tmp_path).url is None


def test_only_an_image_that_passed_smoke_is_published_and_the_failures_are_named(tmp_path):
    from servestack.records.imageref import ImageRef

    project = Project(root=tmp_path)
    smoke = project.artifacts("dev-cpu") / "smoke.json"
    with pytest.raises(ServestackError, match="build/dev-cpu/smoke.json: missing; run the session"):
        publish.check_smoke(publish.Records.of_project(project, "dev-cpu"), ImageRef.parse(IMAGE))
    write_smoke_record(smoke, IMAGE,
                       checks=(Check(probe="static", name="versions", status="fail"), Check(probe="serving", name="health", status="pass")))
    with pytest.raises(ServestackError, match=r"smoke failed .*\(static/versions\)"):
        publish.check_smoke(publish.Records.of_project(project, "dev-cpu"), ImageRef.parse(IMAGE))
    write_smoke_record(smoke, IMAGE.replace("ab", "ef"))
    with pytest.raises(ServestackError, match="run `nox -s smoke` on this digest"):
        publish.check_smoke(publish.Records.of_project(project, "dev-cpu"), ImageRef.parse(IMAGE))
    publish.check_smoke(publish.Records.of_project(project, "dev-cpu"), ImageRef.parse(IMAGE.replace("ab", "ef")))


def test_a_smoke_that_served_nothing_is_published_only_when_allowed(tmp_path):
    from servestack.records.imageref import ImageRef

    project = Project(root=tmp_path)
    write_smoke_record(project.artifacts("dev-cpu") / "smoke.json", IMAGE, checks=(
        Check(probe="static", name="versions", status="pass"),
        Check(probe="serving", name="ready", status="not_run", detail="serving probe disabled (--no-serve)")))
    records = publish.Records.of_project(project, "dev-cpu")
    with pytest.raises(ServestackError, match=r"served nothing: .*1 serving checks did not run \(serving probe disabled "
                                              r"\(--no-serve\)\).*--allow-static-smoke") as refused:
        publish.check_smoke(records, ImageRef.parse(IMAGE))
    assert refused.value.exit_code == 10
    publish.check_smoke(records, ImageRef.parse(IMAGE), allow_static=True)


def test_the_statement_says_whether_the_smoke_served():
    from servestack.records.imageref import ImageRef

    def served(**kwargs):
        document = publish.provenance("dev-cpu", ImageRef.parse(IMAGE), "sha256:" + "cd" * 32, _files(),
                                      publish.Source(commit=None, url=None, dirty=False), None, "2023-11-14T22:13:20Z",
                                      "2026-12-02T20:00:00.000001Z", **kwargs)
        return document["predicate"]["buildDefinition"]["externalParameters"]["smokeServed"]

    assert served() is True and served(smoke_served=False) is False


@pytest.mark.parametrize("compress, media_type", [
    (lambda b: b, "application/vnd.oci.image.layer.v1.tar"),
    (gzip.compress, "application/vnd.oci.image.layer.v1.tar+gzip"),
    (lambda b: zstandard.ZstdCompressor().compress(b), "application/vnd.oci.image.layer.v1.tar+zstd"),
])
def test_stack_json_is_read_from_a_layer_in_every_compression(compress, media_type):
    layer = compress(tar_layer({"opt/servestack/stack.json": b'{"lock_sha256": "x"}', "etc/other": b"y"}))
    assert publish.layerfiles.file_in_layer(layer, media_type, publish.STACK_JSON) == b'{"lock_sha256": "x"}'
    assert publish.layerfiles.file_in_layer(compress(tar_layer({"etc/other": b"y"})), media_type, publish.STACK_JSON) is None


def test_stack_json_is_refused_when_the_layer_holds_it_twice_or_names_it_from_outside_the_root():
    twice = tar_layer({"opt/servestack/stack.json": b"{}", "./opt/servestack/stack.json": b'{"lock": 1}'})
    with pytest.raises(ServestackError, match="holds /opt/servestack/stack.json twice"):
        publish.layerfiles.file_in_layer(twice, "application/vnd.oci.image.layer.v1.tar", publish.STACK_JSON)
    climbing = tar_layer({"../../opt/servestack/stack.json": b"{}"})
    with pytest.raises(ServestackError, match="climbs out of the image's root"):
        publish.layerfiles.file_in_layer(climbing, "application/vnd.oci.image.layer.v1.tar", publish.STACK_JSON)


def test_pull_refuses_a_symlinked_out_directory_naming_it(keys, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(InputError, match=r"link: --out: is a symbolic link"):
        publish.pull(IMAGE, key=keys[1], out=tmp_path / "link")


def test_bundle_titles_that_clash_as_file_and_directory_are_refused():
    assert publish.bundle.titles_problem(["runs/a/results.json", "runs/a"]) == (
        "file title 'runs/a' is also the directory of 'runs/a/results.json'")
    assert publish.bundle.titles_problem(["pins/x.lock", "runs/a/results.json"]) is None


def test_pull_refuses_a_tag_and_a_used_directory_before_any_network(keys, tmp_path):
    with pytest.raises(ImageRefError, match="is a tag, not a digest"):
        publish.pull("127.0.0.1:5000/servestack/dev-cpu:latest", key=keys[1], out=tmp_path / "o")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("keep")
    with pytest.raises(InputError, match="not an empty directory"):
        publish.pull(IMAGE, key=keys[1], out=tmp_path / "used")
    assert (tmp_path / "used" / "mine.txt").read_text() == "keep"


@pytest.mark.parametrize("title", ["../etc/passwd", "/abs", "a/../b", ".hidden", "a//b", "", "a\x00b", "a\\b"])
def test_a_bundle_file_title_must_be_a_plain_relative_path(title):
    assert publish.bundle.title_problem(title)


def test_a_sigstore_bundle_names_the_key_by_its_hint_and_leaves_the_signature_keyid_empty(keys):
    """cosign 3 skips a DSSE signature whose non-empty keyid is not the key's fingerprint;
    securesystemslib writes its own key id there, which the signature does not cover."""
    import hashlib

    from cryptography.hazmat.primitives import serialization

    from servestack.publish import cosign

    signer = signing.load_signer(keys[0])
    envelope = _envelope(keys)
    bundle = json.loads(cosign.sigstore_bundle(envelope, signer))
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    der = serialization.load_pem_public_key(keys[1].read_bytes()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == base64.b64encode(hashlib.sha256(der).digest()).decode()
    dsse = bundle["dsseEnvelope"]
    assert dsse["signatures"][0]["keyid"] == "" and json.loads(envelope)["signatures"][0]["keyid"]
    assert signing.verify_envelope(json.dumps(dsse).encode(), signing.load_public_key(keys[1]), "t")["predicate"] == {"x": 1}
