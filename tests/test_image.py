"""`build` and `image` on a small fixture stack: a tiny package of our own with real PRs.

The fixture stack has the same shape as the real ones: a Debian base built here, a wheel from
a package index, one PR included upstream and one applied as an overlay. The end-to-end tests
build real images with BuildKit and push them to the loopback registry.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from servestack import build, image, lock
from servestack.errors import ServestackError
from servestack.project import Project
from servestack.sources.github import GitHub

ROOT = Path(__file__).resolve().parents[1]

STACK = """\
name: tinyimg
platforms: [linux/amd64]
python: "3.11"
base:
  debian:
    suite: bookworm
    packages: [python3, python3-venv, ca-certificates, libnuma1, libgomp1]
indexes:
  - name: local
    url: {index}
packages:
  - name: tinyserve
    version: 1.0.0
    index: local
    prs:
{prs}
environment:
  TINYSERVE_MODE: smoke
smoke_model:
  name: tiny
  make: {{seed: 0}}
"""


def make_project(root: Path, world, prs=(1, 2)) -> Project:
    (root / "pins").mkdir(parents=True)
    shutil.copytree(ROOT / "containers", root / "containers")
    lines = "".join(f"      - repo: {world['pkg'].repo_name}\n        number: {n}\n" for n in prs)
    (root / "pins" / "tinyimg.yaml").write_text(STACK.format(index=world["index"], prs=lines))
    project = Project(root)
    lock.lock(project, "tinyimg", GitHub(api=world["github"].url, token="", retries=1))
    return project


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_tampered_cache_file_stops_the_build_naming_it(tmp_path, world, isolated_cache):
    project = make_project(tmp_path / "p", world)
    build.build(project, "tinyimg")
    (wheel,) = isolated_cache.glob("blobs/sha256/*/tinyserve-1.0.0-py3-none-any.whl")
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    with pytest.raises(ServestackError, match=r"tinyserve-1\.0\.0-py3-none-any\.whl: cached file .* has sha256"):
        build.build(project, "tinyimg")
    assert not (project.artifacts("tinyimg") / "build.json").exists()


def test_a_native_code_pr_is_refused_in_overlay_mode_naming_its_files(tmp_path, world, isolated_cache):
    project = make_project(tmp_path / "p", world, prs=(3,))
    with pytest.raises(ServestackError, match=r"csrc/kernel\.cu") as info:
        build.build(project, "tinyimg")
    assert "source build" in str(info.value)
    assert not (project.artifacts("tinyimg") / "build.json").exists()


def test_a_patch_that_does_not_apply_names_the_pr_file_and_hunk(tmp_path, world, isolated_cache):
    project = make_project(tmp_path / "p", world, prs=(4,))
    with pytest.raises(ServestackError) as info:
        build.build(project, "tinyimg")
    message = str(info.value)
    assert "example/tinyserve#4" in message and "tinyserve/" in message and "@@ -" in message
    assert not (project.artifacts("tinyimg") / "build.json").exists()


def test_build_records_every_input_and_each_overlaid_file(tmp_path, world, isolated_cache):
    project = make_project(tmp_path / "p", world)
    record = json.loads(build.build(project, "tinyimg").read_text())
    (wheel,) = record["inputs"]
    assert wheel["sha256"] == hashlib.sha256(world["pkg"].wheel.read_bytes()).hexdigest()
    (applied,) = record["overlays"]
    assert [p["number"] for p in applied["prs"]] == [2]
    assert "+ss." in applied["wheel"]["version"]
    at_pr_head = subprocess.run(["git", "-C", str(world["pkg"].repo), "show", f"{world['pkg'].prs[2].head}:tinyserve/server.py"],
                                capture_output=True, check=True).stdout
    assert applied["files"]["tinyserve/server.py"] == hashlib.sha256(at_pr_head).hexdigest()
    assert applied["files"]["tinyserve/legacy.py"] is None  # deleted by the PR


# --------------------------------------------------------------------------- end to end


def _delete_from_registry(reference: str) -> None:
    repository_part, digest = reference.split("@")
    address, repository = repository_part.split("/", 1)
    response = requests.delete(f"http://{address}/v2/{repository}/manifests/{digest}", timeout=10)
    assert response.status_code in (202, 404), response.text


def _build_and_push(project: Project) -> dict:
    build.build(project, "tinyimg")
    return image.build_image(project, "tinyimg")


@pytest.mark.e2e
def test_the_image_is_reproducible_and_a_changed_patch_changes_only_the_top_layer(tmp_path, world, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache-1"))
    first_project = make_project(tmp_path / "one", world)
    first = _build_and_push(first_project)
    assert first["reference"].split("@")[1].startswith("sha256:")
    assert first["layer_names"][0] == "venv" and first["layer_names"][-1] == "top"

    # A second build from clean state: another checkout, an empty cache, the image gone from the registry.
    _delete_from_registry(first["reference"])
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache-2"))
    second_project = make_project(tmp_path / "two", world)
    second = _build_and_push(second_project)
    assert second["reference"] == first["reference"]
    assert not second["skipped"]

    # A no-op rerun: the registry holds this build's input hash, so nothing is built or pushed.
    started = time.monotonic()
    again = image.build_image(second_project, "tinyimg")
    assert again["skipped"] and again["bytes_pushed"] == 0
    assert again["reference"] == second["reference"]
    assert time.monotonic() - started < 15

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


def test_the_layer_plan_stores_every_file_once_with_overlaid_files_on_top(tmp_path, world, isolated_cache):
    project = make_project(tmp_path / "p", world)
    record = json.loads(build.build(project, "tinyimg").read_text())
    record["lock"] = lock.load_lock(project, "tinyimg")
    layers = image.plan(record, "3.11", tmp_path / "context")
    names = [layer.name for layer in layers]
    assert names[0] == "venv" and names[-1] == "top" and names.index("pinned-0") < names.index("model")
    targets = [target for layer in layers for _, target in layer.files]
    assert len(targets) == len(set(targets))
    top = {target for _, target in layers[-1].files}
    site = "opt/venv/lib/python3.11/site-packages"
    assert f"{site}/tinyserve/server.py" in top and f"{site}/tinyserve/extra.py" in top  # changed, added by PR #2
    assert "opt/servestack/stack.json" in top
    pinned = {target for layer in layers if layer.name.startswith("pinned") for _, target in layer.files}
    assert f"{site}/tinyserve/__init__.py" in pinned  # untouched by the PR: stays below
    assert not any(t.startswith(f"{site}/tinyserve/legacy.py") for t in targets)  # deleted by the PR
    assert all(layer.size <= image.LAYER_LIMIT for layer in layers)
