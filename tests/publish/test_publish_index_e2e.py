"""The stack published by its image index, against the TLS registry with a login: a two-platform
index (amd64 with this checkout's records, arm64 built elsewhere), published with one command;
pull by the index (this machine's platform and --platform) and by each platform's digest; stock
cosign 2.5 verify and verify-attestation on the index and on each platform, with the key and with
another; verify --rebuild compares the platform it rebuilds with the index's entry, and `servestack verify` by
the index and by each platform digest rebuilds the platform it checks."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from fixtures import trixie_tools as tools
from fixtures.paths import ROOT
from fixtures.publication import STACK, make_project, new_image
from fixtures.tls_registry import push_stack_image
from servestack import publish
from servestack.publish import rebuild, sbom, signing
from servestack.records.imageref import ImageRef
from servestack.records.steps import read_image, write_image
from servestack.sources.registry import OCI_INDEX, OCI_MANIFEST, sha256_digest

pytestmark = pytest.mark.e2e
PLATFORMS = ("linux/amd64", "linux/arm64")


@pytest.fixture(scope="module")
def indexed(tls_registry, tmp_path_factory):
    """Two platforms' images and the index over them, published once from records of the amd64 build."""
    tmp_path = tmp_path_factory.mktemp("indexed")
    with pytest.MonkeyPatch.context() as patched:
        for name, value in tls_registry.environment().items():
            patched.setenv(name, value)
        amd64, client = new_image(tls_registry)
        lock = (ROOT / "pins" / f"{STACK}.lock").read_bytes()
        arm64 = push_stack_image(client, lock, tag="arm64", salt=b"arm64", architecture="arm64")
        entries = [{"mediaType": OCI_MANIFEST, "digest": digest, "size": len(client.get_manifest(digest)[0]),
                    "platform": {"architecture": arch, "os": "linux"}}
                   for arch, digest in (("amd64", ImageRef.parse(amd64).digest), ("arm64", arm64))]
        data = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        client.put_manifest("index", data, OCI_INDEX)
        index = f"{ImageRef.parse(amd64).name}@{sha256_digest(data)}"
        project = make_project(tmp_path / "checkout", amd64)
        path = project.artifacts(STACK) / "image.json"
        write_image(path, dataclasses.replace(read_image(path), index=sha256_digest(data)))  # what `image` records
        private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
        with contextlib.redirect_stdout(io.StringIO()) as said:  # capsys is the test's: this fixture is the module's
            record = publish.publish(project, STACK, key=private)
        yield {"index": index, "platforms": {"linux/amd64": amd64, "linux/arm64": f"{ImageRef.parse(amd64).name}@{arm64}"},
               "client": client, "project": project, "key": private, "pub": public, "record": record, "said": said.getvalue(),
               "tmp": tmp_path}


def test_publish_signs_the_index_and_each_platform_each_sbom_from_its_own_layers(indexed, env, tmp_path):
    record = indexed["record"]
    assert record["image"] == indexed["index"] and set(record["platforms"]) == set(PLATFORMS)
    for name, image in indexed["platforms"].items():
        assert record["platforms"][name]["image"] == image
        assert f"platform    {name}: {image}" in indexed["said"]
    titles = {f["title"] for f in record["files"]}
    assert {"sbom/linux-amd64.spdx.json", "sbom/linux-arm64.spdx.json", f"pins/{STACK}.lock"} <= titles

    out = publish.pull(indexed["index"], key=indexed["pub"], out=tmp_path / "by-index")
    taken = json.loads((out / "publication.json").read_text())
    assert taken["bundle"] == record["bundle_digest"]
    assert taken["platform"]["name"] == "linux/amd64" and taken["platform"]["image"] == indexed["platforms"]["linux/amd64"]
    for recipe in (out / "recipes").glob("*.yaml"):
        assert yaml.safe_load(recipe.read_text())["model"]["container"] == indexed["index"]
    for name, image in indexed["platforms"].items():  # each platform's SBOM describes its own digest and base
        document = sbom.read_sbom((out / f"sbom/{name.replace('/', '-')}.spdx.json").read_bytes(), ImageRef.parse(image),
                                  name)
        assert {p["name"] for p in document["packages"] if p["SPDXID"].startswith("SPDXRef-deb-")} == {
            "libc6", "python3.11-minimal"}
    arm = json.loads((out / "sbom/linux-arm64.spdx.json").read_text())
    assert "the lock's wheels for linux/arm64" in arm["comment"]

    other = publish.pull(indexed["index"], key=indexed["pub"], out=tmp_path / "arm", platform="linux/arm64")
    assert json.loads((other / "publication.json").read_text())["platform"]["image"] == indexed["platforms"]["linux/arm64"]
    for name, image in indexed["platforms"].items():  # a platform's digest alone still pulls
        alone = publish.pull(image, key=indexed["pub"], out=tmp_path / name.replace("/", "-"))
        assert json.loads((alone / "publication.json").read_text())["bundle"] == record["platforms"][name]["bundle_digest"]
        assert yaml.safe_load(next((alone / "recipes").glob("*.yaml")).read_text())["model"]["container"] == image


def test_stock_cosign_verifies_the_index_and_each_platform_and_another_key_none(indexed, env, tmp_path):
    cosign = tools.trixie_tool("cosign")
    index = ImageRef.parse(indexed["index"])
    ca = Path(os.environ["SERVESTACK_CERTS_D"]) / index.registry / "ca.crt"
    environment = {**os.environ, "HOME": str(tmp_path), "SSL_CERT_FILE": str(ca)}
    other = signing.keygen(tmp_path / "other.key")[1]

    def cosign_run(*args: str, key: Path, image: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(cosign), *args, "--key", str(key), "--insecure-ignore-tlog", image], check=False,
                              capture_output=True, text=True, env=environment, timeout=120)

    for image in (indexed["index"], *indexed["platforms"].values()):
        for args in (("verify",), ("verify-attestation", "--type", "slsaprovenance1")):
            verified = cosign_run(*args, key=indexed["pub"], image=image)
            assert verified.returncode == 0, (image, args, verified.stdout + verified.stderr)
            assert cosign_run(*args, key=other, image=image).returncode != 0, (image, args)
    for image in indexed["platforms"].values():
        assert cosign_run("verify-attestation", "--type", "spdxjson", key=indexed["pub"], image=image).returncode == 0
    listing = subprocess.run([str(tools.trixie_tool("oras")), "discover", "--ca-file", str(ca), "--format", "json",
                              indexed["index"]], check=False, capture_output=True, text=True, env=environment)
    assert listing.returncode == 0 and indexed["record"]["bundle_digest"] in listing.stdout, listing.stderr


def test_verify_rebuild_by_the_index_compares_the_platform_it_rebuilds_with_the_index_entry(indexed, env, monkeypatch):
    """The rebuild itself is test_publish_registry_e2e's; here it is stood in for by the image it would
    make: the index's amd64 manifest (same) or another digest (different)."""
    from servestack import image as image_step
    from servestack import inputs, services

    built = read_image(indexed["project"].artifacts(STACK) / "image.json")
    monkeypatch.setattr(inputs, "build", lambda *args, **kwargs: None)
    monkeypatch.setattr(services, "ensure_registry", lambda address: address)
    for made, same in ((indexed["platforms"]["linux/amd64"], True), (f"{indexed['index'].split('@')[0]}@sha256:{'e' * 64}", False)):
        monkeypatch.setattr(image_step, "build_image", lambda *args, made=made, **kwargs: dataclasses.replace(
            built, reference=made, platforms=("linux/amd64",)))
        result = rebuild.verify_rebuild(indexed["project"], indexed["index"], key=indexed["pub"])
        assert result["same"] is same and result["expected"] == ImageRef.parse(indexed["platforms"]["linux/amd64"]).digest


def test_servestack_verify_by_the_index_and_by_each_platform_digest_rebuilds_that_platform(indexed, env, monkeypatch, capsys):
    """`servestack verify --rebuild` as a user types it, on the index and on each platform's digest of the same
    publication: the index is checked by this machine's platform, a platform digest by its own platform (the
    arm64 digest rebuilds arm64 here too, not this machine's). The rebuild is stood in for by the image it would
    make of the platform it is asked for: that platform's published manifest (exit 0, SAME) or another digest
    (exit 1, DIFFERENT). A real rebuild of this fixture's made-up images could never match; the quick start's
    e2e runs one."""
    from servestack import cli, inputs, platforms, services
    from servestack import image as image_step

    built = read_image(indexed["project"].artifacts(STACK) / "image.json")
    here = platforms.host_platform()
    asked: list[str] = []
    monkeypatch.setattr(inputs, "build", lambda project, stack, *, platform=None, **kwargs:
                        asked.append(platform or here))
    monkeypatch.setattr(services, "ensure_registry", lambda address: address)
    other = f"{indexed['index'].split('@')[0]}@sha256:{'e' * 64}"
    checks = [(indexed["index"], here), *((image, name) for name, image in indexed["platforms"].items())]
    for reference, platform in checks:
        for same, code in ((True, 0), (False, 1)):
            monkeypatch.setattr(image_step, "build_image", lambda *args, same=same, **kwargs: dataclasses.replace(
                built, reference=indexed["platforms"][asked[-1]] if same else other, platforms=(asked[-1],)))
            asked.clear()
            result = cli.main(["--project", str(indexed["project"].root), "verify", reference, "--key",
                               str(indexed["pub"]), "--rebuild"])
            said = capsys.readouterr().out
            assert asked == [platform] and result == code, (reference, asked, said)
            digest = ImageRef.parse(indexed["platforms"][platform]).digest
            assert f"verify {digest}: rebuilt " in said and ("SAME" if same else "DIFFERENT") + " digest" in said, said
