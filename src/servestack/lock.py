"""`pins/<stack>.lock`: every input of a stack resolved to an immutable hash.

The lock is canonical JSON (sorted keys, one value per line), so the same inputs give the same
bytes and a re-lock shows up in review as a readable diff. Resolving talks to the network
(package index, registry, GitHub, Debian); checking (`--check`) never does.
"""

from __future__ import annotations

import logging
import re
import zipfile
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import diffs
from .errors import InputError, InputErrors, NetworkError, ServestackError
from .fsutil import atomic_write_text, sha256_bytes, sha256_file
from .project import Project
from .records.fields import Fields
from .records.lockfile import Lock, read_lock, write_lock
from .wheels import normalize

if TYPE_CHECKING:
    from .sources import pypi
    from .sources.github import GitHub
    from .sources.gitmirror import GitMirror
    from .stack import PullRequest, Stack

# The network clients (requests, GitHub, git mirrors, indexes) are imported by the resolving functions
# that use them: reading and checking a lock, which every build does, needs none of them; reading one
# (image, smoke) needs no stack model either (pydantic).

log = logging.getLogger("servestack.lock")

LOCK_VERSION = 3  # 3: a Debian base's packages, each by sha256


def _relative(project: Project, path: Path) -> str:
    return path.resolve().relative_to(project.root.resolve()).as_posix()


def patch_path(project: Project, pr: PullRequest) -> Path:
    owner, name = pr.repo.split("/")
    return project.patches / f"{owner}__{name}-{pr.number}.diff"


# --------------------------------------------------------------------------- resolving


def _resolve_base(stack: Stack, previous: Lock | None, refresh: bool) -> dict[str, Any]:
    """The base's lock entry. A Debian base is kept from the previous lock while the stack asks for the same
    suite, packages and platforms: like the wheels under `resolved_at`, it moves only on `--upgrade`, so a
    relock is byte-identical (and needs no archive) however the suite has moved since."""
    from .base.resolve import resolve_suite
    from .records.lockfile import DebianBase
    from .sources import registry

    if stack.base.image:
        reference = stack.base.image
        digest = registry.resolve_digest(reference)
        return {"image": {"reference": reference, "digest": digest}}
    wanted = stack.base.debian
    old = previous.base if previous is not None else None
    if (not refresh and isinstance(old, DebianBase) and old.suite == wanted.suite
            and sorted(old.packages) == sorted(wanted.packages) and sorted(old.resolved) == sorted(stack.platforms)):
        return old.to_json()
    return resolve_suite(wanted.suite, list(wanted.packages), list(stack.platforms))


def _previous_lock(project: Project, stack_name: str) -> Lock | None:
    try:
        return load_lock(project, stack_name) if project.lock_file(stack_name).exists() else None
    except ServestackError:  # a lock this servestack cannot read (an older format) is replaced, not kept
        return None


def _with_sizes(found: list[pypi.FoundWheel]) -> list[pypi.FoundWheel]:
    """Every wheel with its size: an index that does not say it gets the file fetched (and verified)."""
    return [w if w.size is not None else replace(w, size=_pinned_wheel(w).stat().st_size) for w in found]


def _pinned_wheel(wheel: pypi.FoundWheel | None) -> Path | None:
    from . import cache

    return cache.fetch(wheel.url, wheel.sha256, wheel.filename, origin=f"index {wheel.index!r}") if wheel else None


def _package_commit(path: Path | None, package) -> str | None:
    """The upstream commit the pinned package was built from: the git pin, or what the wheel records."""
    from . import wheels

    if package.git:
        return package.git.commit
    return wheels.read_wheel_commit(path) if path else None


def _evidence(pr: PullRequest, archive: Path | None) -> list[tuple[int, dict[str, str], str | None, str]]:
    """Each evidence item checked in the pinned wheel's files: (index, item, problem, where found)."""
    from .probe.static.evidence import evidence_problem

    if not pr.evidence:
        return []
    if archive is None:
        return [(i, e.to_json(), "the package has no pinned wheel to read", "") for i, e in enumerate(pr.evidence)]
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())

        def read(member: str) -> str | None:
            return zf.read(member).decode("utf-8", "replace") if member in names else None

        results = []
        for i, item in enumerate(pr.evidence):
            problem, where = evidence_problem(item.to_json(), read, lambda: names)
            results.append((i, item.to_json(), problem, where))
        return results


class _Histories:
    """Where each upstream repository's PR history is: its git mirror if configured, else GitHub.
    A source that cannot be reached is asked once; its PRs then rest on evidence alone."""

    def __init__(self, stack: Stack, github: GitHub):
        self._stack, self._github = stack, github
        self._sources: dict[str, GitHub | GitMirror] = {}
        self.down: dict[str, str] = {}  # repo -> why its history is unavailable

    def source(self, repo: str) -> GitHub | GitMirror | None:
        from .sources import gitmirror

        if repo in self.down:
            return None
        if repo not in self._sources:
            location = gitmirror.mirror_location(repo, self._stack.mirrors)
            try:
                self._sources[repo] = gitmirror.GitMirror(repo, location) if location else self._github
            except NetworkError as exc:
                self.fail(repo, exc)
                return None
        return self._sources[repo]

    def fail(self, repo: str, exc: Exception) -> None:
        from .sources.github import GitHub

        source = self._sources.get(repo)
        name = source.api if isinstance(source, GitHub) else "its git mirror"
        self.down[repo] = f"{repo}'s history ({name}) was unreachable when this lock was made"
        log.warning("%s", exc)
        log.warning("%s: PRs rest on their evidence alone", self.down[repo])


def _entry(pr: PullRequest, package: str, info) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "repo": pr.repo,
        "number": pr.number,
        "package": package,
        "title": pr.title or (info.title if info else None),
        "merge_commit": (info.merge_commit if info else None) or pr.merge_commit,
    }
    if pr.merged:
        entry["merged"] = pr.merged
    if info:
        entry.update(state=info.state, head_sha=info.head_sha, files=list(info.files))
    return entry


def _resolve_prs(
    project: Project, stack: Stack, stack_file: Path, wheels_by_name: dict[str, pypi.FoundWheel], github: GitHub
) -> tuple[list[dict[str, Any]], dict[str, str], dict[Path, str]]:
    """Classify every PR: included (by evidence in the pinned wheel and/or ancestry), overlay, or
    unverified (no evidence, no reachable history); returns entries, package commits, patches to write."""
    from .sources.github import PullRequestNotFound

    entries: list[dict[str, Any]] = []
    commits: dict[str, str | None] = {}
    patches: dict[Path, str] = {}
    histories = _Histories(stack, github)
    problems: list[InputError] = []
    for index, package in enumerate(stack.packages):
        if not package.prs:
            continue
        name = normalize(package.name)
        wheel = wheels_by_name.get(name)
        archive = _pinned_wheel(wheel) if not package.git else None
        commits[name] = _package_commit(archive, package)
        pinned = f"the pinned {package.name} {wheel.version} ({wheel.filename})" if wheel else f"the pinned {package.name}"
        for pr_index, pr in enumerate(package.prs):
            field = f"packages[{index}].prs[{pr_index}]"
            evidence = _evidence(pr, archive)
            missing = [(i, item, problem) for i, item, problem, _ in evidence if problem]
            info, ancestor = None, None
            source = histories.source(pr.repo)
            if source is not None:
                try:
                    info = source.pull_request(pr.repo, pr.number, merge_commit=pr.merge_commit)
                    if info.merge_commit and commits[name]:
                        ancestor = source.is_ancestor(pr.repo, info.merge_commit, commits[name])
                except PullRequestNotFound as exc:
                    raise InputError(stack_file, field, f"{pr.label} does not exist ({exc})") from None
                except NetworkError as exc:
                    histories.fail(pr.repo, exc)
                    info = None
            if info and pr.merge_commit and info.merge_commit and pr.merge_commit != info.merge_commit:
                raise InputError(stack_file, f"{field}.merge_commit",
                                 f"{pr.label} was merged as {info.merge_commit}, not {pr.merge_commit}")
            if info and not commits[name]:
                raise InputError(
                    stack_file, f"packages[{index}].prs",
                    f"the {package.name} wheel records no upstream commit, so its PRs cannot be classified; "
                    "pin the package by `git` (url + commit) instead",
                )
            entry = _entry(pr, name, info)
            if evidence:
                entry["evidence"] = [{**item, "found": where} if where else item for _, item, _, where in evidence]
            if ancestor is False and (missing or not evidence):
                diff = source.diff(pr.repo, pr.number, merge_commit=pr.merge_commit)
                path = patch_path(project, pr)
                patches[path] = diff
                entry["status"] = "overlay"
                entry["patch"] = {
                    "path": _relative(project, path),
                    "sha256": sha256_bytes(diff.encode()),
                    "python_only": not diffs.diff_native_files(diff),
                    "native_files": diffs.diff_native_files(diff),
                }
            elif missing:
                why = "its merge commit is an ancestor of the pinned commit, yet " if ancestor else ""
                problems += [
                    InputError(stack_file, f"{field}.evidence[{i}]",
                               f"{pr.label} ({pr.title or 'untitled'}): {why}the evidence is missing from {pinned}: {problem}")
                    for i, _, problem in missing
                ]
                continue
            elif ancestor or evidence:
                entry["status"] = "included"
                entry["verified_by"] = (["ancestry"] if ancestor else []) + (["evidence"] if evidence else [])
                if ancestor is False:
                    entry["note"] = f"its merge commit is not an ancestor of {commits[name]}: present by evidence (a backport?)"
            else:
                entry["status"] = "unverified"
                entry["unverified_reason"] = (
                    histories.down.get(pr.repo, "no evidence and no merge commit to check ancestry")
                    + "; the stack gives no evidence for it"
                )
            entries.append(entry)
    if problems:
        raise InputErrors(problems)
    return sorted(entries, key=lambda e: (e["repo"], e["number"])), commits, patches


def _local_patches(project: Project, stack: Stack, stack_file: Path) -> list[dict[str, Any]]:
    """Each local patch hashed, with what it touches (overlays are Python-only: build refuses native files)."""
    entries = []
    for index, package in enumerate(stack.packages):
        for patch_index, patch in enumerate(package.patches):
            path = project.patches / patch.file
            if not path.is_file():
                raise InputError(stack_file, f"packages[{index}].patches[{patch_index}].file",
                                 f"{_relative(project, path)} does not exist (a local patch lives in pins/patches/)")
            diff = path.read_text()
            if not diffs.touched_files(diff):
                raise InputError(path, "diff", "changes no file (expected a unified diff in the wheel's paths)")
            entries.append({
                "package": normalize(package.name),
                "file": _relative(project, path),
                "sha256": sha256_file(path),
                "reason": patch.reason,
                "python_only": not diffs.diff_native_files(diff),
                "native_files": diffs.diff_native_files(diff),
            })
    return sorted(entries, key=lambda e: (e["package"], e["file"]))


def resolve(project: Project, stack_name: str, github: GitHub | None = None, *, refresh_base: bool = False) -> dict[str, Any]:
    """Resolve a stack into its lock (`lock`) and the PR patches to write (`patches`); nothing is written.
    `refresh_base`: resolve a Debian base's packages again from the suite as it is now."""
    from . import pairing
    from .sources import pypi
    from .sources.github import GitHub
    from .stack import load_stack

    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)
    if stack.name != stack_name:
        raise InputError(stack_file, "name", f"is {stack.name!r}, but the file is named for {stack_name!r}")
    # What the stack lets go and its index cannot give here is left out of the resolution, with the
    # indexes only it used (an index without a location cannot be passed to uv).
    unavailable = pypi.unavailable(stack, stack_file)
    let_go = [p for p in stack.packages if normalize(p.name) in unavailable]
    wanted = [p for p in stack.packages if normalize(p.name) not in unavailable]
    dropped = {p.index for p in let_go} - {p.index for p in wanted}
    stack = stack.model_copy(update={"packages": wanted, "indexes": [i for i in stack.indexes if i.name not in dropped]})
    platforms = {platform: _with_sizes(pypi.resolve(stack, stack_file, platform)) for platform in stack.platforms}
    for platform, resolved_wheels in platforms.items():
        pairing.check_locked(stack, stack_file, platform, resolved_wheels)
    first = platforms[stack.platforms[0]]
    by_name = {normalize(w.name): w for w in first}
    missing = [p.name for p in stack.packages if normalize(p.name) not in by_name]
    if missing:
        raise ServestackError(f"{stack_file}: packages {missing} did not resolve to any wheel")
    prs, commits, patches = _resolve_prs(project, stack, stack_file, by_name, github or GitHub())
    local_patches = _local_patches(project, stack, stack_file)
    base = _resolve_base(stack, _previous_lock(project, stack_name), refresh_base)
    uploads = [w.upload_time for ws in platforms.values() for w in ws if w.upload_time]
    epoch = max(uploads) if uploads else base.get("debian", {}).get("release_date", 0)
    document = {
        "lock_version": LOCK_VERSION,
        "stack": {"name": stack.name, "file": _relative(project, stack_file), "sha256": sha256_file(stack_file)},
        "python": stack.python,
        "resolved_at": stack.resolved_at,
        "source_date_epoch": epoch,
        "base": base,
        "environment": dict(sorted(stack.environment.items())),
        "excluded": [{"name": e.name, "reason": e.reason} for e in sorted(stack.exclude, key=lambda e: e.name)],
        "packages": {
            normalize(p.name): {
                "version": by_name[normalize(p.name)].version,
                "requirement": p.requirement,
                "commit": commits.get(normalize(p.name)),
            }
            for p in stack.packages
        },
        "platforms": {platform: [w.to_json() for w in ws] for platform, ws in sorted(platforms.items())},
        "pull_requests": prs,
        **({"local_patches": local_patches} if local_patches else {}),
        "smoke_model": stack.smoke_model.model_dump(exclude_none=True),
    }
    if stack.fast_path:
        document["fast_path"] = stack.fast_path.model_dump(exclude_none=True)
    if stack.links:
        document["links"] = {path: link.model_dump() for path, link in sorted(stack.links.items())}
    if stack.gpu_node:
        document["gpu_node"] = stack.gpu_node.model_dump(exclude_none=True)
    if unavailable:
        document["unavailable"] = [
            {"package": normalize(p.name), "version": p.version, "index": p.index, "why": unavailable[normalize(p.name)],
             "accepted_because": p.if_unavailable}
            for p in let_go]
    # Assembled as its JSON, then read like any lock: the file written is what every reader accepts.
    return {"lock": Lock.from_json(Fields(document, project.lock_file(stack_name))), "patches": patches}


def lock(project: Project, stack_name: str, github: GitHub | None = None, *, refresh_base: bool = False) -> Path:
    """Resolve and write the lock; on any failure the previous lock is left as it was."""
    resolved = resolve(project, stack_name, github, refresh_base=refresh_base)
    for path, diff in sorted(resolved["patches"].items()):
        if not path.exists() or path.read_text() != diff:
            atomic_write_text(path, diff)
    out = project.lock_file(stack_name)
    write_lock(out, resolved["lock"])
    return out


# --------------------------------------------------------------------------- upgrading


def _set_resolved_at(text: str, moment: str) -> str:
    """The stack file's text with `resolved_at` set to `moment` (added after `python:` if absent)."""
    line = f'resolved_at: "{moment}"'
    if re.search(r"^resolved_at:.*$", text, re.M):
        return re.sub(r"^resolved_at:.*$", line, text, count=1, flags=re.M)
    if not re.search(r"^python:.*$", text, re.M):
        raise ServestackError("the stack file has no top-level `python:` line to put `resolved_at` after")
    return re.sub(r"^(python:.*)$", rf"\1\n{line}", text, count=1, flags=re.M)


def changes(old: Lock | None, new: Lock) -> list[str]:
    """What a relock changed, in words: versions, PRs now included upstream, overlays that can go."""
    if old is None:
        return ["no previous lock"]
    lines = []
    if old.resolved_at != new.resolved_at:
        lines.append(f"resolved at {new.resolved_at} (was {old.resolved_at})")
    for platform in sorted(set(old.platforms) | set(new.platforms)):
        lines += _version_changes(f"{platform}: ", {w.name: w.version for w in old.wheels(platform)},
                                  {w.name: w.version for w in new.wheels(platform)})
    lines += _base_changes(old, new)
    was = {(e.repo, e.number): e for e in old.pull_requests}
    for entry in new.pull_requests:
        prior = was.get((entry.repo, entry.number))
        if prior and prior.status == "overlay" and entry.status == "included" and prior.patch:
            lines.append(f"{entry.label}: now included upstream; its overlay {prior.patch.path} can go")
        elif prior is None or prior.status != entry.status:
            lines.append(f"{entry.label}: {prior.status if prior else 'new'} -> {entry.status}")
    return lines or ["nothing changed"]


def _base_changes(old: Lock, new: Lock) -> list[str]:
    from .records.lockfile import DebianBase

    if not isinstance(new.base, DebianBase):
        return []
    lines = []
    for platform in sorted(new.base.resolved):
        before = {d.name: d.version for d in old.base.debs(platform)} if isinstance(old.base, DebianBase) else {}
        lines += _version_changes(f"{platform}: deb ", before, {d.name: d.version for d in new.base.debs(platform)})
    return lines


def _version_changes(prefix: str, before: dict[str, str], after: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(before) | set(after)):
        if name not in after:
            lines.append(f"{prefix}{name} {before[name]} removed")
        elif name not in before:
            lines.append(f"{prefix}{name} {after[name]} added")
        elif before[name] != after[name]:
            lines.append(f"{prefix}{name} {before[name]} -> {after[name]}")
    return lines


def upgrade(project: Project, stack_name: str, github: GitHub | None = None, now: datetime | None = None) -> tuple[Path, list[str]]:
    """Move the stack's resolution date to `now`, relock, and say what changed; on failure the stack
    file and the lock are left as they were."""
    stack_file = project.stack_file(stack_name)
    text = stack_file.read_text()
    old = _previous_lock(project, stack_name)
    moment = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic_write_text(stack_file, _set_resolved_at(text, moment))
    try:
        path = lock(project, stack_name, github, refresh_base=True)
    except BaseException:
        atomic_write_text(stack_file, text)
        raise
    return path, changes(old, load_lock(project, stack_name))


# --------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class CheckReport:
    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def load_lock(project: Project, stack_name: str) -> Lock:
    path = project.lock_file(stack_name)
    shown = path.relative_to(project.root) if path.is_relative_to(project.root) else path
    return read_lock(path, f"run `nox -s lock -- --stack {stack_name}`", shown)


def lock_digest(project: Project, stack_name: str) -> str:
    return sha256_file(project.lock_file(stack_name))


def check(project: Project, stack_name: str) -> CheckReport:
    """Offline: does the lock still describe the stack file, and do its patches match their hashes?"""
    lock_path = project.lock_file(stack_name)
    where = _relative(project, lock_path) if lock_path.exists() else str(lock_path)
    problems: list[str] = []
    warnings: list[str] = []
    from .stack import load_stack

    document = load_lock(project, stack_name)
    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)

    recorded = document.stack.sha256
    actual = sha256_file(stack_file)
    if recorded != actual:
        problems.append(
            f"{where}: stack.sha256: {_relative(project, stack_file)} changed since the lock "
            f"(lock has {recorded}, file has {actual}); run `nox -s lock -- --stack {stack_name}`"
        )
    if document.lock_version != LOCK_VERSION:
        problems.append(f"{where}: lock_version: is {document.lock_version}, this servestack writes {LOCK_VERSION}; re-lock")
    let_go = {u.package: u for u in document.unavailable}
    for i, entry in enumerate(document.unavailable):
        package = stack.package(entry.package)
        if package is None or package.if_unavailable is None:
            problems.append(
                f"{where}: unavailable[{i}]: {entry.package} {entry.version} could not be had from index "
                f"{entry.index!r} ({entry.why[:200]}), and {_relative(project, stack_file)} does not accept that: "
                f"configure the index and re-lock, or state the package's `if_unavailable`")
        else:
            warnings.append(f"{where}: unavailable[{i}]: {entry.package} {entry.version} is not in the image "
                            f"(index {entry.index!r}: {entry.why[:160]}); accepted because: {entry.accepted_because[:200]}")
    for platform in stack.platforms:
        wheels_here = document.wheels(platform)
        if not wheels_here:
            problems.append(f"{where}: platforms.{platform}: entry missing")
            continue
        names = {normalize(w.name) for w in wheels_here}
        for package in stack.packages:
            if normalize(package.name) not in names and normalize(package.name) not in let_go:
                problems.append(f"{where}: platforms.{platform}: no wheel for package {package.name}")
        known_indexes = {"pypi"} | {i.name for i in stack.indexes}
        for i, wheel in enumerate(wheels_here):
            for key in ("sha256", "filename", "version", "index"):
                if not getattr(wheel, key):
                    problems.append(f"{where}: platforms.{platform}[{i}].{key}: entry missing")
            if wheel.index and wheel.index not in known_indexes:
                problems.append(f"{where}: platforms.{platform}[{i}].index: {wheel.index!r} is not an index of the stack")
    for package in stack.packages:
        if normalize(package.name) not in document.packages and normalize(package.name) not in let_go:
            problems.append(f"{where}: packages.{normalize(package.name)}: entry missing")
    locked_prs = {(e.repo, e.number): e for e in document.pull_requests}
    for package in stack.packages:
        if normalize(package.name) in let_go:
            continue  # not locked: its PRs could not be looked for
        for pr in package.prs:
            entry = locked_prs.get((pr.repo, pr.number))
            label = f"pull_requests[{pr.repo}#{pr.number}]"
            if entry is None:
                problems.append(f"{where}: {label}: entry missing")
                continue
            if entry.status == "unverified":
                warnings.append(f"{where}: {label}: unverified ({(entry.unverified_reason or '')[:160]})")
            if entry.status == "overlay" and entry.patch:
                path = project.root / entry.patch.path
                if not path.is_file():
                    problems.append(f"{where}: {label}.patch: file {entry.patch.path} is missing")
                elif sha256_file(path) != entry.patch.sha256:
                    problems.append(
                        f"{where}: {label}.patch: {entry.patch.path} has sha256 {sha256_file(path)}, the lock says {entry.patch.sha256}"
                    )
    locked_patches = {e.file: e for e in document.local_patches}
    for package in stack.packages:
        for patch in package.patches:
            rel = _relative(project, project.patches / patch.file)
            entry = locked_patches.get(rel)
            label = f"local_patches[{rel}]"
            path = project.root / rel
            if entry is None:
                problems.append(f"{where}: {label}: entry missing")
            elif not path.is_file():
                problems.append(f"{where}: {label}: file {rel} is missing")
            elif sha256_file(path) != entry.sha256:
                problems.append(f"{where}: {label}: {rel} has sha256 {sha256_file(path)}, the lock says {entry.sha256}")
    return CheckReport(problems, warnings)
