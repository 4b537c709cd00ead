"""Every move between two locks has a reason, and says whether it was asked for or moved anyway:
the words `lock`, `lock --upgrade`, `lock --check --online` and `bump` all print."""

from __future__ import annotations

from fixtures.records import committed_lock
from servestack.lock.drift import moves
from servestack.lock.preferences import Upgrade
from servestack.records.lockfile import LockedWheel


def wheel(name: str, version: str, sha: str = "0", index: str = "pypi") -> LockedWheel:
    return LockedWheel(name=name, version=version, filename=f"{name}-{version}-py3-none-any.whl", sha256=sha * 64, size=1, index=index)


OLD = committed_lock(platforms={"p": (wheel("app", "1"), wheel("dep", "1"), wheel("lib", "1"))})


def lines(new_wheels, **kwargs) -> list[str]:
    return [m.line() for m in moves(OLD, committed_lock(platforms={"p": new_wheels}), **kwargs)]


def test_a_version_nobody_asked_to_move_moved_anyway():
    assert lines((wheel("app", "1"), wheel("dep", "2"), wheel("lib", "1"))) == [
        "p: dep 1 -> 2 (moved anyway: the locked version was not kept)"]


def test_a_named_upgrade_is_asked_and_what_its_closure_needs_follows_it():
    assert lines((wheel("app", "2"), wheel("dep", "2"), wheel("lib", "1"), wheel("new", "1")),
                 upgrade=Upgrade.of(["app"])) == [
        "p: app 1 -> 2 (asked: lock --upgrade app)",
        "p: dep 1 -> 2 (asked: the locked version was not kept: the new closure needs another)",
        "p: new 1 added (asked: newly needed by the closure)"]


def test_a_changed_stack_entry_is_asked():
    assert lines((wheel("app", "3"), wheel("dep", "1"), wheel("lib", "1")), changed={"app": "app==1"}) == [
        "p: app 1 -> 3 (asked: its stack entry changed (was app==1))"]


def test_the_same_version_from_another_file_or_index_is_named_as_such():
    assert lines((wheel("app", "1", sha="f"), wheel("dep", "1", index="mirror"), wheel("lib", "1")),
                 upgrade=Upgrade.of([])) == [
        f"p: app 1 (moved anyway: same version, another file: app-1-py3-none-any.whl sha256 {'0' * 12} -> "
        f"app-1-py3-none-any.whl sha256 {'f' * 12} (a changed hash))",
        "p: dep 1 (moved anyway: moved index: pypi -> mirror)"]
