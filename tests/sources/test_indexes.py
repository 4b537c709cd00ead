"""Where indexes are is configuration; a lock names only the index and the file.

Real local indexes: the tinyserve wheel on a PEP 503 index over HTTP (asked through uv), and a
plain directory holding the same file (a flat index), standing in for it through configuration.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

import pytest

from fixtures.records import committed_lock
from fixtures.tinystack import PR1_EVIDENCE, stack_with, unreachable
from servestack import inputs, lock
from servestack.errors import InputError, IntegrityError, ServestackError
from servestack.lock import check as lockcheck
from servestack.lock import drift, relock
from servestack.lock.preferences import Upgrade
from servestack.records.lockfile import LockedPR, LockedWheel, OverlayPatch
from servestack.sources import cache, indexes


@pytest.fixture(autouse=True)
def clean_configuration(tmp_path, monkeypatch):
    """No uv configuration or index variable of this machine leaks in; an empty cache of our own."""
    (tmp_path / "uv.toml").write_text("")
    monkeypatch.setenv("UV_CONFIG_FILE", str(tmp_path / "uv.toml"))
    for var in ("UV_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_NO_CONFIG", "SERVESTACK_INDEX_LOCAL",
                "SERVESTACK_INDEX_PYPI", "SERVESTACK_INDEX_PYTORCH_CPU"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))


def test_the_first_configured_location_wins(tmp_path, monkeypatch):
    defaults = {"local": "http://default.invalid/simple"}
    assert indexes.locate("local", defaults).source == "the stack's default"
    (tmp_path / "uv.toml").write_text('[[index]]\nname = "local"\nurl = "http://uvtoml.invalid/simple"\n')
    assert indexes.locate("local", defaults).url == "http://uvtoml.invalid/simple"
    monkeypatch.setenv("UV_INDEX", "other=http://x.invalid local=http://uvenv.invalid/simple")
    assert indexes.locate("local", defaults).url == "http://uvenv.invalid/simple"
    monkeypatch.setenv("SERVESTACK_INDEX_LOCAL", str(tmp_path))
    found = indexes.locate("local", defaults)
    assert (found.url, found.flat, found.directory, found.source) == (str(tmp_path), True, tmp_path, "SERVESTACK_INDEX_LOCAL")


def test_the_default_index_is_uvs_own_unless_configured(tmp_path, monkeypatch):
    assert indexes.locate("pypi", {}).url is None and indexes.locate("pypi", {}).uv_args(only=True) == []
    (tmp_path / "uv.toml").write_text('index-url = "http://mirror.invalid/simple"\n')
    assert indexes.locate("pypi", {}).uv_args(only=True) == ["--default-index", "http://mirror.invalid/simple"]


def test_an_index_with_no_location_says_how_to_configure_it():
    with pytest.raises(InputError, match=r"indexes\[pytorch-cpu\]: index 'pytorch-cpu' has no location here: "
                                         r"set SERVESTACK_INDEX_PYTORCH_CPU .* \[\[index\]\] named 'pytorch-cpu' to uv.toml"):
        indexes.locate("pytorch-cpu", {"pytorch-cpu": None}, where="pins/dev-cpu.yaml")


def test_build_fetches_by_index_name_and_file_from_wherever_the_index_is(tmp_path, world, monkeypatch):
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE})
    lock.lock(project, "tiny", unreachable())
    document = lock.load_lock(project, "tiny")
    (wheel,) = document.to_json()["platforms"]["linux/amd64"]
    blob = cache.blob_path(wheel["sha256"], wheel["filename"])

    # From the stack's default location (the HTTP index), through uv.
    blob.unlink()
    assert inputs.fetch_wheels(project, "tiny", document, "linux/amd64")[wheel["filename"]] == blob

    # From a directory with the same file, named by the environment: the lock is unchanged.
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copy(world["pkg"].wheel, mirror)
    monkeypatch.setenv("SERVESTACK_INDEX_LOCAL", str(mirror))
    blob.unlink()
    assert inputs.fetch_wheels(project, "tiny", document, "linux/amd64")[wheel["filename"]].read_bytes() == world["pkg"].wheel.read_bytes()

    # A file whose bytes differ from the lock is refused, naming the file and the index.
    blob.unlink()
    (mirror / wheel["filename"]).write_bytes(b"not the locked wheel")
    with pytest.raises(IntegrityError, match=rf"{wheel['filename']} from index 'local' \({mirror}, from SERVESTACK_INDEX_LOCAL\)"):
        inputs.fetch_wheels(project, "tiny", document, "linux/amd64")
    assert not blob.exists()


def test_upgrade_moves_the_resolution_date_and_says_what_changed(tmp_path, world):
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE})
    lock.lock(project, "tiny", unreachable())
    assert lock.load_lock(project, "tiny").resolved_at is None
    changed = relock.relock(project, "tiny", unreachable(), upgrade=Upgrade(everything=True),
                            now=datetime(2026, 11, 30, 12, 0, tzinfo=UTC)).lines
    assert 'resolved_at: "2026-11-30T12:00:00Z"\n' in (project.pins / "tiny.yaml").read_text()
    assert lock.load_lock(project, "tiny").resolved_at == "2026-11-30T12:00:00Z"
    assert changed == ("resolved at 2026-11-30T12:00:00Z (was None)",)
    assert lockcheck.check(project, "tiny").ok


def test_a_failed_upgrade_leaves_the_stack_file_and_the_lock_as_they_were(tmp_path, world):
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE})
    lock.lock(project, "tiny", unreachable())
    stack_before = (project.pins / "tiny.yaml").read_bytes()
    lock_before = project.lock_file("tiny").read_bytes()
    (project.pins / "tiny.yaml").write_text(stack_before.decode().replace("version: 1.0.0", "version: 9.9.9"))
    stack_before = (project.pins / "tiny.yaml").read_bytes()
    with pytest.raises(ServestackError):
        relock.relock(project, "tiny", unreachable(), upgrade=Upgrade(everything=True))
    assert (project.pins / "tiny.yaml").read_bytes() == stack_before
    assert project.lock_file("tiny").read_bytes() == lock_before


def test_changes_name_versions_and_overlays_that_can_go():
    def wheel(name: str, version: str) -> LockedWheel:
        return LockedWheel(name=name, version=version, filename=f"{name}-{version}-py3-none-any.whl", sha256="0" * 64, size=1, index="pypi")

    def pr(status: str, patch: OverlayPatch | None = None) -> LockedPR:
        return LockedPR(repo="o/r", number=5, package="x", title="t", merge_commit="c" * 40, status=status, patch=patch)

    old = committed_lock(resolved_at="a", platforms={"p": (wheel("x", "1"), wheel("gone", "1"))},
                         pull_requests=(pr("overlay", OverlayPatch(path="pins/patches/o__r-5.diff", sha256="0" * 64, python_only=True,
                                                                   native_files=())),))
    new = committed_lock(resolved_at="b", platforms={"p": (wheel("x", "2"), wheel("new", "3"))},
                         pull_requests=(pr("included"),))
    assert drift.changes(old, new) == [
        "resolved at b (was a)", "p: gone 1 removed (moved anyway: no longer needed by the closure)",
        "p: new 3 added (moved anyway: newly needed by the closure)",
        "p: x 1 -> 2 (moved anyway: the locked version was not kept)",
        "o/r#5: now included upstream; its overlay pins/patches/o__r-5.diff can go",
    ]
