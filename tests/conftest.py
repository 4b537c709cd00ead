import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixtures.github_server import FakeGitHub, serve  # noqa: E402
from fixtures.servers import package_index, push_image, serve_directory  # noqa: E402
from fixtures.tinypkg import build_tinypkg  # noqa: E402
from servestack import services  # noqa: E402


@pytest.fixture(scope="session")
def registry() -> str:
    return services.ensure_registry()


@pytest.fixture(scope="session")
def world(tmp_path_factory, registry):
    """The tinyserve repository, its wheel on a package index, its PRs on a GitHub API, a base image."""
    root = tmp_path_factory.mktemp("world")
    pkg = build_tinypkg(root / "pkg")
    index_server, index_url = serve_directory(root / "index")
    package_index(root / "index", [pkg.wheel])
    fake = FakeGitHub(pkg.repo_name, pkg.repo)
    for number, pr in pkg.prs.items():
        fake.pulls[number] = {"title": f"PR {number} ({pr.kind})", "head": pr.head, "base": pr.base,
                              "merge": pr.merge, "patch": pr.patch}
    github_server = serve(fake)
    repository = f"servestack-test/base-{uuid.uuid4().hex[:8]}"
    digest = push_image(registry, repository, "1", b"base layer")
    yield {"pkg": pkg, "index": f"{index_url}/simple", "github": fake, "base": f"{registry}/{repository}:1",
           "base_digest": digest}
    index_server.shutdown()
    github_server.shutdown()


