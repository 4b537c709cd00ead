"""The lock's Debian leg: a self-built base's packages, resolved from its suite as the suite is now.

The leg goes down once and comes back once: `sources/debian` fetches the suite's signed Release and
the Packages index of every architecture the stack targets (each checked against that Release),
then `debian/closure`, which does no I/O, reads those texts and chooses the packages.
"""

from __future__ import annotations

from servestack.debian import closure
from servestack.records.lockfile import DebianBase
from servestack.sources import debian

# One process locks every stack (`nox -s lock`), and a bookworm index takes seconds to fetch and
# parse; the Release's sha256 names the index's exact bytes, so a parse is good for as long as it.
_INDEXES: dict[tuple[str, str], dict[str, closure.Stanza]] = {}  # (Release sha256, arch) -> parsed Packages


def _fetch_indexes(release: debian.Release, arches: list[str]) -> dict[str, str]:
    """The Packages text of each architecture not yet parsed for this Release."""
    return {arch: debian.packages(release, arch) for arch in arches if (release.sha256, arch) not in _INDEXES}


def resolve_suite(suite: str, packages: list[str], platforms: list[str]) -> DebianBase:
    """The lock's `base.debian`: the suite's signed Release as it is now, and the packages per platform."""
    release = debian.release(suite)
    arches = {platform: closure.architecture(platform) for platform in platforms}
    texts = _fetch_indexes(release, list(dict.fromkeys(arches.values())))
    for arch, text in texts.items():
        _INDEXES[(release.sha256, arch)] = closure.parse_index(text, f"Debian {suite} {arch} Packages")
    resolved = {
        platform: tuple(closure.resolve(_INDEXES[(release.sha256, arch)], list(packages), f"Debian {suite} {arch}"))
        for platform, arch in arches.items()
    }
    return DebianBase(suite=suite, packages=tuple(sorted(packages)), release_date=release.date,
                      release_sha256=release.sha256, index=debian.INDEX, resolved=resolved)
