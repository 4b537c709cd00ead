"""Command-line tools users already trust, run from Debian trixie packages beside the bookworm system.

cosign and oras are Go binaries that need only libc: `apt-get download` fetches the .deb from the
machine's configured trixie source (set up by .ci/bootstrap) and `dpkg-deb -x` unpacks it into the
cache, so nothing is installed system-wide and nothing else is pulled in.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from servestack.errors import ServestackError
from servestack.util import proc
from servestack.util.project import cache_home

TOOLS = {"cosign": "cosign", "oras": "oras"}  # binary -> Debian package


def trixie_tool(binary: str) -> Path:
    """The path of BINARY from its trixie package, downloading and unpacking it on first use."""
    package = TOOLS[binary]
    root = cache_home() / "tools"
    for unpacked in sorted(root.glob(f"{package}_*")):
        if (unpacked / "usr" / "bin" / binary).is_file():
            return unpacked / "usr" / "bin" / binary
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        proc.run(["apt-get", "download", f"{package}/trixie"], cwd=Path(tmp), timeout=600)
        debs = list(Path(tmp).glob(f"{package}_*.deb"))
        if not debs:
            raise ServestackError(f"`apt-get download {package}/trixie` wrote no .deb; is the trixie source set up "
                                  f"(run .ci/bootstrap)?")
        staging = Path(tmp) / "unpacked"
        proc.run(["dpkg-deb", "-x", str(debs[0]), str(staging)], timeout=600)
        target = root / debs[0].stem
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return target / "usr" / "bin" / binary
