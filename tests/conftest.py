import os
import sys
import uuid
from pathlib import Path

import pytest

from fixtures import daemon_guard, workflow_jobs
from fixtures.debian_mirror import ReadThroughMirror
from fixtures.fake_site import make_fake_site
from fixtures.github_server import FakeGitHub, serve
from fixtures.paths import ROOT
from fixtures.servers import package_index, push_image, serve_directory
from fixtures.tinypkg import build_tinypkg
from servestack import cluster, services
from servestack.cluster import srtctl_tool
from servestack.errors import ClusterToolsMissing
from servestack.sources import http


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of this test is set up, session-scoped ones included: a fast test must not
    # get a daemon through a shared fixture either.
    daemon_guard.running["item"] = item


def pytest_runtest_teardown(item: pytest.Item) -> None:
    daemon_guard.running["item"] = None


def pytest_configure(config: pytest.Config) -> None:
    daemon_guard.install()


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


@pytest.fixture(autouse=True)
def _fast_tests_retry_without_waiting(request, monkeypatch):
    # An unreachable service is retried as in use, without sitting out urllib3's backoff (0, 1, 2, 4 s);
    # the e2e suite keeps it, as its services are real.
    if not request.node.get_closest_marker("e2e"):
        monkeypatch.setattr(http, "BACKOFF_S", 0.0)


@pytest.fixture(scope="module")
def fake_site(tmp_path_factory) -> dict:
    """A site-packages of two real wheels and the static probe's config for it (fixtures/fake_site.py)."""
    return make_fake_site(tmp_path_factory.mktemp("site"))


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


@pytest.fixture(scope="module")
def srtctl_cluster() -> cluster.Cluster:
    """The cluster the dev-cpu pipeline's srtctl jobs run on: srtctl, pyxis and enroot on a Slurm of
    that many nodes (network namespaces), or a skip saying what is missing. Its `slurm_env` is what
    squeue and scancel need to see those jobs."""
    try:
        return cluster.ensure_cluster(ROOT, nodes=workflow_jobs.srtctl_nodes())
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
