"""The Debian archive a self-built base comes from.

The mirror is whatever this machine's apt uses (never written into the repo or the lock); what the
lock records is the suite's signed Release file: its date and sha256 identify the archive state
the base was built from, so a build can tell when the mirror has moved on.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path

from ..errors import ServestackError
from . import http

SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))


@dataclass(frozen=True)
class Release:
    suite: str
    date: int
    sha256: str


def mirror() -> str:
    """The Debian archive URL this machine's apt is configured with."""
    candidates: list[str] = []
    for source in SOURCES:
        files = sorted(source.glob("*.sources")) + sorted(source.glob("*.list")) if source.is_dir() else [source]
        for file in files:
            if not file.is_file():
                continue
            text = file.read_text()
            candidates += re.findall(r"^URIs:\s*(\S+)", text, re.M)
            candidates += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M)
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    raise ServestackError("no Debian archive found in /etc/apt/sources.list.d or /etc/apt/sources.list")


def release(suite: str) -> Release:
    url = f"{mirror()}/dists/{suite}/InRelease"
    response = http.get(http.session(), url, what=f"Debian {suite} Release file")
    if response.status_code != 200:
        raise ServestackError(f"Debian {suite} Release file: HTTP {response.status_code}")
    match = re.search(r"^Date:\s*(.+)$", response.text, re.M)
    if not match:
        raise ServestackError(f"Debian {suite} Release file has no Date field")
    return Release(suite, int(parsedate_to_datetime(match.group(1)).timestamp()), hashlib.sha256(response.content).hexdigest())
