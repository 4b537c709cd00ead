"""A file's sha256, read in full once and then remembered by the file's identity.

Every build checks every cached wheel against the lock; reading them all (4 GB for dev-cpu) cost a
no-op build 2-3 s. After a full read, a record under `<cache>/verified/` keeps the sha256 found,
with the identity the file had while it was read: device, inode, size, mtime_ns and ctime_ns. The
record answers only while all five still match, so any write (mtime, ctime), replacement (inode),
truncation (size), or an mtime set back by hand (ctime still moves) means a full read again; a
missing, unreadable or malformed record too. What a record cannot see is a change that keeps all
five, i.e. the disk itself rotting under the filesystem: `--rehash` reads everything.

A file changed within the same timestamp tick as its hashing keeps its stat; so a file whose mtime
or ctime is less than RACY_NS old when its read starts is hashed but not recorded (git's "racily
clean" rule): it is read again next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from servestack.util.fsutil import atomic_write_bytes, sha256_fileobj
from servestack.util.project import cache_home

RACY_NS = 2_000_000_000
RECORDS = "verified"  # under the cache


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _record_path(path: str, root: Path | None) -> Path:
    return (root or cache_home()) / RECORDS / f"{hashlib.sha256(path.encode()).hexdigest()[:40]}.json"


def _remembered(record: Path, path: str, identity: list[int]) -> str | None:
    try:
        data = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("path") != path or data.get("identity") != identity:
        return None
    digest = data.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def stale_records(root: Path) -> list[Path]:
    """The records under cache `root` that can no longer answer: their file is gone or has another
    identity (an identity never comes back: ctime only moves forward), or they are malformed.
    Without pruning (prune.py) they only grow, one for every file ever hashed at that path's last state."""
    stale = []
    for record in sorted((root / RECORDS).glob("*.json")):
        try:
            path = json.loads(record.read_bytes()).get("path")
            current = isinstance(path, str) and _remembered(record, path, _identity(os.stat(path))) is not None
        except (OSError, ValueError, AttributeError):  # the file is gone; the record is unreadable or not an object
            current = False
        if not current:
            stale.append(record)
    return stale


def sha256(path: Path, *, root: Path | None = None, rehash: bool = False) -> str:
    """The file's sha256: remembered if its identity is unchanged since a full read, else read in full
    (and remembered). `root` is the cache holding the records; `rehash` ignores them."""
    name = os.path.abspath(path)
    record = _record_path(name, root)
    if not rehash:
        digest = _remembered(record, name, _identity(os.stat(name)))
        if digest is not None:
            return digest
    started = time.time_ns()
    with open(name, "rb") as f:
        before = os.fstat(f.fileno())
        digest = sha256_fileobj(f)
        after = os.fstat(f.fileno())
    # Changed while read, or so recently changed that a change to come could keep its stat: not recorded.
    if _identity(before) == _identity(after) and max(after.st_mtime_ns, after.st_ctime_ns) < started - RACY_NS:
        # Not fsync'd: a record lost in a crash only means one more full read.
        atomic_write_bytes(record, json.dumps({"path": name, "identity": _identity(after), "sha256": digest}).encode(),
                           durable=False)
    return digest


def reuse(record: Path, key: str, *, root: Path | None = None, rehash: bool = False) -> dict | None:
    """What `remember` stored at `record` for `key`, if every file it lists still has the sha256 it had
    then (`rehash`: read in full); else None (the caller makes its outputs again)."""
    try:
        data = json.loads(Path(record).read_bytes())
        if data["key"] != key:
            return None
        files, payload = data["files"], data["payload"]
        if not all(os.path.isfile(p) and sha256(Path(p), root=root, rehash=rehash) == digest for p, digest in files.items()):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return payload


def remember(record: Path, key: str, files: list[Path], payload: dict, *, root: Path | None = None) -> None:
    """Record that `files` (each read in full now) were made for `key`, with `payload` for `reuse`."""
    digests = {os.path.abspath(p): sha256(p, root=root, rehash=True) for p in files}
    atomic_write_bytes(Path(record), json.dumps({"key": key, "files": digests, "payload": payload}).encode())
