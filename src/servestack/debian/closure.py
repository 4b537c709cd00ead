"""Which Debian packages a base holds: the stack's packages, the essential set, and everything they
depend on, chosen from one suite's Packages index as apt would for a fresh install.

A suite holds one version of each package per architecture, so resolving is choosing among a
dependency's alternatives: one already chosen satisfies it; else the first alternative a real
package satisfies; else the package that provides it with the highest Priority (then by name): mawk, not gawk, for awk.

Nothing here reads a file or the network: `lock/` fetches the signed Release and the Packages
indexes through `sources/debian` and hands their text here, so what a base resolves to depends on
those texts alone and is tested from literal ones.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from debian.debian_support import version_compare

from servestack.debian.debfile import parse_fields
from servestack.errors import ServestackError
from servestack.platforms import PLATFORMS
from servestack.records.lockfile import LockedDeb as Deb

# The root file system is merged-/usr by construction (rootfs.MERGED), which is the fact this package
# declares; without it as a root, `usrmerge | usr-is-merged` would take usrmerge and with it perl.
MERGED_USR_PACKAGE = "usr-is-merged"

_RELATION = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9-]+)?\s*(?:\(\s*(<<|<=|=|>=|>>)\s*([^)\s]+)\s*\))?\s*$")
_PRIORITIES = {"required": 0, "important": 1, "standard": 2, "optional": 3, "extra": 4}
_OPS = {"<<": lambda c: c < 0, "<=": lambda c: c <= 0, "=": lambda c: c == 0, ">=": lambda c: c >= 0, ">>": lambda c: c > 0}


Relation = tuple[str, str | None, str | None]  # name, operator, version


@dataclass(frozen=True, kw_only=True)
class Stanza:
    deb: Deb
    essential: bool
    priority: int  # rank of Priority: required first, as apt prefers among providers
    depends: tuple[tuple[Relation, ...], ...]  # Pre-Depends then Depends: clauses of alternatives
    provides: tuple[tuple[str, str | None], ...]


def _relations(text: str, what: str) -> tuple[tuple[Relation, ...], ...]:
    clauses = []
    for clause in filter(None, (c.strip() for c in text.split(","))):
        alternatives = []
        for alternative in clause.split("|"):
            match = _RELATION.match(alternative)
            if not match:
                raise ServestackError(f"{what}: cannot read the relation {alternative.strip()!r}")
            name, operator, version = match.groups()
            alternatives.append((name, operator, version))
        clauses.append(tuple(alternatives))
    return tuple(clauses)


def parse_index(text: str, what: str) -> dict[str, Stanza]:
    """A Packages index by package name (the highest version where a name appears twice)."""
    found: dict[str, Stanza] = {}
    for block in text.split("\n\n"):
        fields = parse_fields(block)
        if "Package" not in fields:
            continue
        name = fields["Package"]
        where = f"{what}: {name}"
        try:
            deb = Deb(name=name, version=fields["Version"], architecture=fields["Architecture"], size=int(fields["Size"]),
                      sha256=fields["SHA256"], filename=fields["Filename"])
        except KeyError as missing:
            raise ServestackError(f"{where}: no {missing.args[0]} field") from None
        provides = tuple((r[0][0], r[0][2]) for r in _relations(fields.get("Provides", ""), where))
        stanza = Stanza(deb=deb, essential=fields.get("Essential") == "yes",
                        priority=_PRIORITIES.get(fields.get("Priority", ""), len(_PRIORITIES)),
                        depends=_relations(fields.get("Pre-Depends", ""), where) + _relations(fields.get("Depends", ""), where),
                        provides=provides)
        if name not in found or version_compare(deb.version, found[name].deb.version) > 0:
            found[name] = stanza
    return found


class _Index:
    def __init__(self, stanzas: dict[str, Stanza]):
        self.stanzas = stanzas
        self.providers: dict[str, list[tuple[Stanza, str | None]]] = {}
        for stanza in sorted(stanzas.values(), key=lambda s: (s.priority, s.deb.name)):
            for name, version in stanza.provides:
                self.providers.setdefault(name, []).append((stanza, version))

    def candidates(self, relation: Relation) -> list[Stanza]:
        """The packages that satisfy `relation`: the real package first, then providers by priority and name."""
        name, op, version = relation
        found = []
        real = self.stanzas.get(name)
        if real is not None and (op is None or _OPS[op](version_compare(real.deb.version, version))):
            found.append(real)
        for stanza, provided in self.providers.get(name, []):
            # An unversioned Provides satisfies only an unversioned dependency (Debian policy 7.5).
            if op is None or (provided is not None and _OPS[op](version_compare(provided, version))):
                found.append(stanza)
        return found


def resolve(stanzas: dict[str, Stanza], requested: list[str], what: str) -> list[Deb]:
    """The base's packages, sorted by name: every Essential package, `requested`, and their dependencies."""
    index = _Index(stanzas)
    missing = [name for name in requested if name not in stanzas]
    if missing:
        raise ServestackError(f"{what} has no package {', '.join(missing)} (base.debian.packages)")
    roots = sorted(name for name, s in stanzas.items() if s.essential) + list(requested)
    if MERGED_USR_PACKAGE in stanzas:
        roots.append(MERGED_USR_PACKAGE)
    chosen: dict[str, Stanza] = {}
    for name in roots:
        chosen.setdefault(name, stanzas[name])
    queue = deque(chosen.values())
    while queue:
        stanza = queue.popleft()
        for clause in stanza.depends:
            options = [c for alternative in clause for c in index.candidates(alternative)]
            if any(option.deb.name in chosen for option in options):
                continue
            if not options:
                wanted = " | ".join(n + (f" ({op} {v})" if op else "") for n, op, v in clause)
                raise ServestackError(f"{what}: {stanza.deb.name} depends on {wanted}, which no package satisfies")
            pick = options[0]
            chosen[pick.deb.name] = pick
            queue.append(pick)
    return [chosen[name].deb for name in sorted(chosen)]


ARCH = {p.name: p.debian for p in PLATFORMS.values()}


def architecture(platform: str) -> str:
    """The Debian architecture whose Packages index a platform's base is resolved from."""
    if platform not in ARCH:
        raise ServestackError(f"platform {platform}: a Debian base is resolved for {', '.join(ARCH)}")
    return ARCH[platform]
