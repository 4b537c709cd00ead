"""`build` and `image` end to end on the small fixture stack (fixtures/tinystack.py): real images built
with BuildKit, pushed to the loopback registry and run by docker."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import pytest
import requests

from fixtures.tinystack import image_project
from servestack import image, inputs, services
from servestack.util.project import Project


def _delete_from_registry(reference: str) -> None:
    repository_part, digest = reference.split("@")
    address, repository = repository_part.split("/", 1)
    response = requests.delete(f"http://{address}/v2/{repository}/manifests/{digest}", timeout=10)
    assert response.status_code in (202, 404), response.text


def _build_and_push(project: Project) -> dict:
    """The image record as written to image.json."""
    inputs.build(project, "tinyimg")
    return image.build_image(project, "tinyimg").to_json()


@pytest.mark.e2e
def test_the_image_is_reproducible_and_a_changed_patch_changes_only_the_top_layer(tmp_path, world, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache-1"))
    first_project = image_project(tmp_path / "one", world)
    first = _build_and_push(first_project)
    assert first["reference"].split("@")[1].startswith("sha256:")
    assert first["layer_names"][:2] == ["base", "venv"] and first["layer_names"][-1] == "top"

    # A second build from clean state: another checkout, an empty cache, the image gone from the registry.
    _delete_from_registry(first["reference"])
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache-2"))
    second_project = image_project(tmp_path / "two", world)
    second = _build_and_push(second_project)
    assert second["reference"] == first["reference"]
    assert not second["skipped"]

    # Docker (containerd) pulls it by digest and runs it: the zstd layers unpack, the venv works.
    services.ensure_dockerd()
    ran = subprocess.run(["docker", "run", "--rm", "--network=none", second["reference"], "python", "-c",
                          "import json, tinyserve.server as s; print(s.__file__, "
                          "json.load(open('/opt/servestack/stack.json'))['lock_sha256'])"],
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["/opt/venv/lib/python3.11/site-packages/tinyserve/server.py", second["lock_sha256"]]

    # The committed expected digest: `servestack image` says it reproduced it, and fails on another one.
    def cli(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "servestack", "--project", str(second_project.root), "image",
                               "--stack", "tinyimg", *extra], capture_output=True, text=True, timeout=600)

    assert cli("--update-expected").returncode == 0
    assert "reproduced the expected digest" in cli().stdout
    expected = second_project.pins / "tinyimg.image.json"
    expected.write_text(expected.read_text().replace(second["reference"].split("@sha256:")[1], "0" * 64))
    refused = cli()
    assert refused.returncode == 1 and "DIFFERENT from the expected" in refused.stdout
    expected.unlink()

    # A no-op rerun: the registry holds this build's input hash, so nothing is built or pushed.
    started = time.monotonic()
    again = image.build_image(second_project, "tinyimg")
    assert again.skipped and again.bytes_pushed == 0
    assert again.reference == second["reference"]
    assert time.monotonic() - started < 2

    # The PR changed upstream: a re-lock records its new diff; only the top layer changes.
    document = json.loads(second_project.lock_file("tinyimg").read_text())
    (entry,) = [p for p in document["pull_requests"] if p["number"] == 2]
    patch = second_project.root / entry["patch"]["path"]
    patch.write_text(patch.read_text().replace("return 42", "return 43"))
    entry["patch"]["sha256"] = hashlib.sha256(patch.read_bytes()).hexdigest()
    second_project.lock_file("tinyimg").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    changed = _build_and_push(second_project)
    assert changed["reference"] != second["reference"]
    before = [layer["digest"] for layer in second["layers"]]
    after = [layer["digest"] for layer in changed["layers"]]
    assert before[:-1] == after[:-1] and before[-1] != after[-1]
    assert changed["layers_pushed"] == 1
    assert changed["bytes_pushed"] < 0.01 * changed["total_size"]
