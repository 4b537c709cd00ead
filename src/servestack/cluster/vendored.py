"""The vendored sources the cluster tools are built from, and the build cache every tool shares."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

from servestack import settings
from servestack.errors import ClusterToolsMissing
from servestack.util.fsutil import atomic_write_text
from servestack.util.project import state_home

VENDOR_ENV = "SERVESTACK_VENDOR"
PYTHON312_ENV = "SERVESTACK_PYTHON312"
# Bump when a build step below changes: the cache key includes it.
_STEPS_VERSION = "1"




def vendor_dir() -> Path:
    """$SERVESTACK_VENDOR: the directory holding the vendored enroot, pyxis and srt-slurm snapshots."""
    configured = settings.value(VENDOR_ENV)
    if not configured:
        raise ClusterToolsMissing(f"{VENDOR_ENV} is not set (the directory holding the vendored enroot, pyxis "
                                  "and srt-slurm snapshots)")
    return Path(configured)


def vendor_archive(tool: str) -> Path:
    """The one `<tool>-<commit>.tar.gz` in the vendor directory."""
    where = vendor_dir()
    found = sorted(where.glob(f"{tool}-*.tar.gz"))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise ClusterToolsMissing(
            f"{what} {tool}-<commit>.tar.gz in {where} (set {VENDOR_ENV} to the directory holding the "
            f"vendored enroot, pyxis and srt-slurm snapshots)"
        )
    return found[0]


def cache_key(*parts: Path | str) -> str:
    h = hashlib.sha256(_STEPS_VERSION.encode())
    for part in parts:
        h.update(Path(part).read_bytes() if isinstance(part, Path) else part.encode())
    return h.hexdigest()[:16]


def unpack(archive: Path, dest: Path) -> Path:
    """Extract a `git archive` tarball; returns its single top-level directory."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")
    [top] = [p for p in dest.iterdir() if p.is_dir()]
    return top


def built(tool: str, key: str, build: Callable[[Path], None]) -> Path:
    """state_home()/cluster/<tool>-<key>: built once by `build(tmpdir) -> None`, renamed into place."""
    from servestack.services.daemons import exclusive

    home = state_home() / "cluster"
    final = home / f"{tool}-{key}"
    if (final / ".complete").exists():
        return final
    with exclusive(f"cluster-{tool}"):
        if (final / ".complete").exists():
            return final
        home.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(final, ignore_errors=True)
        # Built in place (paths get baked into venvs and configs), marked complete last.
        final.mkdir()
        try:
            build(final)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        (final / ".complete").write_text(key + "\n")
    return final


def executable(path: Path, text: str) -> None:
    atomic_write_text(path, text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def link(target: str | Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)



SYSTEM_BIN = Path("/usr/local/bin")


def install_command(binary: Path) -> None:
    """Put `binary` on the system PATH, as a package would: pyxis runs `enroot start` (and enroot
    its helpers) from slurmstepd, whose PATH is slurmd's, not the job's. Only a link of ours is
    ever replaced."""
    link = SYSTEM_BIN / binary.name
    if link.is_symlink() and Path(os.readlink(link)) == binary:
        return
    if link.exists() and not (link.is_symlink() and str(os.readlink(link)).startswith(str(state_home()))):
        raise ClusterToolsMissing(f"{link} exists and is not servestack's; remove it (enroot is installed "
                                  f"under {state_home() / 'cluster'} and linked there)")
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(binary)
    tmp.replace(link)
