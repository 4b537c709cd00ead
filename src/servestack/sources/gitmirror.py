"""PR history from a git mirror of an upstream repository, instead of GitHub's API.

Air-gapped sites mirror GitHub as plain git repositories, pull refs included
(`git clone --mirror` keeps `refs/pull/N/head`). Everything the lock asks GitHub it can ask
such a mirror: a PR's head (`refs/pull/N/head`), its merge commit (the stack's `merge_commit`,
else the first-parent commit of the default branch that says it merged #N), the files and diff
it brought (`git diff merge^1 merge`), and ancestry (`git merge-base --is-ancestor`).

Where a mirror is: the environment's `SERVESTACK_GIT_MIRROR` (a template with `{repo}`, e.g.
`/srv/git/{repo}.git`), else the stack's `mirrors` ("owner/name": path or URL). A local
directory is read in place; a URL is cloned once with `--mirror` into the cache and fetched on
every use.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from servestack import settings
from servestack.errors import NetworkError, PullRequestNotFound, ServestackError
from servestack.sources.github import PullRequestInfo
from servestack.util import proc
from servestack.util.project import cache_home

ENV = "SERVESTACK_GIT_MIRROR"
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}


def mirror_location(repo: str, configured: dict[str, str]) -> str | None:
    """The mirror of `repo` ("owner/name"), from the environment first, then the stack."""
    template = settings.value(ENV)
    if template:
        return template.replace("{repo}", repo)
    return configured.get(repo)


class GitMirror:
    """One upstream repository's git mirror, answering what the lock asks about its PRs."""

    def __init__(self, repo: str, location: str, cache: Path | None = None):
        self.repo = repo
        self.location = location
        self.api = f"git mirror {location}"  # how messages name this source, like GitHub.api
        local = Path(location.removeprefix("file://")) if "://" not in location or location.startswith("file://") else None
        if local is not None and local.is_dir() and "://" not in location:
            self.git_dir = local
        else:
            self.git_dir = (cache or cache_home() / "git") / (repo.replace("/", "__") + ".git")
            self._sync()

    def _git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = proc.run(["git", "--git-dir", str(self.git_dir), *args], check=False, env=_GIT_ENV)
        if check and result.returncode != 0:
            raise ServestackError(f"{self.api}: git {' '.join(args)} failed: {result.stdout.strip()[-400:]}")
        return result

    def _sync(self) -> None:
        if not (self.git_dir / "HEAD").exists():
            self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.git_dir.with_name(self.git_dir.name + ".part")
            result = proc.run(["git", "clone", "--quiet", "--mirror", self.location, str(tmp)], check=False, env=_GIT_ENV)
            if result.returncode != 0:
                raise NetworkError(f"{self.repo}: cannot clone the git mirror {self.location}: {result.stdout.strip()[-400:]}")
            os.replace(tmp, self.git_dir)
            return
        result = self._git("fetch", "--quiet", "--prune", self.location, "+refs/*:refs/*", check=False)
        if result.returncode != 0:
            raise NetworkError(f"{self.repo}: cannot fetch the git mirror {self.location}: {result.stdout.strip()[-400:]}")

    def _commit(self, rev: str) -> str | None:
        result = self._git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        return result.stdout.strip() if result.returncode == 0 else None

    def _find_merge(self, number: int) -> str | None:
        log = self._git("log", "--first-parent", "--format=%H%x00%s", "HEAD").stdout
        said = re.compile(rf"^Merge pull request #{number}\b|\(#{number}\)$")
        return next((sha for sha, _, subject in (line.partition("\0") for line in log.splitlines()) if said.search(subject)), None)

    def pull_request(self, repo: str, number: int, merge_commit: str | None = None) -> PullRequestInfo:
        what = f"{repo}#{number}"
        head = self._commit(f"refs/pull/{number}/head")
        if head is None:
            raise PullRequestNotFound(f"{what}: {self.api} has no refs/pull/{number}/head")
        merge = self._commit(merge_commit) if merge_commit else self._find_merge(number)
        if merge_commit and merge is None:
            raise PullRequestNotFound(f"{what}: merge commit {merge_commit} is not in {self.api}")
        if merge:
            base = self._git("rev-parse", f"{merge}^1").stdout.strip()
            body = self._git("log", "-1", "--format=%s%n%b", merge).stdout.splitlines()
            subject = body[0] if body else ""
            title = next((line for line in body[1:] if line.strip()), subject) if subject.startswith("Merge pull request") else subject
            title = re.sub(rf"\s*\(#{number}\)$", "", title)
            files = self._git("diff", "--name-only", base, merge).stdout.split()
        else:
            base = self._git("merge-base", "HEAD", head).stdout.strip()
            title = self._git("log", "-1", "--format=%s", head).stdout.strip()
            files = self._git("diff", "--name-only", base, head).stdout.split()
        return PullRequestInfo(
            repo=repo, number=number, title=title, state="closed" if merge else "open", merged=bool(merge),
            head_sha=head, base_sha=base, merge_commit=merge, files=tuple(sorted(files)),
        )

    def diff(self, repo: str, number: int, merge_commit: str | None = None) -> str:
        info = self.pull_request(repo, number, merge_commit)
        end = info.merge_commit or info.head_sha
        return self._git("diff", "--no-color", "--no-ext-diff", info.base_sha, end).stdout

    def is_ancestor(self, repo: str, ancestor: str, descendant: str) -> bool:
        full = self._commit(descendant)
        if full is None:
            raise ServestackError(f"{repo}: commit {descendant} (what the pinned package records) is not in {self.api}")
        return self._git("merge-base", "--is-ancestor", ancestor, full, check=False).returncode == 0
