"""`lock`, `lock --upgrade [PACKAGE...]` and `lock --check --online`: relocking, and asking what a
relock would do, in the words of servestack.lock.drift.

A plain relock keeps every locked version (servestack.lock.preferences); only `--upgrade` takes newer
releases, and it moves the stack's `resolved_at` to the moment it resolves, so that date is always
one that has passed (servestack.lock.resolution_date).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from servestack import lock
from servestack.errors import ServestackError
from servestack.lock import drift
from servestack.lock.drift import Move
from servestack.lock.preferences import Upgrade
from servestack.lock.resolution_date import set_resolved_at, stamp
from servestack.records.lockfile import Lock, read_lock
from servestack.util.fsutil import atomic_write_text
from servestack.util.project import Project

if TYPE_CHECKING:
    from servestack.sources.github import GitHub


@dataclass(frozen=True, kw_only=True)
class Relocked:
    path: Path
    moves: tuple[Move, ...]
    lines: tuple[str, ...]  # every change in words (drift.changes)

    def summary(self, project: Project) -> list[str]:
        """What `lock` prints: the changes, a warning for each index the date could not hold, the counts."""
        document = read_lock(self.path)
        statuses: dict[str, int] = {}
        for pr in document.pull_requests:
            statuses[pr.status] = statuses.get(pr.status, 0) + 1
        wheels = {p: len(ws) for p, ws in document.platforms.items()}
        return ([f"  {line}" for line in self.lines]
                + [f"warning: index {entry.index!r} {entry.why}" for entry in document.undated_indexes]
                + [f"wrote {self.path.relative_to(project.root)}: wheels {wheels}, pull requests {statuses or 'none'}"])


def relock(project: Project, stack_name: str, github: GitHub | None = None, *, upgrade: Upgrade = Upgrade(),
           now: datetime | None = None) -> Relocked:
    """Relock; with UPGRADE asked, `resolved_at` moves to NOW first. On failure the stack file and the
    lock are left as they were."""
    stack_file = project.stack_file(stack_name)
    text = stack_file.read_text()
    if upgrade.asked:
        atomic_write_text(stack_file, set_resolved_at(text, stamp(now)))
    try:
        # Only upgrading everything reads the Debian suite again: a named upgrade is about wheels.
        resolved = lock.resolve(project, stack_name, github, refresh_base=upgrade.everything, upgrade=upgrade, now=now)
        path = lock.write(project, stack_name, resolved)
    except BaseException:
        if upgrade.asked:
            atomic_write_text(stack_file, text)
        raise
    lines = drift.changes(resolved["previous"], resolved["lock"], resolved["moves"])
    return Relocked(path=path, moves=resolved["moves"], lines=tuple(lines))


@dataclass(frozen=True, kw_only=True)
class Online:
    """What relocking here, today, would do."""

    relock: tuple[Move, ...]  # a plain relock: anything here is drift
    upgrade: tuple[Move, ...]  # what `lock --upgrade` would take

    @property
    def ok(self) -> bool:
        return not self.relock

    def lines(self) -> list[str]:
        said = [f"a relock would change: {m.line()}" for m in self.relock] or ["a relock would change nothing"]
        said += [f"--upgrade would take: {m.line()}" for m in self.upgrade] or ["--upgrade would take nothing"]
        return said


def drift_now(project: Project, stack_name: str, github: GitHub | None = None) -> tuple[Move, ...]:
    """What a plain relock would move, each unasked move's cause looked up at its index."""
    resolved = lock.resolve(project, stack_name, github)
    return tuple(_with_cause(project, stack_name, m, resolved["previous"]) if not m.asked else m
                 for m in resolved["moves"])


def check_online(project: Project, stack_name: str, github: GitHub | None = None,
                 now: datetime | None = None) -> Online:
    """Resolve twice without writing anything: as a plain relock, and as `--upgrade` would (the
    Debian base is not read again: `--upgrade` alone does that)."""
    upgraded = lock.resolve(project, stack_name, github, upgrade=Upgrade(everything=True), resolved_at=stamp(now),
                            now=now)
    return Online(relock=drift_now(project, stack_name, github), upgrade=upgraded["moves"])


def _with_cause(project: Project, stack_name: str, move: Move, previous: Lock | None) -> Move:
    """A version the resolver did not keep: is its locked file still on its index (yanked or removed
    files are not offered), or did the closure need another?"""
    from dataclasses import replace

    from servestack.records.stack import load_stack
    from servestack.sources import pypi

    if previous is None or move.before is None or move.before == move.after:
        return move
    wheel = next((w for w in previous.wheels(move.platform) if w.name == move.name), None)
    if wheel is None:
        return move
    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)
    location = next(loc for loc in pypi.index_locations(stack, stack_file) if loc.name == wheel.index)
    try:
        pypi.wheel_urls(location, [wheel], move.platform, stack.python)
    except ServestackError:
        return replace(move, reason=f"{location.describe()} no longer offers the locked {wheel.filename} "
                                    "(yanked or removed)")
    return move
