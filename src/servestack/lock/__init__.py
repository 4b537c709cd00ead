"""`pins/<stack>.lock`: every input of a stack resolved to an immutable hash.

The lock is canonical JSON (sorted keys, one value per line), so the same inputs give the same
bytes and a re-lock shows up in review as a readable diff. Resolving talks to the network
(package index, registry, GitHub, Debian); checking (`--check`) never does.
"""

from __future__ import annotations

import zipfile
from dataclasses import fields, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servestack.errors import InputError, InputErrors, NetworkError, ServestackError
from servestack.lock import resolution_date
from servestack.lock.preferences import Upgrade
from servestack.records.lockfile import (
    DebianBase,
    Excluded,
    ImageBase,
    LocalPatch,
    Lock,
    LockedLink,
    LockedPackage,
    LockedPR,
    LockedWheel,
    OverlayPatch,
    PRHistory,
    SmokeModel,
    StackRef,
    Unavailable,
    UndatedIndex,
    read_lock,
    write_lock,
)
from servestack.sources import diffs
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_text, sha256_bytes, sha256_file
from servestack.util.project import Project
from servestack.wheels import normalize
from servestack.wheels.commit import read_wheel_commit

if TYPE_CHECKING:
    from servestack.records.stack import Package, PullRequest, Stack
    from servestack.sources import pypi
    from servestack.sources.github import GitHub, PullRequestInfo
    from servestack.sources.gitmirror import GitMirror

# The network clients (requests, GitHub, git mirrors, indexes) are imported by the resolving functions
# that use them: reading and checking a lock, which every build does, needs none of them; reading one
# (image, smoke) needs no stack model either (pydantic).

LOCK_VERSION = 3  # 3: a Debian base's packages, each by sha256


def relative(project: Project, path: Path) -> str:
    return path.resolve().relative_to(project.root.resolve()).as_posix()


def patch_path(project: Project, pr: PullRequest) -> Path:
    owner, name = pr.repo.split("/")
    return project.patches / f"{owner}__{name}-{pr.number}.diff"


# --------------------------------------------------------------------------- resolving


def _resolve_base(stack: Stack, previous: Lock | None, refresh: bool) -> DebianBase | ImageBase:
    """The base's lock entry. A Debian base is kept from the previous lock while the stack asks for the same
    suite, packages and platforms: like the wheels under `resolved_at`, it moves only on `--upgrade`, so a
    relock is byte-identical (and needs no archive) however the suite has moved since."""
    from servestack.lock.debian_base import resolve_suite
    from servestack.sources import registry

    if stack.base.image:
        reference = stack.base.image
        return ImageBase(reference=reference, digest=registry.resolve_digest(reference))
    wanted = stack.base.debian
    assert wanted is not None  # the stack's base is one of the two (records.stack.BaseImage)
    old = previous.base if previous is not None else None
    if (not refresh and isinstance(old, DebianBase) and old.suite == wanted.suite
            and sorted(old.packages) == sorted(wanted.packages) and sorted(old.resolved) == sorted(stack.platforms)):
        return old
    return resolve_suite(wanted.suite, list(wanted.packages), list(stack.platforms))


def _previous_lock(project: Project, stack_name: str) -> Lock | None:
    try:
        return load_lock(project, stack_name) if project.lock_file(stack_name).exists() else None
    except ServestackError:  # a lock this servestack cannot read (an older format) is replaced, not kept
        return None


def _with_sizes(found: list[pypi.FoundWheel]) -> list[pypi.FoundWheel]:
    """Every wheel with its size: an index that does not say it gets the file fetched (and verified)."""
    return [w if w.size is not None else replace(w, size=_pinned_wheel(w).stat().st_size) for w in found]


def _pinned_wheel(wheel: pypi.FoundWheel) -> Path:
    from servestack.sources import cache

    return cache.fetch(wheel.url, wheel.sha256, wheel.filename, origin=f"index {wheel.index!r}")


def _package_commit(path: Path | None, package: Package) -> str | None:
    """The upstream commit the pinned package was built from: the git pin, or what the wheel records."""
    if package.git:
        return package.git.commit
    return read_wheel_commit(path) if path else None


def _evidence(pr: PullRequest, archive: Path | None) -> list[tuple[int, dict[str, str], str | None, str]]:
    """Each evidence item checked in the pinned wheel's files: (index, item, problem, where found)."""
    from servestack.probe.static.evidence import evidence_problem

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
        from servestack.sources import gitmirror

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
        from servestack.sources.github import GitHub

        source = self._sources.get(repo)
        name = "GitHub's API" if isinstance(source, GitHub) else "its git mirror"
        self.down[repo] = f"{repo}'s history ({name}) was unreachable when this lock was made"
        console.warning("servestack.lock", f"{exc}")
        console.warning("servestack.lock", f"{self.down[repo]}: PRs rest on their evidence alone")


def _entry(pr: PullRequest, package: str, info: PullRequestInfo | None, status: str) -> LockedPR:
    return LockedPR(
        repo=pr.repo, number=pr.number, package=package, title=pr.title or (info.title if info else None),
        merge_commit=(info.merge_commit if info else None) or pr.merge_commit, status=status,
        merged=pr.merged or None,
        history=PRHistory(state=info.state, head_sha=info.head_sha, files=tuple(info.files)) if info else None,
    )


def _resolve_prs(
    project: Project, stack: Stack, stack_file: Path, wheels_by_name: dict[str, pypi.FoundWheel], github: GitHub
) -> tuple[tuple[LockedPR, ...], dict[str, str | None], dict[Path, str]]:
    """Classify every PR: included (by evidence in the pinned wheel and/or ancestry), overlay, or
    unverified (no evidence, no reachable history); returns entries, package commits, patches to write."""
    from servestack.errors import PullRequestNotFound

    entries: list[LockedPR] = []
    commits: dict[str, str | None] = {}
    patches: dict[Path, str] = {}
    histories = _Histories(stack, github)
    problems: list[InputError] = []
    for index, package in enumerate(stack.packages):
        if not package.prs:
            continue
        name = normalize(package.name)
        wheel = wheels_by_name.get(name)
        archive = _pinned_wheel(wheel) if wheel and not package.git else None
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
                    pinned_commit = commits[name]
                    if info.merge_commit and pinned_commit:
                        ancestor = source.is_ancestor(pr.repo, info.merge_commit, pinned_commit)
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
            found = tuple({**item, "found": where} if where else item for _, item, _, where in evidence)
            if ancestor is False and (missing or not evidence):
                assert source is not None  # ancestry was asked of it
                diff = source.diff(pr.repo, pr.number, merge_commit=pr.merge_commit)
                entry = replace(_entry(pr, name, info, "overlay"), evidence=found,
                                patch=_locked_diff(project, pr, diff, patches))
            elif missing:
                why = "its merge commit is an ancestor of the pinned commit, yet " if ancestor else ""
                problems += [
                    InputError(stack_file, f"{field}.evidence[{i}]",
                               f"{pr.label} ({pr.title or 'untitled'}): {why}the evidence is missing from {pinned}: {problem}")
                    for i, _, problem in missing
                ]
                continue
            elif ancestor or evidence:
                entry = replace(
                    _entry(pr, name, info, "included"), evidence=found,
                    verified_by=(("ancestry",) if ancestor else ()) + (("evidence",) if evidence else ()),
                    note=f"its merge commit is not an ancestor of {commits[name]}: present by evidence (a backport?)"
                    if ancestor is False else None)
                if pr.check:
                    entry = _diff_to_take_out(entry, project, pr, histories, patches)
            else:
                entry = replace(_entry(pr, name, info, "unverified"), evidence=found, unverified_reason=(
                    histories.down.get(pr.repo, "no evidence and no merge commit to check ancestry")
                    + "; the stack gives no evidence for it"
                ))
            entries.append(entry)
    if problems:
        raise InputErrors(problems)
    return tuple(sorted(entries, key=lambda e: (e.repo, e.number))), commits, patches


def _diff_to_take_out(entry: LockedPR, project: Project, pr: PullRequest, histories: _Histories,
                      patches: dict[Path, str]) -> LockedPR:
    """An included PR that names a check, with its diff, for the stack's variant without it, or why there is none."""
    source = histories.source(pr.repo)
    diff = None
    if source is not None:
        try:
            diff = source.diff(pr.repo, pr.number, merge_commit=pr.merge_commit)
        except NetworkError as exc:
            histories.fail(pr.repo, exc)
    if diff is None:
        return replace(entry, diff_unavailable=histories.down.get(pr.repo, f"{pr.repo}'s history could not be asked")
                       + "; its variant without it cannot be built from this lock")
    return replace(entry, patch=_locked_diff(project, pr, diff, patches))


def _locked_diff(project: Project, pr: PullRequest, diff: str, patches: dict[Path, str]) -> OverlayPatch:
    """A PR's diff, to be written to pins/patches/ (PATCHES), as its lock entry's `patch`."""
    path = patch_path(project, pr)
    patches[path] = diff
    native = diffs.diff_native_files(diff)
    return OverlayPatch(path=relative(project, path), sha256=sha256_bytes(diff.encode()), python_only=not native,
                        native_files=tuple(native))


def _local_patches(project: Project, stack: Stack, stack_file: Path) -> tuple[LocalPatch, ...]:
    """Each local patch hashed, with what it touches (overlays are Python-only: build refuses native files)."""
    entries = []
    for index, package in enumerate(stack.packages):
        for patch_index, patch in enumerate(package.patches):
            path = project.patches / patch.file
            if not path.is_file():
                raise InputError(stack_file, f"packages[{index}].patches[{patch_index}].file",
                                 f"{relative(project, path)} does not exist (a local patch lives in pins/patches/)")
            diff = path.read_text()
            if not diffs.touched_files(diff):
                raise InputError(path, "diff", "changes no file (expected a unified diff in the wheel's paths)")
            native = diffs.diff_native_files(diff)
            entries.append(LocalPatch(package=normalize(package.name), file=relative(project, path),
                                      sha256=sha256_file(path), reason=patch.reason, python_only=not native,
                                      native_files=tuple(native)))
    return tuple(sorted(entries, key=lambda e: (e.package, e.file)))


def resolve(project: Project, stack_name: str, github: GitHub | None = None, *, refresh_base: bool = False,
            upgrade: Upgrade = Upgrade(), resolved_at: str | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Resolve a stack into its lock (`lock`), the PR patches to write (`patches`) and what moved since the
    previous lock (`moves`); nothing is written. The previous lock's versions are kept unless UPGRADE
    covers them or their stack entry changed. `refresh_base`: resolve a Debian base's packages again
    from the suite as it is now; `resolved_at`: resolve as of this moment instead of the stack's."""
    from servestack.lock import drift, pairing
    from servestack.lock.preferences import changed_entries, preferred
    from servestack.records.stack import load_stack
    from servestack.sources import pypi
    from servestack.sources.github import GitHub

    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)
    if stack.name != stack_name:
        raise InputError(stack_file, "name", f"is {stack.name!r}, but the file is named for {stack_name!r}")
    if resolved_at:
        stack = stack.model_copy(update={"resolved_at": resolved_at})
    resolution_date.refuse_future(stack.resolved_at, stack_file, now)
    # What the stack lets go and its index cannot give here is left out of the resolution, with the
    # indexes only it used (an index without a location cannot be passed to uv).
    unavailable = pypi.unavailable(stack, stack_file)
    let_go = [p for p in stack.packages if normalize(p.name) in unavailable]
    wanted = [p for p in stack.packages if normalize(p.name) not in unavailable]
    dropped = {p.index for p in let_go} - {p.index for p in wanted}
    stack = stack.model_copy(update={"packages": wanted, "indexes": [i for i in stack.indexes if i.name not in dropped]})
    previous = _previous_lock(project, stack_name)
    changed = changed_entries(previous, {normalize(p.name): p.requirement for p in stack.packages})
    undated = _undated_default_index(stack, stack_file)
    platforms = {platform: _with_sizes(pypi.resolve(
        stack, stack_file, platform, dated=not undated,
        preferences=preferred(previous, platform, upgrade=upgrade, changed=changed))) for platform in stack.platforms}
    for platform, resolved_wheels in platforms.items():
        pairing.check_locked(stack, stack_file, platform, resolved_wheels)
    first = platforms[stack.platforms[0]]
    by_name = {normalize(w.name): w for w in first}
    missing = [p.name for p in stack.packages if normalize(p.name) not in by_name]
    if missing:
        raise ServestackError(f"{stack_file}: packages {missing} did not resolve to any wheel")
    prs, commits, patches = _resolve_prs(project, stack, stack_file, by_name, github or GitHub())
    local_patches = _local_patches(project, stack, stack_file)
    base = _resolve_base(stack, previous, refresh_base)
    uploads = [w.upload_time for ws in platforms.values() for w in ws if w.upload_time]
    epoch = max(uploads) if uploads else base.release_date if isinstance(base, DebianBase) else 0
    locked = Lock(
        lock_version=LOCK_VERSION,
        stack=StackRef(name=stack.name, file=relative(project, stack_file), sha256=sha256_file(stack_file)),
        python=stack.python,
        resolved_at=stack.resolved_at,
        source_date_epoch=epoch,
        base=base,
        environment=dict(sorted(stack.environment.items())),
        excluded=tuple(Excluded(name=e.name, reason=e.reason) for e in sorted(stack.exclude, key=lambda e: e.name)),
        packages={normalize(p.name): LockedPackage(version=by_name[normalize(p.name)].version, requirement=p.requirement,
                                                   commit=commits.get(normalize(p.name)))
                  for p in stack.packages},
        platforms={platform: tuple(_as_locked(w) for w in ws) for platform, ws in sorted(platforms.items())},
        pull_requests=prs,
        local_patches=local_patches,
        smoke_model=SmokeModel(**stack.smoke_model.model_dump(exclude_none=True)),
        fast_path=stack.fast_path.model_dump(exclude_none=True) if stack.fast_path else None,
        links={path: LockedLink(target=link.target, reason=link.reason) for path, link in sorted(stack.links.items())},
        gpu_node=stack.gpu_node.model_dump(exclude_none=True) if stack.gpu_node else None,
        unavailable=tuple(Unavailable(package=normalize(p.name), version=str(p.version), index=str(p.index),
                                      why=unavailable[normalize(p.name)], accepted_because=str(p.if_unavailable))
                          for p in let_go),
        undated_indexes=(undated,) if undated else (),
        file=project.lock_file(stack_name),
    )
    return {"lock": locked, "patches": patches, "previous": previous,
            "moves": drift.moves(previous, locked, upgrade=upgrade, changed=changed)}


def _as_locked(wheel: pypi.FoundWheel) -> LockedWheel:
    """The lock's entry of a wheel an index offered (without where it was found and when it was uploaded)."""
    return LockedWheel(**{f.name: getattr(wheel, f.name) for f in fields(LockedWheel)})


def _undated_default_index(stack: Stack, stack_file: Path) -> UndatedIndex | None:
    """The default index, when the stack has a date and that index serves no upload times to hold it to."""
    from servestack.sources import pypi
    from servestack.sources.indexes import DEFAULT_INDEX

    first = next((p for p in stack.packages if p.index in (None, DEFAULT_INDEX)), None)
    if not stack.resolved_at or first is None:
        return None
    location = pypi.index_locations(stack, stack_file)[0]
    if resolution_date.serves_upload_times(location, normalize(first.name)):
        return None
    return resolution_date.undated(location, stack.resolved_at)


def write(project: Project, stack_name: str, resolved: dict[str, Any]) -> Path:
    """Write what `resolve` gave: the PR patches, then the lock."""
    for path, diff in sorted(resolved["patches"].items()):
        if not path.exists() or path.read_text() != diff:
            atomic_write_text(path, diff)
    out = project.lock_file(stack_name)
    write_lock(out, resolved["lock"])
    return out


def lock(project: Project, stack_name: str, github: GitHub | None = None, *, refresh_base: bool = False,
         upgrade: Upgrade = Upgrade()) -> Path:
    """Resolve and write the lock; on any failure the previous lock is left as it was."""
    return write(project, stack_name, resolve(project, stack_name, github, refresh_base=refresh_base, upgrade=upgrade))


def load_lock(project: Project, stack_name: str) -> Lock:
    path = project.lock_file(stack_name)
    return read_lock(path, f"run `nox -s lock -- --stack {stack_name}`", project.shown(path))


def lock_digest(project: Project, stack_name: str) -> str:
    return sha256_file(project.lock_file(stack_name))
