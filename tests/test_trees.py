"""Installed trees in the cache: a tree is there whole or not at all."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servestack.bytecode import BytecodePool
from servestack.errors import ServestackError
from servestack.trees import installed_tree
from servestack.wheels import pack_wheel


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "unpacked"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "__init__.py").write_text("VALUE = 1\n")
    (root / "tiny" / "more.py").write_text("OTHER = 2\n")
    info = root / "tiny-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    wheel = pack_wheel(root, tmp_path / "wheels", epoch=1_700_000_000)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


def _compiler(tmp_path: Path, does: str) -> str:
    script = tmp_path / "python3.11"
    script.write_text(f"#!/bin/sh\n{does}\n")
    script.chmod(0o755)
    return str(script)


def test_a_tree_whose_bytecode_fails_leaves_nothing_in_the_cache(tmp_path, cache):
    wheel, sha256 = _wheel(tmp_path)
    dying = _compiler(tmp_path, "read line\necho 'compiler crashed' >&2\nexit 3")
    with BytecodePool(dying, 1) as pool:
        with pytest.raises(ServestackError, match="exited with 3 while compiling"):
            installed_tree(wheel, sha256, "3.11", pool)
    assert list((cache / "installed").iterdir()) == []  # the wheel was installed, then removed with its staging


def test_a_tree_under_way_when_the_build_is_interrupted_leaves_nothing_in_the_cache(tmp_path, cache):
    """On Ctrl-C install_all stops the compilers (BytecodePool.stop): the tree being made fails and goes."""
    wheel, sha256 = _wheel(tmp_path)
    said = tmp_path / "read-a-file"
    os.mkfifo(said)
    wedged = _compiler(tmp_path, f"read line\necho read > '{said}'\nexec sleep 3600")
    with BytecodePool(wedged, 1) as pool, ThreadPoolExecutor(max_workers=1) as making:
        tree = making.submit(installed_tree, wheel, sha256, "3.11", pool)
        with open(said) as fifo:  # the wheel is installed and its bytecode under way
            assert fifo.read() == "read\n"
        pool.stop()
        with pytest.raises(ServestackError, match="the build stopped"):
            tree.result(timeout=60)
    assert list((cache / "installed").iterdir()) == []


def test_a_made_tree_is_renamed_into_place_whole(tmp_path, cache):
    wheel, sha256 = _wheel(tmp_path)
    tree = installed_tree(wheel, sha256, "3.11", None)
    assert tree.made and [p.name for p in (cache / "installed").iterdir()] == [tree.path.name]
    assert {e.path for e in tree.entries} >= {"opt/venv/lib/python3.11/site-packages/tiny/more.py"}
    assert (tree.path / "entries.json").is_file() and (tree.path / "timing.json").is_file()
