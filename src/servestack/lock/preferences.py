"""What a relock may move: the previous lock's versions are the resolver's preferences.

A stack's `resolved_at` alone does not make a relock stable: an index may show a release dated
before it only later (a mirror catching up), or serve no upload times at all, and then the newest
release wins again. So every version the previous lock holds is handed to uv as a preference (uv
reads preferences from an existing output file, and its pylock.toml output file is one: a
`[[packages]]` name and version is all it reads). Preferences, not `pkg==ver` constraints: a
constraint would make a stack whose changed entry needs a newer dependency unsatisfiable, where a
preference gives way exactly where the new closure needs it, and nowhere else.

What may move on purpose: a package the user names to `lock --upgrade` (or every package, with
no name), and a package whose stack entry changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from servestack.records.lockfile import Lock
from servestack.wheels import normalize


@dataclass(frozen=True, kw_only=True)
class Upgrade:
    """What the user asked to take newer releases of: nothing (a plain relock), everything, or the named."""

    everything: bool = False
    packages: tuple[str, ...] = ()  # normalized names

    @classmethod
    def of(cls, names: list[str] | None) -> Upgrade:
        """`lock --upgrade` gives [] (everything), `--upgrade A B` the names, no flag None (nothing)."""
        if names is None:
            return cls()
        return cls(everything=not names, packages=tuple(sorted({normalize(n) for n in names})))

    @property
    def asked(self) -> bool:
        return self.everything or bool(self.packages)

    def covers(self, name: str) -> bool:
        return self.everything or normalize(name) in self.packages

    def describe(self) -> str:
        return "lock --upgrade" + ("" if self.everything else " " + " ".join(self.packages))


def changed_entries(old: Lock | None, requirements: dict[str, str]) -> dict[str, str]:
    """The stack's packages whose entry is new or changed since OLD (name -> what it was, or 'new')."""
    if old is None:
        return {}
    return {name: (old.packages[name].requirement if name in old.packages else "new")
            for name, requirement in requirements.items()
            if name not in old.packages or old.packages[name].requirement != requirement}


def preferred(old: Lock | None, platform: str, *, upgrade: Upgrade, changed: dict[str, str]) -> dict[str, str]:
    """The versions a resolution for PLATFORM should keep: name -> version.

    A platform the previous lock did not have takes the versions its other platforms hold, so that a
    stack that gains linux/amd64 serves the same releases on x86 as on arm64."""
    if old is None or upgrade.everything:
        return {}
    held = [platform] if platform in old.platforms else sorted(old.platforms)
    versions: dict[str, str] = {}
    for each in held:
        for w in old.wheels(each):
            if not upgrade.covers(w.name) and normalize(w.name) not in changed:
                versions.setdefault(normalize(w.name), w.version)
    return versions
