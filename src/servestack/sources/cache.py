"""A content-addressed cache of downloaded inputs: every file is verified against its sha256 before use."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from servestack.errors import IntegrityError, ServestackError
from servestack.util import verified
from servestack.util.fsutil import sha256_file
from servestack.util.project import cache_home


def blob_path(sha256: str, filename: str, root: Path | None = None) -> Path:
    """`blobs/sha256/<hash>/<filename>`: addressed by content, but keeping the name tools read (wheels)."""
    return (root or cache_home()) / "blobs" / "sha256" / sha256 / filename


def verify(path: Path, sha256: str, name: str, root: Path | None = None, rehash: bool = False,
           authority: str = "the lock") -> None:
    """`path` has `sha256`: read in full unless unchanged since a full read found it (verified.py).
    `authority`: what gave the sha256, for the error."""
    actual = verified.sha256(path, root=root, rehash=rehash)
    if actual != sha256:
        raise IntegrityError(f"{name}: cached file {path} has sha256 {actual}, {authority} says {sha256}; "
                             "delete it and rerun")


def fetch(url: str, sha256: str, name: str, root: Path | None = None, origin: str = "", rehash: bool = False,
          authority: str = "the lock") -> Path:
    """The verified local copy of `url` (saved as `name`), downloaded once, re-verified on every use
    (`rehash`: read in full even when unchanged since the last full read).
    `origin` (e.g. "index 'pypi'") names where it came from in an integrity error."""
    target = blob_path(sha256, name, root)
    if target.exists():
        verify(target, sha256, name, root, rehash, authority)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            parsed = urlparse(url)
            if parsed.scheme == "file":
                with open(unquote(parsed.path), "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
            else:
                from servestack.sources import http  # requests: imported only when something is downloaded

                response = http.get(http.session(), url, what=name, stream=True, timeout=120)
                if response.status_code != 200:
                    raise ServestackError(f"{name}: HTTP {response.status_code} from {url}")
                for chunk in response.iter_content(1 << 20):
                    out.write(chunk)
        actual = sha256_file(tmp)
        if actual != sha256:
            source = f" from {origin}" if origin else ""
            raise IntegrityError(f"{name}{source}: {url} has sha256 {actual}, {authority} says {sha256}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
