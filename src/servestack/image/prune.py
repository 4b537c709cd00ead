"""Bounded caches: what the last image builds used is kept; the other layer blobs and installed trees go.

Layer blobs and installed trees can always be made again from the downloaded wheels, and without
pruning they only grow: every lock change adds trees and layers (dev-cpu's set alone is ~5 GB).
After each image build its set (tree directories, layer digests) is recorded in `<cache>/uses/`;
the newest KEEP_BUILDS records stay, and (once there are that many) whatever in `installed/` and `layers/` none of them names
is removed, except what was made or used within GRACE_SECONDS: a build running at the same time on
the same cache (trees and layers are touched when a build reads them) keeps its files. Downloaded
inputs (`blobs/`, `bases/`) are not touched: they are the offline copy of the locks.

The sha256 records in `<cache>/verified/` (one per file ever hashed) go once they cannot answer
again: their file is gone or changed (see verified.stale_records).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from servestack.util import verified
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import cache_home

# Enough for a user switching between a few stacks and branches without rebuilding from scratch.
KEEP_BUILDS = 8
# Longer than any build: a concurrent build's files are never removed under it.
GRACE_SECONDS = 2 * 3600


@dataclass(frozen=True, kw_only=True)
class Pruned:
    removed: int
    freed_bytes: int


def record_use(stack: str, trees: list[Path], digests: list[str], cache: Path | None = None) -> Path:
    """Record what one build used (its installed tree directories and its layer blob digests)."""
    path = (cache or cache_home()) / "uses" / f"{time.time_ns()}-{os.getpid()}-{stack}.json"
    atomic_write_json(path, {"stack": stack, "trees": sorted({t.name for t in trees}), "digests": sorted(set(digests))})
    return path


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if not f.is_dir() or f.is_symlink())


def _remove(path: Path) -> int:
    try:
        size = _size(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:  # another build's prune got there first
        return 0
    return size


def _old(path: Path, now: float) -> bool:
    try:
        return now - path.lstat().st_mtime > GRACE_SECONDS
    except FileNotFoundError:
        return False


def prune(cache: Path | None = None, now: float | None = None) -> Pruned:
    """Remove the layer blobs, layer keys and installed trees that none of the last builds used, then
    the sha256 records (verified.py) that can no longer answer."""
    root = cache or cache_home()
    now = time.time() if now is None else now
    unused = _unused_by_the_last_builds(root, now)
    freed = sum(_remove(p) for p in unused)
    # After the removals above: a record of a layer blob just removed goes too.
    stale = verified.stale_records(root)
    return Pruned(removed=len(unused) + len(stale), freed_bytes=freed + sum(_remove(p) for p in stale))


def _unused_by_the_last_builds(root: Path, now: float) -> list[Path]:
    records = sorted((root / "uses").glob("*.json"), key=lambda p: int(p.name.split("-", 1)[0]))
    if len(records) < KEEP_BUILDS:
        # Until KEEP_BUILDS builds are on record, "not used by the last builds" is not known: a cache
        # made before the records (or by a new servestack) loses nothing on its first builds.
        return []
    for stale in records[:-KEEP_BUILDS]:
        stale.unlink(missing_ok=True)
    trees: set[str] = set()
    digests: set[str] = set()
    for record in records[-KEEP_BUILDS:]:
        try:
            used = json.loads(record.read_text())
        except (OSError, ValueError):
            continue  # being written or removed by another build
        trees.update(used["trees"])
        digests.update(used["digests"])

    doomed: list[Path] = []
    installed = root / "installed"
    if installed.is_dir():
        doomed += [t for t in installed.iterdir() if t.name not in trees and _old(t, now)]
    layers = root / "layers"
    for key in sorted((layers / "keys").glob("*.json")):
        try:
            digest = json.loads(key.read_text())["digest"]
        except (OSError, ValueError, KeyError):
            digest = ""
        if digest not in digests and _old(key, now):
            doomed.append(key)
    blobs = layers / "blobs" / "sha256"
    if blobs.is_dir():
        doomed += [b for b in blobs.iterdir() if f"sha256:{b.name}" not in digests and _old(b, now)]
    if (layers / "tmp").is_dir():
        doomed += [t for t in (layers / "tmp").iterdir() if _old(t, now)]
    return doomed
