"""A relock changes nothing; versions move only when asked, and a lock that cannot hold its date says so.

Against a real HTTP simple index on 127.0.0.1 that the test controls (tests/fixtures/simple_index.py),
serving tiny wheels built here: `app` 1.0 depends on `dep`, and `dep` gets newer releases while
the lock stands. The stack needs neither torch nor vLLM: its base is Debian's python3.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fixtures.simple_index import SimpleIndex, serve, tiny_wheel
from fixtures.tinystack import DEBIAN_BASE
from servestack import lock
from servestack.lock import relock
from servestack.lock.preferences import Upgrade
from servestack.util.project import Project

pytestmark = pytest.mark.e2e

RESOLVED_AT = "2026-06-01T00:00:00Z"
BEFORE_IT = datetime(2026, 1, 1, tzinfo=UTC)
STILL_BEFORE_IT = datetime(2026, 3, 1, tzinfo=UTC)  # seen by the index only after the lock was made
AFTER_IT = datetime(2026, 7, 1, tzinfo=UTC)

STACK = f"""\
name: mini
platforms: [linux/amd64]
python: "3.11"
resolved_at: "{RESOLVED_AT}"
base:
{DEBIAN_BASE}
packages:
  - name: app
    version: "1.0"
smoke_model:
  name: tiny
  make: {{seed: 0}}
"""


@pytest.fixture(params=[True, False], ids=["upload-times", "no-upload-times"])
def index(request, tmp_path, monkeypatch, debian_mirror):
    """The stack's default index, serving app 1.0 and dep 1.0 (uploaded before resolved_at)."""
    if debian_mirror is not None:
        monkeypatch.setenv("SERVESTACK_INDEX_DEBIAN", debian_mirror.url)
    served = SimpleIndex(upload_times=request.param)
    server = serve(served)
    wheels = tmp_path / "wheels"
    served.publish(tiny_wheel(wheels, "app", "1.0", ("dep>=1.0",)), BEFORE_IT)
    served.publish(tiny_wheel(wheels, "dep", "1.0"), BEFORE_IT)
    served.publish(tiny_wheel(wheels, "other", "1.0"), BEFORE_IT)
    monkeypatch.setenv("SERVESTACK_INDEX_PYPI", served.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    served.wheels = wheels
    yield served
    server.shutdown()


def project(tmp_path: Path) -> Project:
    (tmp_path / "pins").mkdir(exist_ok=True)
    (tmp_path / "pins" / "mini.yaml").write_text(STACK)
    return Project(root=tmp_path)


def versions(project: Project) -> dict[str, str]:
    return {w.name: w.version for w in lock.load_lock(project, "mini").wheels("linux/amd64")}


def test_a_relock_keeps_the_locked_versions_and_only_upgrade_takes_a_newer_release(tmp_path, index, capsys):
    mini = project(tmp_path)
    first = lock.lock(mini, "mini").read_bytes()
    assert versions(mini) == {"app": "1.0", "dep": "1.0"}

    # A newer dep, dated before resolved_at (a mirror that caught up late), is not taken by a relock.
    index.publish(tiny_wheel(index.wheels, "dep", "1.1"), STILL_BEFORE_IT)
    again = relock.relock(mini, "mini")
    assert mini.lock_file("mini").read_bytes() == first
    assert again.moves == () and again.lines == ("nothing changed",)

    # Upgrading another package leaves dep where it is.
    named = relock.relock(mini, "mini", upgrade=Upgrade.of(["other"]))
    assert versions(mini)["dep"] == "1.0" and not named.moves

    everything = relock.relock(mini, "mini", upgrade=Upgrade.of([]))
    assert versions(mini)["dep"] == "1.1"
    (move,) = everything.moves
    assert move.line() == "linux/amd64: dep 1.0 -> 1.1 (asked: lock --upgrade)"
    assert lock.load_lock(mini, "mini").resolved_at != RESOLVED_AT  # the moment it resolved


def test_the_online_check_names_what_upgrade_would_take_and_writes_nothing(tmp_path, index):
    mini = project(tmp_path)
    first = lock.lock(mini, "mini").read_bytes()
    index.publish(tiny_wheel(index.wheels, "dep", "1.1"), STILL_BEFORE_IT)
    online = relock.check_online(mini, "mini")
    assert online.ok
    assert online.lines() == ["a relock would change nothing",
                              "--upgrade would take: linux/amd64: dep 1.0 -> 1.1 (asked: lock --upgrade)"]
    assert mini.lock_file("mini").read_bytes() == first
    assert (mini.pins / "mini.yaml").read_text() == STACK


def test_a_release_after_resolved_at_is_never_taken_where_upload_times_are_served(tmp_path, index):
    if not index.upload_times:
        pytest.skip("only an index with upload times can hold a date")
    index.publish(tiny_wheel(index.wheels, "dep", "1.2"), AFTER_IT)
    mini = project(tmp_path)  # no previous lock, an empty uv cache: the date alone decides
    lock.lock(mini, "mini")
    assert versions(mini)["dep"] == "1.0"
    assert not lock.load_lock(mini, "mini").undated_indexes


def test_an_index_without_upload_times_is_named_in_the_lock_and_a_relock_still_keeps_its_versions(
        tmp_path, index, capsys):
    if index.upload_times:
        pytest.skip("the index serves upload times")
    mini = project(tmp_path)
    first = lock.lock(mini, "mini").read_bytes()
    (entry,) = lock.load_lock(mini, "mini").undated_indexes
    assert entry.index == "pypi" and f"resolved_at {RESOLVED_AT} could not be enforced" in entry.why
    assert f"index 'pypi' ({index.url}, from SERVESTACK_INDEX_PYPI): serves no upload times" in capsys.readouterr().err

    index.publish(tiny_wheel(index.wheels, "dep", "1.1"), AFTER_IT)  # its date is nowhere to be read
    assert lock.lock(mini, "mini").read_bytes() == first
