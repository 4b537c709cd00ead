"""Cache pruning: what the last builds used stays, the rest of the layer and tree caches goes."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from servestack.image import prune, trees
from servestack.util.fsutil import atomic_write_json


def _tree(cache, name, mtime):
    tree = cache / "installed" / name  # as trees.installed_tree leaves one: a pack and its entry list
    tree.mkdir(parents=True)
    (tree / trees.PACK).write_bytes(b"x" * 1000)
    atomic_write_json(tree / "entries.json", [["f.py", "file", 0o644, 1000, "0" * 64, "", trees.PACK, 0]])
    os.utime(tree, (mtime, mtime))
    return tree


def _layer(cache, key, digest_hex, mtime):
    blob = cache / "layers" / "blobs" / "sha256" / digest_hex
    blob.mkdir(parents=True)
    (blob / "layer.tar.zst").write_bytes(b"z" * 500)
    atomic_write_json(cache / "layers" / "keys" / f"{key}.json", {"key": key, "digest": f"sha256:{digest_hex}"})
    for path in (blob, cache / "layers" / "keys" / f"{key}.json"):
        os.utime(path, (mtime, mtime))
    return blob


def test_only_what_none_of_the_last_builds_used_is_removed_and_never_a_fresh_file(tmp_path):
    cache = tmp_path / "cache"
    old = time.time() - 10 * prune.GRACE_SECONDS
    kept_tree, gone_tree = _tree(cache, "aaa-py3.11.7-pyc3", old), _tree(cache, "bbb-py3.11.7-pyc3", old)
    fresh_tree = _tree(cache, "ccc-py3.11.7-pyc3", time.time())  # a concurrent build is making or reading it
    kept_blob, gone_blob = _layer(cache, "k1", "11" * 32, old), _layer(cache, "k2", "22" * 32, old)
    (cache / "blobs").mkdir()
    (cache / "blobs" / "wheel.whl").write_bytes(b"w")  # a downloaded input: never pruned
    os.utime(cache / "blobs" / "wheel.whl", (old, old))

    # The first records: nothing is known about what older builds used, so nothing goes.
    for _ in range(prune.KEEP_BUILDS - 1):
        prune.record_use("dev-cpu", [kept_tree], [f"sha256:{'11' * 32}"], cache)
    assert prune.prune(cache) == prune.Pruned(removed=0, freed_bytes=0)
    assert gone_tree.exists() and gone_blob.exists()

    prune.record_use("other", [gone_tree], [f"sha256:{'22' * 32}"], cache)  # the oldest of the kept records
    for _ in range(prune.KEEP_BUILDS):
        assert prune.prune(cache).removed == 0  # ...until KEEP_BUILDS newer builds did not use it
        prune.record_use("dev-cpu", [kept_tree], [f"sha256:{'11' * 32}"], cache)
    key_size = (cache / "layers" / "keys" / "k2.json").stat().st_size
    tree_size = sum(f.stat().st_size for f in gone_tree.iterdir())
    left_over = _tree(cache, trees.staging_path(kept_tree).name, old)  # a build killed while making kept_tree
    result = prune.prune(cache)

    assert not gone_tree.exists() and not gone_blob.exists() and not (cache / "layers" / "keys" / "k2.json").exists()
    assert not left_over.exists()
    assert kept_tree.exists() and kept_blob.exists() and (cache / "layers" / "keys" / "k1.json").exists()
    assert fresh_tree.exists() and (cache / "blobs" / "wheel.whl").exists()
    assert result == prune.Pruned(removed=4, freed_bytes=2 * tree_size + 500 + key_size)
    assert len(list((cache / "uses").glob("*.json"))) == prune.KEEP_BUILDS


def test_a_cached_layer_and_tree_are_marked_used_when_a_build_reads_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    from servestack.image import layers

    src = tmp_path / "f.txt"
    src.write_text("hello\n")
    blob = layers.write_layer([layers.entry_for(src, "f.txt")], 1_700_000_000)
    old = time.time() - 10 * prune.GRACE_SECONDS
    key_file = tmp_path / "cache" / "layers" / "keys" / f"{blob.key}.json"
    for path in (key_file, blob.path.parent):
        os.utime(path, (old, old))
    assert layers.cached(blob.key) is not None
    assert all(time.time() - p.stat().st_mtime < 60 for p in (key_file, blob.path.parent))


def test_sha256_records_go_once_their_file_is_gone_or_changed(tmp_path, monkeypatch):
    """`<cache>/verified/` keeps one record per file ever hashed; one whose file is removed or
    rewritten can never answer again (verified.py), so pruning drops it, even before any build is on
    record (it does not depend on what builds used)."""
    from servestack.util import verified

    monkeypatch.setattr(verified, "RACY_NS", 0)  # the files count as old enough to be recorded at once
    cache = tmp_path / "cache"
    kept, rewritten, removed = (tmp_path / name for name in ("kept.whl", "rewritten.whl", "removed.whl"))
    for wheel in (kept, rewritten, removed):
        wheel.write_bytes(wheel.name.encode() * 100)
        verified.sha256(wheel, root=cache)
    rewritten.write_bytes(b"another build of it")
    removed.unlink()
    (cache / "verified" / "0123.json").write_text('{"path": ')  # cut short by a crash

    result = prune.prune(cache)

    left = sorted((cache / "verified").iterdir())
    assert len(left) == 1, [r.name for r in left]
    assert [json.loads(r.read_text())["path"] for r in left] == [str(kept)]
    assert result.removed == 3
    # The record that stays still answers: the kept wheel is not read again.
    monkeypatch.setattr(verified, "sha256_fileobj", lambda f: pytest.fail("kept.whl was read again"))
    assert verified.sha256(kept, root=cache) == hashlib.sha256(b"kept.whl" * 100).hexdigest()
