"""What moved between two locks, and why: one vocabulary for `lock`, `lock --upgrade`,
`lock --check --online` and `bump`.

Each move is either asked for (`lock --upgrade`, all or by name; a changed stack entry) or moved
anyway (the closure needed it, the index no longer offers the locked file, a file's hash or index
changed). A plain relock that moves anything anyway is what the lock exists to prevent, so the
difference is always shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from servestack.lock.preferences import Upgrade
from servestack.records.codec import Record
from servestack.records.lockfile import DebianBase, Lock, LockedWheel
from servestack.wheels import normalize


@dataclass(frozen=True, kw_only=True)
class Move(Record):
    platform: str
    name: str
    before: str | None  # the locked version; None: newly in the closure
    after: str | None  # None: no longer in the closure
    reason: str
    asked: bool

    def line(self) -> str:
        if self.after is None:
            what = f"{self.name} {self.before} removed"
        elif self.before is None:
            what = f"{self.name} {self.after} added"
        elif self.before == self.after:
            what = f"{self.name} {self.after}"
        else:
            what = f"{self.name} {self.before} -> {self.after}"
        return f"{self.platform}: {what} ({'asked' if self.asked else 'moved anyway'}: {self.reason})"


def _same_file_moved(platform: str, was: LockedWheel, now: LockedWheel) -> Move | None:
    name = normalize(now.name)
    if (was.filename, was.sha256) != (now.filename, now.sha256):
        return Move(platform=platform, name=name, before=was.version, after=now.version, asked=False,
                    reason=f"same version, another file: {was.filename} sha256 {was.sha256[:12]} -> "
                           f"{now.filename} sha256 {now.sha256[:12]} (a changed hash)")
    if was.index != now.index:
        return Move(platform=platform, name=name, before=was.version, after=now.version, asked=False,
                    reason=f"moved index: {was.index} -> {now.index}")
    return None


def moves(old: Lock | None, new: Lock, *, upgrade: Upgrade = Upgrade(), changed: dict[str, str] | None = None
          ) -> tuple[Move, ...]:
    """Every wheel that differs between OLD and NEW, with its reason; CHANGED: stack entries new or
    changed (name -> what it was)."""
    if old is None:
        return ()
    changed = changed or {}
    consequence = upgrade.asked or bool(changed)  # a closure that moved because something was asked to
    found: list[Move] = []
    for platform in sorted(set(old.platforms) | set(new.platforms)):
        before = {normalize(w.name): w for w in old.wheels(platform)}
        after = {normalize(w.name): w for w in new.wheels(platform)}
        for name in sorted(set(before) | set(after)):
            was, now = before.get(name), after.get(name)
            if was and now and was.version == now.version:
                same = _same_file_moved(platform, was, now)
                found += [same] if same else []
                continue
            if name in changed:
                reason, asked = ("added to the stack" if changed[name] == "new"
                                 else f"its stack entry changed (was {changed[name]})"), True
            elif was and now and upgrade.covers(name):
                reason, asked = upgrade.describe(), True
            elif was and now:
                reason, asked = ("the locked version was not kept: the new closure needs another"
                                 if consequence else "the locked version was not kept"), consequence
            else:
                reason = "no longer needed by the closure" if now is None else "newly needed by the closure"
                asked = consequence
            found.append(Move(platform=platform, name=name, before=was.version if was else None,
                              after=now.version if now else None, reason=reason, asked=asked))
    return tuple(found)


def changes(old: Lock | None, new: Lock, found: tuple[Move, ...] | None = None) -> list[str]:
    """What a relock changed, in words: the date, every move with its reason, the base's .debs, PRs
    now included upstream and overlays that can go."""
    if old is None:
        return ["no previous lock"]
    lines = []
    if old.resolved_at != new.resolved_at:
        lines.append(f"resolved at {new.resolved_at} (was {old.resolved_at})")
    lines += [m.line() for m in (moves(old, new) if found is None else found)]
    lines += _base_changes(old, new)
    was = {(e.repo, e.number): e for e in old.pull_requests}
    for entry in new.pull_requests:
        prior = was.get((entry.repo, entry.number))
        if prior and prior.status == "overlay" and entry.status == "included" and prior.patch:
            lines.append(f"{entry.label}: now included upstream; its overlay {prior.patch.path} can go")
        elif prior is None or prior.status != entry.status:
            lines.append(f"{entry.label}: {prior.status if prior else 'new'} -> {entry.status}")
    return lines or ["nothing changed"]


def _base_changes(old: Lock, new: Lock) -> list[str]:
    if not isinstance(new.base, DebianBase):
        return []
    lines = []
    for platform in sorted(new.base.resolved):
        before = {d.name: d.version for d in old.base.debs(platform)} if isinstance(old.base, DebianBase) else {}
        after = {d.name: d.version for d in new.base.debs(platform)}
        for name in sorted(set(before) | set(after)):
            if name not in after:
                lines.append(f"{platform}: deb {name} {before[name]} removed")
            elif name not in before:
                lines.append(f"{platform}: deb {name} {after[name]} added")
            elif before[name] != after[name]:
                lines.append(f"{platform}: deb {name} {before[name]} -> {after[name]}")
    return lines
