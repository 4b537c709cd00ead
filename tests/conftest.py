import os
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from fixtures import workflow_jobs  # noqa: E402
from fixtures.debian_mirror import ReadThroughMirror  # noqa: E402
from fixtures.github_server import FakeGitHub, serve  # noqa: E402
from fixtures.servers import package_index, push_image, serve_directory  # noqa: E402
from fixtures.tinypkg import build_tinypkg  # noqa: E402

from servestack import cluster, services  # noqa: E402
from servestack.cluster import srtctl_tool
from servestack.errors import ClusterToolsMissing
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
def debian_mirror(tmp_path_factory):
    """The Debian archive this machine is configured with, read through once per session (None
    when SERVESTACK_INDEX_DEBIAN already says where it is, or none is configured)."""
    from servestack.errors import ServestackError
    from servestack.sources import debian

    if os.environ.get("SERVESTACK_INDEX_DEBIAN"):
        yield None
        return
    try:
        upstream = debian.archive()
    except ServestackError:
        yield None  # the tests that need the archive fail saying how to configure one
        return
    mirror = ReadThroughMirror(upstream, tmp_path_factory.mktemp("debian-mirror"))
    yield mirror
    mirror.close()


@pytest.fixture(autouse=True)
def _fast_tests_read_debian_through_the_session_mirror(request, monkeypatch):
    # Only the fast tests: the e2e suite reads the archive as a user's machine does.
    if request.node.get_closest_marker("e2e"):
        return
    mirror = request.getfixturevalue("debian_mirror")
    if mirror is not None:
        monkeypatch.setenv("SERVESTACK_INDEX_DEBIAN", mirror.url)


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
    fake = FakeGitHub(repo_name=pkg.repo_name, repo=pkg.repo)
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
    except ClusterToolsMissing as e:
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
    except ClusterToolsMissing as e:
        pytest.skip(f"the GB200-shaped chain cannot be built here: {e}")


@pytest.fixture(scope="session")
def srtctl() -> srtctl_tool.Srtctl:
    """srtctl installed from the vendored srt-slurm snapshot, or a skip saying what is missing."""
    try:
        return srtctl_tool.ensure_srtctl(ROOT)
    except ClusterToolsMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def workflow_sha() -> str:
    from servestack.util.proc import run

    return run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()


@pytest.fixture(scope="session")
def runner_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runner")


@pytest.fixture(scope="session")
def keys(runner_root) -> dict[str, str]:
    from servestack.util.proc import run

    key = runner_root / "keys" / "servestack.key"
    key.parent.mkdir()
    run([sys.executable, "-m", "servestack", "--project", str(ROOT), "keygen", "--key", str(key)])
    return {"SERVESTACK_SIGNING_KEY_FILE": str(key), "SERVESTACK_TRUSTED_KEY_FILE": str(key.with_suffix(".pub"))}


@pytest.fixture(scope="session")
def build_job(runner_root, workflow_sha, keys):
    """build.yml's `image` job, dev-cpu leg, run once per session in a fresh checkout of this commit."""
    import threading

    runner = workflow_jobs.runner(runner_root, workflow_sha, keys)
    timer = threading.Timer(3600, runner.cancel)  # a hung step fails the test, it does not hang CI
    timer.start()
    try:
        return runner.run_job(workflow_jobs.WORKFLOWS / "build.yml", "image", matrix={"stack": workflow_jobs.STACK},
                              workspace=workflow_jobs.workspace(runner_root))
    finally:
        timer.cancel()


@pytest.fixture(scope="session")
def production_image() -> dict:
    """The production stack's image for this machine's platform (linux/amd64 in CI), built from its lock
    once per session, or taken from the registry when this lock's image is already there (the build
    step's cache). Its native static probe and GPU-node checks run on it."""
    from servestack import image, inputs, services
    from servestack.util.project import Project

    project = Project(root=ROOT)
    services.ensure_registry()
    inputs.build(project, "qwen35-gb200")
    record = image.build_image(project, "qwen35-gb200")
    return {"project": project, "record": record, "reference": record.reference, "platform": record.platform}
