"""The Debian base's root file system for one platform, from the lock alone.

Its .deb files are fetched by sha256 into the content-addressed cache (from wherever the index
named in the lock is configured to be: the live archive, a snapshot, a directory), so a base locked
before its suite moved on still builds, as long as some index serves those files. The tarball is
kept under a name that its packages, its date and this assembly recipe decide.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from servestack.debian import dpkgdb, scripts
from servestack.debian.closure import ARCH
from servestack.debian.rootfs import Root, merged_usr, read_packages, unpack, write_tar
from servestack.errors import ServestackError
from servestack.platforms import PLATFORMS
from servestack.records.lockfile import DebianBase, LockedDeb
from servestack.sources import cache
from servestack.util import source_closure
from servestack.util.fsutil import canonical_json, sha256_bytes
from servestack.util.project import cache_home

log = logging.getLogger("servestack.image")


def fetch_debs(base: DebianBase, platform: str) -> list[Path]:
    """Every .deb of the platform's base in the cache, verified against the lock's sha256."""
    from servestack.sources import debian

    debs = _debs(base, platform)
    archive = debian.archive()  # read once: it may come from apt's sources files

    def one(deb: LockedDeb) -> Path:
        return cache.fetch(f"{archive}/{deb.filename}", deb.sha256, deb.filename.rsplit("/", 1)[-1],
                           origin=f"index {base.index!r} ({archive})")

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, debs))


def _debs(base: DebianBase, platform: str) -> tuple[LockedDeb, ...]:
    debs = base.debs(platform)
    if not debs:
        raise ServestackError(f"the lock's base.debian.resolved has no {platform} packages; re-run `nox -s lock`")
    return debs


def tarball(base: DebianBase, platform: str) -> Path:
    """The base's root file system as a tar, assembled once per package set."""
    debs = _debs(base, platform)
    code = source_closure.closure_hash([__name__])  # an assembly by other code is another base
    key = sha256_bytes(canonical_json({"debs": [d.sha256 for d in debs], "epoch": base.release_date,
                                       "code": code}).encode())[:24]
    out = cache_home() / "bases" / f"{base.suite}-{ARCH[platform]}-{key}.tar"
    if out.exists():
        return out
    started = time.monotonic()
    paths = fetch_debs(base, platform)
    fetched = time.monotonic()
    done = assemble(paths, ARCH[platform], base.release_date, out)
    log.info("base %s: %d packages, %.1f MB: fetched in %.1f s, assembled in %.1f s", platform, len(debs),
             sum(d.size for d in debs) / 1e6, fetched - started, time.monotonic() - fetched)
    for line in done:
        log.info("base %s: %s", platform, line)
    return out


MACHINES = {p.debian: p.elf_machine for p in PLATFORMS.values()}  # Debian architecture -> ELF e_machine


def assemble(paths: list[Path], arch: str, epoch: int, out: Path) -> list[str]:
    """The base from its .deb files, written to `out`; returns what was done in place of the maintainer
    scripts, one line each."""
    if arch not in MACHINES:
        raise ServestackError(f"Debian architecture {arch!r}: a base is assembled for {', '.join(MACHINES)}")
    packages = read_packages(paths)
    root = Root(epoch=epoch)
    merged_usr(root, packages)
    listed = {package.name: unpack(root, package) for package in packages}
    triggers = dpkgdb.write(root, packages, listed, arch)
    done = scripts.apply(root, packages, MACHINES[arch])
    write_tar(root, out)
    return [f"dpkg: {len(packages)} packages configured, triggers registered: {'; '.join(triggers)}"] + done


def interpreter_version(base: DebianBase, platform: str, python: str) -> str:
    """The upstream version (X.Y.Z) of python<X.Y>-minimal, the package that ships the interpreter:
    3.11.2 for 3.11.2-6+deb12u8."""
    package = f"python{python}-minimal"
    deb = next((d for d in base.debs(platform) if d.name == package), None)
    if deb is None:
        raise ServestackError(f"the lock's Debian base has no {package} for {platform}: the image's "
                              f"python{python} (the lock's `python`) must come from the base's packages")
    version = re.match(r"(?:\d+:)?(\d+\.\d+\.\d+)", deb.version)
    if version is None:
        raise ServestackError(f"{package} has Version {deb.version!r}; expected X.Y.Z-<revision>")
    return version.group(1)
