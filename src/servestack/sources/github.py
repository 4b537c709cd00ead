"""The GitHub REST endpoints the lock uses: a pull request, its files, its diff, and commit ancestry."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import requests

from servestack import settings
from servestack.errors import PullRequestNotFound, ServestackError
from servestack.sources import http

DEFAULT_API = settings.default("SERVESTACK_GITHUB_API")


@dataclass(frozen=True, kw_only=True)
class PullRequestInfo:
    repo: str
    number: int
    title: str
    state: str
    merged: bool
    head_sha: str
    base_sha: str
    merge_commit: str | None
    files: tuple[str, ...]


class GitHub:
    def __init__(self, api: str | None = None, token: str | None = None, retries: int = 4):
        self.api = (api or settings.value("SERVESTACK_GITHUB_API") or DEFAULT_API).rstrip("/")
        self._session = http.session(retries=retries)
        self._session.headers["Accept"] = "application/vnd.github+json"
        self._session.headers["X-GitHub-Api-Version"] = "2022-11-28"
        token = token if token is not None else os.environ.get("GITHUB_TOKEN")
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def _get(self, path: str, what: str, **kwargs: Any) -> requests.Response:
        response = http.get(self._session, f"{self.api}{path}", what=what, **kwargs)
        if response.status_code == 404:
            raise PullRequestNotFound(f"{what}: not found on {self.api} (HTTP 404)")
        if response.status_code >= 400:
            raise ServestackError(f"{what}: HTTP {response.status_code} from {self.api}: {response.text[:300]}")
        return response

    def pull_request(self, repo: str, number: int, merge_commit: str | None = None) -> PullRequestInfo:
        """The PR as GitHub knows it (`merge_commit` is what the stack says; GitHub's own answer wins)."""
        what = f"{repo}#{number}"
        pr = self._get(f"/repos/{repo}/pulls/{number}", what).json()
        files: list[str] = []
        url: str | None = f"{self.api}/repos/{repo}/pulls/{number}/files?per_page=100"
        while url:
            response = self._get(url.removeprefix(self.api), f"{what} files")
            files += [f["filename"] for f in response.json()]
            url = response.links.get("next", {}).get("url")
        return PullRequestInfo(
            repo=repo,
            number=number,
            title=pr["title"],
            state=pr["state"],
            merged=bool(pr.get("merged")),
            head_sha=pr["head"]["sha"],
            base_sha=pr["base"]["sha"],
            merge_commit=pr.get("merge_commit_sha") if pr.get("merged") else None,
            files=tuple(sorted(files)),
        )

    def diff(self, repo: str, number: int, merge_commit: str | None = None) -> str:
        response = self._get(
            f"/repos/{repo}/pulls/{number}", f"{repo}#{number} diff", headers={"Accept": "application/vnd.github.diff"}
        )
        return response.text

    def is_ancestor(self, repo: str, ancestor: str, descendant: str) -> bool:
        """True when `ancestor` is reachable from `descendant` (the compare API says ahead or identical)."""
        data = self._get(f"/repos/{repo}/compare/{ancestor}...{descendant}", f"{repo} compare {ancestor[:12]}...{descendant[:12]}").json()
        return data["status"] in ("ahead", "identical")
