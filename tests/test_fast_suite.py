"""The fast suite's promise: no test outside the e2e marker starts or uses a system daemon."""

from __future__ import annotations

import pytest

from conftest import DAEMON_SERVICES, DaemonInFastTest
from servestack import services


@pytest.mark.parametrize("name", DAEMON_SERVICES)
def test_a_fast_test_that_asks_for_a_daemon_fails_naming_the_marker_it_needs(name):
    with pytest.raises(DaemonInFastTest, match=rf"calls services\.{name}: mark it @pytest\.mark\.e2e"):
        getattr(services, name)()


def test_a_fast_test_cannot_spawn_a_daemon_directly(tmp_path):
    with pytest.raises(DaemonInFastTest, match="starts a daemon: dockerd: mark it"):
        services._spawn_detached(["dockerd"], tmp_path / "log")
