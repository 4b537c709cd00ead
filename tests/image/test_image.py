"""`build` and `image` on a small fixture stack: a tiny package of our own with real PRs.

The fixture stack has the same shape as the real ones: a Debian base built here, a wheel from
a package index, one PR included upstream and one applied as an overlay. The end-to-end test, which
builds real images with BuildKit and pushes them to the loopback registry, is test_image_e2e.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import tarfile
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.paths import ROOT
from fixtures.records import write_image_record
from fixtures.tinystack import image_project
from servestack import image, inputs, lock
from servestack.errors import InputErrors, ServestackError
from servestack.image import oci
from servestack.image.spec import load_plan
from servestack.image.trees import install_all
from servestack.util.project import Project


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_tampered_cache_file_stops_the_build_naming_it(tmp_path, world, isolated_cache):
    project = image_project(tmp_path / "p", world)
    inputs.build(project, "tinyimg")
    (wheel,) = isolated_cache.glob("blobs/sha256/*/tinyserve-1.0.0-py3-none-any.whl")
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    with pytest.raises(ServestackError, match=r"tinyserve-1\.0\.0-py3-none-any\.whl: cached file .* has sha256"):
        inputs.build(project, "tinyimg")
    assert not (project.artifacts("tinyimg") / "build.json").exists()


def test_a_native_code_pr_is_refused_in_overlay_mode_naming_its_files(tmp_path, world, isolated_cache):
    project = image_project(tmp_path / "p", world, prs=(3,))
    with pytest.raises(ServestackError, match=r"csrc/kernel\.cu") as info:
        inputs.build(project, "tinyimg")
    assert "source build" in str(info.value)
    assert not (project.artifacts("tinyimg") / "build.json").exists()


def test_a_patch_that_does_not_apply_names_the_pr_file_and_hunk(tmp_path, world, isolated_cache):
    project = image_project(tmp_path / "p", world, prs=(4,))
    with pytest.raises(ServestackError) as info:
        inputs.build(project, "tinyimg")
    message = str(info.value)
    assert "example/tinyserve#4" in message and "tinyserve/" in message and "@@ -" in message
    assert not (project.artifacts("tinyimg") / "build.json").exists()


def test_build_records_every_input_and_each_overlaid_file(tmp_path, world, isolated_cache):
    project = image_project(tmp_path / "p", world)
    record = json.loads(inputs.build(project, "tinyimg").read_text())
    (wheel,) = record["inputs"]
    assert wheel["sha256"] == hashlib.sha256(world["pkg"].wheel.read_bytes()).hexdigest()
    (applied,) = record["overlays"]
    assert [p["number"] for p in applied["prs"]] == [2]
    assert "+ss." in applied["wheel"]["version"]
    at_pr_head = subprocess.run(["git", "-C", str(world["pkg"].repo), "show", f"{world['pkg'].prs[2].head}:tinyserve/server.py"],
                                capture_output=True, check=True).stdout
    assert applied["files"]["tinyserve/server.py"] == hashlib.sha256(at_pr_head).hexdigest()
    assert applied["files"]["tinyserve/legacy.py"] is None  # deleted by the PR


def _planned(project: Project, tmp_path: Path) -> list:
    inputs.build(project, "tinyimg")
    record, locked = inputs.load_build(project, "tinyimg"), lock.load_lock(project, "tinyimg")
    wheels = {i.sha256: Path(i.path) for i in record.inputs}
    wheels.update({o.wheel.sha256: Path(o.path) for o in record.overlays})
    trees = dict(zip(wheels, install_all([(p, s) for s, p in wheels.items()], "3.11", None), strict=True))
    return image.plan(record, locked, trees, load_plan(ROOT / "containers" / "image.yaml"), tmp_path / "work")


def test_the_layer_plan_stores_every_file_once_with_overlaid_files_on_top(tmp_path, world, isolated_cache):
    layers = _planned(image_project(tmp_path / "p", world), tmp_path)
    names = [layer.name for layer in layers]
    assert names[0] == "venv" and names[-1] == "top" and names[-2] == "model"
    targets = [e.path for layer in layers for e in layer.entries]
    assert len(targets) == len(set(targets))
    top = {e.path for e in layers[-1].entries}
    site = "opt/venv/lib/python3.11/site-packages"
    assert f"{site}/tinyserve/server.py" in top and f"{site}/tinyserve/extra.py" in top  # changed, added by PR #2
    assert "opt/servestack/stack.json" in top
    below = {e.path for layer in layers[:-1] for e in layer.entries}
    assert f"{site}/tinyserve/__init__.py" in below  # untouched by the PR: stays below
    assert f"{site}/tinyserve/__pycache__/__init__.cpython-311.pyc" in below  # bytecode is shipped
    assert not any(t.startswith(f"{site}/tinyserve/legacy.py") for t in targets)  # deleted by the PR


def test_a_small_package_shares_a_layer_chosen_by_its_name_and_a_large_one_gets_its_own(tmp_path, world, isolated_cache):
    project = image_project(tmp_path / "p", world)
    plan_file = tmp_path / "image.yaml"
    text = (ROOT / "containers" / "image.yaml").read_text()
    plan_file.write_text(text.replace("own_layer_above: 50000000", "own_layer_above: 1"))
    inputs.build(project, "tinyimg")
    record, locked = inputs.load_build(project, "tinyimg"), lock.load_lock(project, "tinyimg")
    wheels = {i.sha256: Path(i.path) for i in record.inputs}
    wheels.update({o.wheel.sha256: Path(o.path) for o in record.overlays})
    trees = dict(zip(wheels, install_all([(p, s) for s, p in wheels.items()], "3.11", None), strict=True))
    own = [layer.name for layer in image.plan(record, locked, trees, load_plan(plan_file), tmp_path / "w1")]
    shared = [layer.name for layer in image.plan(record, locked, trees, load_plan(ROOT / "containers" / "image.yaml"), tmp_path / "w2")]
    assert "pkg-tinyserve" in own and not any(n.startswith("shared-") for n in own)
    bucket = int(hashlib.sha256(b"tinyserve").hexdigest()[:8], 16) % 8
    assert f"shared-{bucket}" in shared and "pkg-tinyserve" not in shared


def test_layers_written_early_as_trees_are_ready_are_the_planned_ones(tmp_path, world, isolated_cache):
    """The pipeline: a package's own layer is written while other trees are made, with the key plan() gives
    it, so the layer step finds it cached; an overlaid package is left to the plan (its files split)."""
    from servestack.image import layers

    project = image_project(tmp_path / "p", world)
    plan_file = tmp_path / "image.yaml"
    plan_file.write_text((ROOT / "containers" / "image.yaml").read_text().replace("own_layer_above: 50000000", "own_layer_above: 1"))
    spec = load_plan(plan_file)
    inputs.build(project, "tinyimg")
    record, locked = inputs.load_build(project, "tinyimg"), lock.load_lock(project, "tinyimg")
    epoch = record.source_date_epoch
    wheels = {i.sha256: Path(i.path) for i in record.inputs}

    overlaid = image.EarlyLayers(record, spec, epoch, None)
    install_all([(p, s) for s, p in wheels.items()], "3.11", None, on_tree=overlaid.offer)
    assert overlaid.finish() == {}

    class Sent:  # what Uploads would push, as soon as the early layer exists
        def __init__(self):
            self.blobs = []

        def send(self, digest, path, size):
            assert path.is_file() and path.stat().st_size == size
            self.blobs.append(digest)

    record = replace(record, overlays=())
    sent = Sent()
    early = image.EarlyLayers(record, spec, epoch, None, sent)
    trees = dict(zip(wheels, install_all([(p, s) for s, p in wheels.items()], "3.11", None, on_tree=early.offer), strict=True))
    written = early.finish()
    own = [layer for layer in image.plan(record, locked, trees, spec, tmp_path / "w") if layer.name.startswith("pkg-")]
    assert [layer.name for layer in own] == ["pkg-tinyserve"]
    key = layers.layer_key(list(own[0].entries), epoch)
    assert list(written) == [key] and layers.cached(key) is not None
    assert sent.blobs == [layers.cached(key).digest]


def test_the_debian_base_is_read_for_its_key_once_per_build(tmp_path, monkeypatch, isolated_cache):
    """EarlyLayers compresses the base while the trees are made and `base_layers` names it after: the tarball
    (225 MB for dev-cpu) is read once for its key, not by each."""
    from servestack.image import layers

    tarball = tmp_path / "base.tar"
    (tmp_path / "root" / "etc").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "os-release").write_text("ID=debian\n")
    with tarfile.open(tarball, "w") as tar:
        tar.add(tmp_path / "root", arcname=".")
    hashed: list[Path] = []
    real = layers.sha256_file
    monkeypatch.setattr(layers, "sha256_file", lambda path: hashed.append(Path(path)) or real(path))
    monkeypatch.setattr(image.base_image, "debian_base", lambda base, platform: tarball)

    class Progress:  # what `_base` reports to
        def expect(self, n):
            raise AssertionError("the base was compressed early: nothing left to expect")

        def add(self, counter, n):
            pass

    early = image.EarlyLayers(SimpleNamespace(inputs=(), overlays=()), None, 0, tarball)
    assert early.finish() == {}
    base = image.base_image.base_layers(SimpleNamespace(base=None), "linux/amd64", "127.0.0.1:1", Progress())
    assert hashed == [tarball]
    assert base.layers[0].digest == layers.cached(layers.tarball_key(tarball)).digest


def test_a_misspelled_plan_field_is_named_with_its_line(tmp_path):
    plan_file = tmp_path / "image.yaml"
    plan_file.write_text((ROOT / "containers" / "image.yaml").read_text().replace("shared_layers:", "shared_layer:"))
    with pytest.raises(InputErrors) as info:
        load_plan(plan_file)
    (error,) = info.value.errors
    assert error.location.file == plan_file and error.location.line == 20
    assert error.field == "layers[2].shared_layer" and "did you mean `shared_layers`?" in error.problem


def test_the_expected_digest_says_reproduced_different_stale_or_none(tmp_path):
    project = Project(root=tmp_path)
    (tmp_path / "pins").mkdir()
    digest = "sha256:" + "a" * 64
    assert image.check_expected(project, "s", "linux/amd64", digest, "lock1").status == "none"
    image.write_expected(project, "s", write_image_record(tmp_path / "image.json", f"127.0.0.1:5000/servestack/s@{digest}",
                                                          "s", lock_sha256="lock1"), "3.11.2", ["linux/amd64"])
    assert image.check_expected(project, "s", "linux/amd64", digest, "lock1").status == "reproduced"
    assert image.check_expected(project, "s", "linux/amd64", "sha256:" + "b" * 64, "lock1").status == "different"
    assert image.check_expected(project, "s", "linux/amd64", digest, "lock2").status == "stale"
    assert image.check_expected(project, "s", "linux/arm64", digest, "lock1").status == "none"
    assert "--update-expected" in json.loads((tmp_path / "pins" / "s.image.json").read_text())["update"]


def test_each_platform_s_digest_is_kept_and_the_index_is_named_once_every_platform_of_the_lock_has_one(tmp_path):
    project = Project(root=tmp_path)
    (tmp_path / "pins").mkdir()
    amd64, arm64 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    lock_platforms = ["linux/amd64", "linux/arm64"]
    image.write_expected(project, "s", write_image_record(tmp_path / "image.json", f"r/s@{amd64}", "s", lock_sha256="lock1"),
                         "3.11.2", lock_platforms)
    written = json.loads((tmp_path / "pins" / "s.image.json").read_text())
    assert written["index"] is None and list(written["platforms"]) == ["linux/amd64"]
    image.write_expected(project, "s", write_image_record(tmp_path / "image.json", f"r/s@{arm64}", "s", lock_sha256="lock1",
                                                          platform="linux/arm64"), "3.11.2", lock_platforms)
    written = json.loads((tmp_path / "pins" / "s.image.json").read_text())
    assert written["platforms"] == {"linux/amd64": {"digest": amd64, "size": 500}, "linux/arm64": {"digest": arm64, "size": 500}}
    index = oci.index({"linux/amd64": (amd64, 500), "linux/arm64": (arm64, 500)})
    assert written["index"] == index.digest
    entries = json.loads(index.data)["manifests"]
    assert [(e["platform"]["architecture"], e["platform"].get("variant")) for e in entries] == [("amd64", None), ("arm64", "v8")]
    # A new lock drops the other platform's digest (it was built from the old lock) and the index with it.
    image.write_expected(project, "s", write_image_record(tmp_path / "image.json", f"r/s@{amd64}", "s", lock_sha256="lock2"),
                         "3.11.2", lock_platforms)
    written = json.loads((tmp_path / "pins" / "s.image.json").read_text())
    assert list(written["platforms"]) == ["linux/amd64"] and written["index"] is None


def test_update_expected_refuses_a_digest_whose_bytecode_another_interpreter_version_compiled(tmp_path):
    project = Project(root=tmp_path)
    (tmp_path / "pins").mkdir()
    made = write_image_record(tmp_path / "image.json", "127.0.0.1:5000/servestack/s@sha256:" + "a" * 64, "s")
    with pytest.raises(ServestackError, match=r"s.image.json not written: the image's interpreter is Python 3.11.7, but "
                                              r"this build's bytecode was compiled by Python 3.11.2"):
        image.write_expected(project, "s", made, "3.11.7", ["linux/amd64"])
    assert not (tmp_path / "pins" / "s.image.json").exists()
    image.write_expected(project, "s", made, None, ["linux/amd64"])  # a base image's version is not known: nothing to compare
    assert (tmp_path / "pins" / "s.image.json").exists()


def test_the_image_input_hash_and_cache_tag_change_with_the_compiling_interpreters_exact_version():
    # An image whose pycs another patch release (or no interpreter) wrote must not be reused from the registry.
    from servestack.records.steps import BuildRecord
    record = BuildRecord(stack="s", platform="linux/amd64", lock_sha256="0" * 64, source_date_epoch=0, inputs=(), overlays=(),
                         unverified_prs=(), model=None, input_hash="1" * 64)
    hashes = {version: image.image_input_hash(record, version) for version in ("3.11.2", "3.11.7", "none")}
    assert len(set(hashes.values())) == 3 and all(h != record.input_hash for h in hashes.values())
    assert image.image_input_hash(record, "3.11.2") == hashes["3.11.2"]
    assert image.image_input_hash(replace(record, input_hash="2" * 64), "3.11.2") != hashes["3.11.2"]


def test_made_trees_record_their_cpu_seconds_and_come_back_cached(tmp_path, world, isolated_cache):
    from servestack.image import layers
    from servestack.image.trees import children_cpu_seconds

    project = image_project(tmp_path / "p", world)
    inputs.build(project, "tinyimg")
    record = inputs.load_build(project, "tinyimg")
    wheels = [(Path(i.path), i.sha256) for i in record.inputs] + [(Path(o.path), o.wheel.sha256) for o in record.overlays]
    children = children_cpu_seconds()
    made = install_all(wheels, "3.11", None)
    assert children_cpu_seconds() > children  # the bytecode compilers ran, and are counted
    assert all(t.made and t.install_cpu_seconds > 0 for t in made)
    timing = json.loads((made[0].path / "timing.json").read_text())
    assert timing["install_cpu_seconds"] == round(made[0].install_cpu_seconds, 2)
    # The entry lists took installer's hashes of the files it packed: the same as reading every file's bytes.
    assert all(hashlib.sha256(layers.content(e)).hexdigest() == e.sha256 for t in made for e in t.entries)
    assert any(e.path.endswith(".pyc") for t in made for e in t.entries)
    again = install_all(wheels, "3.11", None)
    assert [t.path for t in again] == [t.path for t in made] and not any(t.made for t in again)
    assert [t.entries for t in again] == [t.entries for t in made]


class _FakeRegistry:
    """image.registry for Uploads: holds nothing; a push reads its blob in chunks until `release`."""

    def __init__(self, failing: set[str] = frozenset()):
        self.failing, self.started, self.release = failing, threading.Event(), threading.Event()

    def blob_exists(self, address, repository, digest):
        return False

    def push_blob(self, address, repository, digest, path, on_bytes):
        if digest in self.failing:
            raise ServestackError(f"upload of {digest} refused (HTTP 500)")
        self.started.set()
        while not self.release.is_set():  # a multi-GB blob: chunk after chunk until released
            on_bytes(1 << 20)
            self.release.wait(0.01)


def test_a_blob_the_manifest_does_not_use_is_neither_waited_for_nor_counted(tmp_path, monkeypatch):
    """An early layer the plan then dropped: its failed push must not fail the build."""
    fake = _FakeRegistry(failing={"sha256:dropped"})
    fake.release.set()
    monkeypatch.setattr(image.uploads, "registry", fake)
    with image.Uploads("127.0.0.1:5000", "servestack/s") as uploads:
        uploads.send("sha256:dropped", tmp_path / "dropped", 7)
        uploads.send("sha256:used", tmp_path / "used", 11)
        assert uploads.wait(["sha256:used"]) == [11]


def test_leaving_on_an_interrupt_stops_a_push_under_way_instead_of_finishing_it(tmp_path, monkeypatch):
    fake = _FakeRegistry()
    monkeypatch.setattr(image.uploads, "registry", fake)
    left = threading.Event()

    def build():
        with contextlib.suppress(KeyboardInterrupt), image.Uploads("127.0.0.1:5000", "servestack/s") as uploads:
            uploads.send("sha256:large", tmp_path / "large", 5 << 30)
            assert fake.started.wait(timeout=30)
            raise KeyboardInterrupt
        left.set()

    threading.Thread(target=build, daemon=True).start()
    try:
        assert left.wait(timeout=30), "leaving Uploads waited for the push to finish"
    finally:
        fake.release.set()


def test_the_committed_index_digests_are_the_index_over_the_committed_platform_digests():
    """An image index is a function of its platforms' manifests: what pins/<stack>.image.json names as
    the index is what `image` would push over the digests beside it."""
    for expected in sorted((ROOT / "pins").glob("*.image.json")):
        doc = json.loads(expected.read_text())
        if doc["index"] is None:
            continue
        manifests = {p: (entry["digest"], entry["size"]) for p, entry in doc["platforms"].items()}
        assert oci.index(manifests).digest == doc["index"], expected.name
