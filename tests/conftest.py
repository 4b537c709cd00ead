import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from fixtures.github_server import FakeGitHub, serve  # noqa: E402
from fixtures.servers import package_index, push_image, serve_directory  # noqa: E402
from fixtures.tinypkg import build_tinypkg  # noqa: E402
from servestack import cluster, services  # noqa: E402
from servestack.services import daemons  # noqa: E402


# The services a fast test may not use: each starts (or relies on) a system daemon.
DAEMON_SERVICES = ("ensure_dockerd", "ensure_registry", "ensure_tls_registry", "ensure_munge", "ensure_slurm", "ensure_binfmt_aarch64", "docker_client")
# The unguarded functions: services.NAME for each of DAEMON_SERVICES, and the one place every daemon
# is spawned (servestack's services and the cluster's pull registry alike).
REAL = {**{name: getattr(services, name) for name in DAEMON_SERVICES}, "spawn_detached": daemons.spawn_detached}


class DaemonInFastTest(AssertionError):
    """A test without the e2e marker asked for a system daemon."""


_running: dict[str, pytest.Item | None] = {"item": None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of this test is set up, session-scoped ones included: a fast test must not
    # get a daemon through a shared fixture either.
    _running["item"] = item


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _running["item"] = None


def _guard(name: str, real):
    """services.NAME, refused while a fast test (or its fixtures) runs.

    Fast tests must pass on a machine where no daemon runs (the hosted CI job has none). The check
    is on the call, not on whether the daemon happens to be up, so a fast test can never pass only
    because an e2e test started something earlier in the same run.
    """
    def guarded(*args, **kwargs):
        item = _running["item"]
        if item is not None and not item.get_closest_marker("e2e"):
            what = f"starts a daemon: {' '.join(map(str, args[0]))}" if name == "spawn_detached" else f"calls services.{name}"
            raise DaemonInFastTest(f"{item.nodeid} {what}: mark it @pytest.mark.e2e")
        return real(*args, **kwargs)
    return guarded


def unguarded_references() -> list[str]:
    """`module.attribute` for every loaded module that still holds one of REAL's functions."""
    real = {id(fn) for fn in REAL.values()}
    return sorted(f"{module.__name__}.{attr}" for module in list(sys.modules.values())
                  for attr, value in list(getattr(module, "__dict__", {}).items())
                  if id(value) in real)


def pytest_configure(config: pytest.Config) -> None:
    # Wherever a function lives: the services package re-exports it, sibling modules import it by
    # name (slurm calls munge's, dockerd's docker_client its own ensure_dockerd). Every module loaded
    # now is rebound; one imported later takes the guarded function from its (rebound) home.
    guards = {id(fn): _guard(name, fn) for name, fn in REAL.items()}
    for module in list(sys.modules.values()):
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if id(value) in guards:
                setattr(module, attr, guards[id(value)])


@pytest.fixture(scope="session")
def registry() -> str:
    return services.ensure_registry()


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """The tinyserve repository, its wheel on a package index, its PRs on a GitHub API."""
    root = tmp_path_factory.mktemp("world")
    pkg = build_tinypkg(root / "pkg")
    index_server, index_url = serve_directory(root / "index")
    package_index(root / "index", [pkg.wheel])
    fake = FakeGitHub(pkg.repo_name, pkg.repo)
    for number, pr in pkg.prs.items():
        fake.pulls[number] = {"title": f"PR {number} ({pr.kind})", "head": pr.head, "base": pr.base,
                              "merge": pr.merge, "patch": pr.patch}
    github_server = serve(fake)
    yield {"pkg": pkg, "index": f"{index_url}/simple", "github": fake}
    index_server.shutdown()
    github_server.shutdown()


@pytest.fixture(scope="session")
def registry_base(registry) -> dict[str, str]:
    """A base image in the loopback registry, by tag, and the digest the registry gives it."""
    repository = f"servestack-test/base-{uuid.uuid4().hex[:8]}"
    digest = push_image(registry, repository, "1", b"base layer")
    return {"reference": f"{registry}/{repository}:1", "digest": digest}


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The local Slurm's client environment (slurmctld and slurmd started if they are not running)."""
    return services.ensure_slurm()


@pytest.fixture(scope="module")
def cluster_node(slurm_env) -> cluster.Cluster:
    """The login node's tools (srtctl, pyxis, enroot) on the local Slurm, or a skip saying what is missing."""
    try:
        return cluster.ensure_cluster(ROOT)
    except cluster.ClusterToolsMissing as e:
        pytest.skip(f"the GB200-shaped chain cannot be built here: {e}")


def srtctl_nodes() -> int:
    """The nodes of the cluster the dev-cpu pipeline's srtctl jobs run on (runner.srtctl.local_cluster_nodes)."""
    from servestack.stages.pipeline import load_pipeline

    return load_pipeline(ROOT / "pipelines" / "dev-cpu.yaml").runner.srtctl.local_cluster_nodes


@pytest.fixture(scope="module")
def srtctl_cluster() -> cluster.Cluster:
    """The cluster the dev-cpu pipeline's srtctl jobs run on: srtctl, pyxis and enroot on a Slurm of
    that many nodes (network namespaces), or a skip saying what is missing. Its `slurm_env` is what
    squeue and scancel need to see those jobs."""
    try:
        return cluster.ensure_cluster(ROOT, nodes=srtctl_nodes())
    except cluster.ClusterToolsMissing as e:
        pytest.skip(f"the GB200-shaped chain cannot be built here: {e}")


@pytest.fixture(scope="session")
def srtctl() -> cluster.Srtctl:
    """srtctl installed from the vendored srt-slurm snapshot, or a skip saying what is missing."""
    try:
        return cluster.ensure_srtctl(ROOT)
    except cluster.ClusterToolsMissing as e:
        pytest.skip(str(e))
