"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """`durable`: on disk before it replaces the old file (fsync). Without it (records that only save
    work, whose readers take a malformed one as missing) a running reader still never sees half a
    file, but a machine crash may leave the new one empty or lost."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def canonical_json(value: Any) -> str:
    """The one JSON spelling used for every artifact: sorted keys, stable indentation."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, canonical_json(value))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_fileobj(f: io.BufferedIOBase) -> str:
    return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_fileobj(f)
