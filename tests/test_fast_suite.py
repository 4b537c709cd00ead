"""The fast suite's promise: no test outside the e2e marker starts or uses a system daemon."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import servestack
from fixtures.daemon_guard import DAEMON_SERVICES, DaemonInFastTest, unguarded_references
from servestack import services


@pytest.mark.parametrize("name", DAEMON_SERVICES)
def test_a_fast_test_that_asks_for_a_daemon_fails_naming_the_marker_it_needs(name):
    with pytest.raises(DaemonInFastTest, match=rf"calls services\.{name}: mark it @pytest\.mark\.e2e"):
        getattr(services, name)()


def test_a_fast_test_cannot_spawn_a_daemon_directly(tmp_path):
    with pytest.raises(DaemonInFastTest, match="starts a daemon: dockerd: mark it"):
        services.daemons.spawn_detached(["dockerd"], tmp_path / "log")


def test_the_guard_holds_where_the_services_call_each_other(tmp_path):
    # Not through the package's re-exports: each module's own binding, as the services use them.
    with pytest.raises(DaemonInFastTest, match=r"calls services\.ensure_munge"):
        services.slurm_daemons.ensure_munge()
    with pytest.raises(DaemonInFastTest, match=r"calls services\.ensure_dockerd"):
        services.dockerd.ensure_dockerd()
    with pytest.raises(DaemonInFastTest, match="starts a daemon: docker-registry serve"):
        services.oci_registry.spawn_detached(["docker-registry", "serve"], tmp_path / "log")


def test_no_module_of_servestack_holds_an_unguarded_daemon_starter():
    # Every module loaded, including those no other fast test imports (the pull registry, the cluster).
    for info in pkgutil.walk_packages(servestack.__path__, "servestack."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert unguarded_references() == []
