"""PR history from a git mirror instead of GitHub: real repositories, made in the test.

The mirror is what `git clone --mirror` of a GitHub repository gives: branches plus
`refs/pull/N/head`. GitHub itself is a closed port here, so every answer comes from git.
"""

from __future__ import annotations

import pytest

from fixtures.tinystack import PR1_EVIDENCE, entries, stack_with, unreachable
from servestack import lock
from servestack.errors import InputError
from servestack.sources.gitmirror import GitMirror
from servestack.util.proc import run


@pytest.fixture
def mirror(tmp_path, world):
    """A bare mirror of the tinyserve repository with GitHub's pull refs."""
    path = tmp_path / "mirrors" / "example" / "tinyserve.git"
    run(["git", "clone", "--quiet", "--mirror", str(world["pkg"].repo), str(path)])
    for number, pr in world["pkg"].prs.items():
        run(["git", "--git-dir", str(path), "update-ref", f"refs/pull/{number}/head", pr.head])
    return path


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SERVESTACK_GIT_MIRROR", raising=False)


def test_a_mirror_answers_what_github_would(tmp_path, world, mirror):
    pkg = world["pkg"]
    source = GitMirror(pkg.repo_name, str(mirror))
    info = source.pull_request(pkg.repo_name, 2)
    assert (info.head_sha, info.merge_commit, info.merged) == (pkg.prs[2].head, pkg.prs[2].merge, True)
    assert "tinyserve/server.py" in info.files and "tinyserve/extra.py" in info.files
    assert source.diff(pkg.repo_name, 2) == pkg.prs[2].patch
    assert source.is_ancestor(pkg.repo_name, pkg.prs[1].merge, pkg.base[:9])
    assert not source.is_ancestor(pkg.repo_name, pkg.prs[2].merge, pkg.base[:9])


def test_lock_classifies_prs_from_a_mirror_named_by_the_environment(tmp_path, world, mirror, monkeypatch):
    monkeypatch.setenv("SERVESTACK_GIT_MIRROR", str(tmp_path / "mirrors" / "{repo}.git"))
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE, 2: "", 3: ""})
    lock.lock(project, "tiny", unreachable())
    prs = entries(project)
    assert prs[1]["status"] == "included" and prs[1]["verified_by"] == ["ancestry", "evidence"]
    assert prs[1]["merge_commit"] == world["pkg"].prs[1].merge
    assert prs[2]["status"] == "overlay"
    assert (project.root / prs[2]["patch"]["path"]).read_text() == world["pkg"].prs[2].patch
    assert prs[3]["status"] == "overlay" and prs[3]["patch"]["native_files"] == ["csrc/kernel.cu"]
    assert str(tmp_path) not in project.lock_file("tiny").read_text()  # the mirror's place is configuration


def test_a_mirror_url_from_the_stack_is_cloned_once_and_fetched(tmp_path, world, mirror):
    project = stack_with(tmp_path, world, {2: ""})
    stack = project.pins / "tiny.yaml"
    stack.write_text(stack.read_text().replace("packages:\n", f"mirrors:\n  example/tinyserve: file://{mirror}\npackages:\n", 1))
    lock.lock(project, "tiny", unreachable())
    assert entries(project)[2]["status"] == "overlay"
    clone = tmp_path / "cache" / "git" / "example__tinyserve.git"
    assert (clone / "HEAD").exists()
    # A PR pushed to the mirror later is seen by the next lock (the clone is fetched, not reused stale).
    run(["git", "--git-dir", str(mirror), "update-ref", "refs/pull/9/head", world["pkg"].prs[4].head])
    assert GitMirror("example/tinyserve", f"file://{mirror}").pull_request("example/tinyserve", 9).head_sha == world["pkg"].prs[4].head


def test_a_pr_the_mirror_does_not_have_is_named(tmp_path, world, mirror, monkeypatch):
    monkeypatch.setenv("SERVESTACK_GIT_MIRROR", str(tmp_path / "mirrors" / "{repo}.git"))
    project = stack_with(tmp_path, world, {77: ""})
    with pytest.raises(InputError, match=r"packages\[0\]\.prs\[0\]: example/tinyserve#77 does not exist .*refs/pull/77/head"):
        lock.lock(project, "tiny", unreachable())
