"""verified.py: a file is read in full once, then trusted only while its identity (device, inode,
size, mtime, ctime) is unchanged; and build's reuse of overlaid wheels and the model built on it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from fixtures.tinystack import image_project
from servestack import inputs
from servestack.errors import IntegrityError
from servestack.inputs import overlay, tinymodel
from servestack.sources import cache
from servestack.util import verified


@pytest.fixture
def reads(monkeypatch):
    """Counts full reads; files count as old enough to record at once (see `test_a_file_changed_...`)."""
    monkeypatch.setattr(verified, "RACY_NS", 0)
    count = {"n": 0}
    real = verified.sha256_fileobj

    def counting(f):
        count["n"] += 1
        return real(f)

    monkeypatch.setattr(verified, "sha256_fileobj", counting)
    return count


def _file(path: Path, data: bytes) -> tuple[Path, str]:
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_read_once(tmp_path, reads):
    path, digest = _file(tmp_path / "w.whl", b"wheel bytes" * 1000)
    assert verified.sha256(path, root=tmp_path) == digest
    assert verified.sha256(path, root=tmp_path) == digest
    assert verified.sha256(tmp_path / "." / "w.whl", root=tmp_path) == digest  # the same file by another spelling
    assert reads["n"] == 1
    assert verified.sha256(path, root=tmp_path, rehash=True) == digest
    assert reads["n"] == 2


def test_a_same_size_rewrite_is_read_again_and_stops_the_fetch(tmp_path, reads):
    data = b"A" * 4096
    digest = hashlib.sha256(data).hexdigest()
    target = cache.blob_path(digest, "pkg-1.0-py3-none-any.whl", tmp_path)
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    assert cache.fetch("", digest, target.name, root=tmp_path) == target
    assert reads["n"] == 1
    target.write_bytes(b"B" * 4096)  # same size, new content, new mtime
    with pytest.raises(IntegrityError, match=r"pkg-1\.0-py3-none-any\.whl: cached file .* has sha256"):
        cache.fetch("", digest, target.name, root=tmp_path)
    assert reads["n"] == 2


def test_a_rewrite_with_its_old_mtime_put_back_is_still_read_again(tmp_path, reads):
    path, _ = _file(tmp_path / "w.whl", b"A" * 4096)
    verified.sha256(path, root=tmp_path)
    before = os.stat(path)
    path.write_bytes(b"B" * 4096)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as recorded; ctime moved
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert verified.sha256(path, root=tmp_path) == hashlib.sha256(b"B" * 4096).hexdigest()
    assert reads["n"] == 2


def test_a_file_replaced_by_another_is_read_again(tmp_path, reads):
    path, _ = _file(tmp_path / "w.whl", b"A" * 4096)
    verified.sha256(path, root=tmp_path)
    stat = os.stat(path)
    other, digest = _file(tmp_path / "other", b"C" * 4096)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, path)  # another inode under the same name, same size and mtime
    assert verified.sha256(path, root=tmp_path) == digest
    assert reads["n"] == 2


@pytest.mark.parametrize("record", [b"", b"{not json", b"[]", b'{"path": 1}', None])
def test_a_missing_or_malformed_record_means_a_full_read(tmp_path, reads, record):
    path, digest = _file(tmp_path / "w.whl", b"wheel" * 100)
    verified.sha256(path, root=tmp_path)
    (written,) = (tmp_path / "verified").iterdir()
    if record is None:
        written.unlink()
    else:
        written.write_bytes(record)
    assert verified.sha256(path, root=tmp_path) == digest
    assert reads["n"] == 2
    assert json.loads(written.read_bytes())["sha256"] == digest  # and the record is good again


def test_a_record_for_another_path_is_not_taken(tmp_path, reads):
    path, digest = _file(tmp_path / "w.whl", b"wheel" * 100)
    verified.sha256(path, root=tmp_path)
    (written,) = (tmp_path / "verified").iterdir()
    record = json.loads(written.read_bytes())
    written.write_text(json.dumps({**record, "path": str(tmp_path / "elsewhere")}))
    assert verified.sha256(path, root=tmp_path) == digest
    assert reads["n"] == 2


def test_a_file_changed_recently_or_while_read_is_not_recorded(tmp_path, monkeypatch):
    path, digest = _file(tmp_path / "w.whl", b"fresh" * 100)
    assert verified.sha256(path, root=tmp_path) == digest  # RACY_NS as shipped: written just now
    assert not (tmp_path / "verified").exists()

    monkeypatch.setattr(verified, "RACY_NS", 0)
    real = verified.sha256_fileobj

    def changing_while_read(f):
        digest = real(f)
        with open(path, "ab") as out:
            out.write(b"more")
        return digest

    monkeypatch.setattr(verified, "sha256_fileobj", changing_while_read)
    verified.sha256(path, root=tmp_path)
    assert not (tmp_path / "verified").exists()


# --------------------------------------------------------------------------- build's outputs


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_build_reuses_the_overlaid_wheel_and_model_and_remakes_a_tampered_one(tmp_path, world, isolated_cache, monkeypatch):
    project = image_project(tmp_path / "p", world)
    first = json.loads(inputs.build(project, "tinyimg").read_text())
    made = {"overlay": 0, "model": 0}
    apply, make = overlay.apply_overlays, tinymodel.make_model

    def counted(name, fn):
        def call(*args, **kwargs):
            made[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(overlay, "apply_overlays", counted("overlay", apply))
    monkeypatch.setattr(tinymodel, "make_model", counted("model", make))
    assert json.loads(inputs.build(project, "tinyimg").read_text()) == first
    assert made == {"overlay": 0, "model": 0}

    (applied,) = first["overlays"]
    wheel = Path(applied["path"])
    wheel.write_bytes(bytes(wheel.stat().st_size))  # same size, other bytes
    config = Path(first["model"]["path"]) / "config.json"
    config.write_text(config.read_text().replace("128", "129"))
    assert json.loads(inputs.build(project, "tinyimg").read_text()) == first
    assert made == {"overlay": 1, "model": 1}
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == applied["wheel"]["sha256"]


def test_an_edited_patch_stops_the_build_even_when_its_overlay_was_made(tmp_path, world, isolated_cache):
    project = image_project(tmp_path / "p", world)
    inputs.build(project, "tinyimg")
    (patch,) = (project.root / "pins" / "patches").glob("*.diff")
    patch.write_text(patch.read_text() + "\n")
    with pytest.raises(Exception, match="sha256"):
        inputs.build(project, "tinyimg")


def test_rehash_reads_every_wheel_and_made_output_in_full(tmp_path, world, isolated_cache, reads):
    project = image_project(tmp_path / "p", world)
    inputs.build(project, "tinyimg")
    inputs.build(project, "tinyimg")
    before = reads["n"]
    inputs.build(project, "tinyimg")
    assert reads["n"] == before  # all remembered: nothing read in full
    inputs.build(project, "tinyimg", rehash=True)
    # the wheel twice (fetched, and as the overlay's base), the overlaid wheel, the model's five files
    assert reads["n"] - before == 8
