"""`pins/<stack>.lock`: every input of a stack resolved to an immutable hash.

The lock is canonical JSON (sorted keys, one value per line), so the same inputs give the same
bytes and a re-lock shows up in review as a readable diff. Resolving talks to the network
(package index, registry, GitHub, Debian); checking (`--check`) never does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cache, diffs, pairing, wheels
from .errors import InputError, NetworkError, ServestackError
from .fsutil import atomic_write_json, atomic_write_text, sha256_bytes, sha256_file
from .project import Project
from .sources import debian, pypi, registry
from .sources.github import GitHub, PullRequestNotFound
from .stack import PullRequest, Stack, load_stack, normalize

log = logging.getLogger("servestack.lock")

LOCK_VERSION = 1


def _relative(project: Project, path: Path) -> str:
    return path.resolve().relative_to(project.root.resolve()).as_posix()


def patch_path(project: Project, pr: PullRequest) -> Path:
    owner, name = pr.repo.split("/")
    return project.patches / f"{owner}__{name}-{pr.number}.diff"


# --------------------------------------------------------------------------- resolving


def _resolve_base(stack: Stack) -> dict[str, Any]:
    if stack.base.image:
        reference = stack.base.image
        digest = registry.resolve_digest(reference)
        return {"image": {"reference": reference, "digest": digest}}
    release = debian.release(stack.base.debian.suite)
    return {
        "debian": {
            "suite": release.suite,
            "packages": sorted(stack.base.debian.packages),
            "release_date": release.date,
            "release_sha256": release.sha256,
        }
    }


def _package_commit(wheel: pypi.LockedWheel | None, package) -> str | None:
    """The upstream commit the pinned package was built from: the git pin, or what the wheel records."""
    if package.git:
        return package.git.commit
    return wheels.read_wheel_commit(cache.fetch(wheel.url, wheel.sha256, wheel.filename))


def _unverified(pr: PullRequest, package: str, reason: str) -> dict[str, Any]:
    return {
        "repo": pr.repo,
        "number": pr.number,
        "package": package,
        "title": pr.title,
        "merge_commit": pr.merge_commit,
        "status": "unverified",
        "unverified_reason": reason,
    }


def _resolve_prs(
    project: Project, stack: Stack, stack_file: Path, wheels_by_name: dict[str, pypi.LockedWheel], github: GitHub
) -> tuple[list[dict[str, Any]], dict[str, str], dict[Path, str]]:
    """Classify every PR as included upstream or overlay; returns entries, package commits, patches to write."""
    entries: list[dict[str, Any]] = []
    commits: dict[str, str | None] = {}
    patches: dict[Path, str] = {}
    github_down: str | None = None
    for index, package in enumerate(stack.packages):
        if not package.prs:
            continue
        name = normalize(package.name)
        commits[name] = _package_commit(wheels_by_name.get(name), package)
        for pr_index, pr in enumerate(package.prs):
            field = f"packages[{index}].prs[{pr_index}]"
            if github_down:
                entries.append(_unverified(pr, name, github_down))
                continue
            try:
                info = github.pull_request(pr.repo, pr.number)
            except PullRequestNotFound as exc:
                raise InputError(stack_file, field, f"{pr.repo}#{pr.number} does not exist ({exc})") from None
            except NetworkError as exc:
                github_down = f"GitHub ({github.api}) was unreachable when this lock was made; recorded from the stack file"
                log.warning("%s", exc)
                log.warning("GitHub unreachable: PRs are recorded from the stack file, marked unverified")
                entries.append(_unverified(pr, name, github_down))
                continue
            if pr.merge_commit and info.merge_commit and pr.merge_commit != info.merge_commit:
                raise InputError(
                    stack_file, f"{field}.merge_commit",
                    f"{pr.repo}#{pr.number} was merged as {info.merge_commit}, not {pr.merge_commit}",
                )
            if not commits[name]:
                raise InputError(
                    stack_file, f"packages[{index}].prs",
                    f"the {package.name} wheel records no upstream commit, so its PRs cannot be classified; "
                    "pin the package by `git` (url + commit) instead",
                )
            entry: dict[str, Any] = {
                "repo": pr.repo,
                "number": pr.number,
                "package": name,
                "title": info.title,
                "state": info.state,
                "merged": info.merged,
                "head_sha": info.head_sha,
                "merge_commit": info.merge_commit,
                "files": list(info.files),
            }
            if info.merge_commit and github.is_ancestor(pr.repo, info.merge_commit, commits[name]):
                entry["status"] = "included"
            else:
                diff = github.diff(pr.repo, pr.number)
                path = patch_path(project, pr)
                patches[path] = diff
                entry["status"] = "overlay"
                entry["patch"] = {
                    "path": _relative(project, path),
                    "sha256": sha256_bytes(diff.encode()),
                    "python_only": not diffs.diff_native_files(diff),
                    "native_files": diffs.diff_native_files(diff),
                }
            entries.append(entry)
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


def resolve(project: Project, stack_name: str, github: GitHub | None = None) -> dict[str, Any]:
    """Resolve a stack into its lock document (nothing is written)."""
    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)
    if stack.name != stack_name:
        raise InputError(stack_file, "name", f"is {stack.name!r}, but the file is named for {stack_name!r}")
    platforms = {platform: pypi.resolve(stack, stack_file, platform) for platform in stack.platforms}
    for platform, resolved_wheels in platforms.items():
        pairing.check_locked(stack, stack_file, platform, resolved_wheels)
    first = platforms[stack.platforms[0]]
    by_name = {normalize(w.name): w for w in first}
    missing = [p.name for p in stack.packages if normalize(p.name) not in by_name]
    if missing:
        raise ServestackError(f"{stack_file}: packages {missing} did not resolve to any wheel")
    prs, commits, patches = _resolve_prs(project, stack, stack_file, by_name, github or GitHub())
    local_patches = _local_patches(project, stack, stack_file)
    base = _resolve_base(stack)
    uploads = [w.upload_time for ws in platforms.values() for w in ws if w.upload_time]
    epoch = max(uploads) if uploads else base.get("debian", {}).get("release_date", 0)
    document = {
        "lock_version": LOCK_VERSION,
        "stack": {"name": stack.name, "file": _relative(project, stack_file), "sha256": sha256_file(stack_file)},
        "python": stack.python,
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
    return {"document": document, "patches": patches}


def lock(project: Project, stack_name: str, github: GitHub | None = None) -> Path:
    """Resolve and write the lock; on any failure the previous lock is left as it was."""
    resolved = resolve(project, stack_name, github)
    for path, diff in sorted(resolved["patches"].items()):
        if not path.exists() or path.read_text() != diff:
            atomic_write_text(path, diff)
    out = project.lock_file(stack_name)
    atomic_write_json(out, resolved["document"])
    return out


# --------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class CheckReport:
    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def load_lock(project: Project, stack_name: str) -> dict[str, Any]:
    return project.read_json(project.lock_file(stack_name), f"run `nox -s lock -- --stack {stack_name}`")


def lock_digest(project: Project, stack_name: str) -> str:
    return sha256_file(project.lock_file(stack_name))


def check(project: Project, stack_name: str) -> CheckReport:
    """Offline: does the lock still describe the stack file, and do its patches match their hashes?"""
    lock_path = project.lock_file(stack_name)
    where = _relative(project, lock_path) if lock_path.exists() else str(lock_path)
    problems: list[str] = []
    warnings: list[str] = []
    document = load_lock(project, stack_name)
    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)

    recorded = document.get("stack", {}).get("sha256")
    actual = sha256_file(stack_file)
    if recorded != actual:
        problems.append(
            f"{where}: stack.sha256: {_relative(project, stack_file)} changed since the lock "
            f"(lock has {recorded}, file has {actual}); run `nox -s lock -- --stack {stack_name}`"
        )
    for key in ("python", "source_date_epoch", "base", "packages", "platforms", "pull_requests"):
        if key not in document:
            problems.append(f"{where}: {key}: entry missing")
    for platform in stack.platforms:
        wheels_here = document.get("platforms", {}).get(platform)
        if not wheels_here:
            problems.append(f"{where}: platforms.{platform}: entry missing")
            continue
        names = {normalize(w["name"]) for w in wheels_here}
        for package in stack.packages:
            if normalize(package.name) not in names:
                problems.append(f"{where}: platforms.{platform}: no wheel for package {package.name}")
        for i, wheel in enumerate(wheels_here):
            for key in ("url", "sha256", "filename", "version"):
                if not wheel.get(key):
                    problems.append(f"{where}: platforms.{platform}[{i}].{key}: entry missing")
    for package in stack.packages:
        if normalize(package.name) not in document.get("packages", {}):
            problems.append(f"{where}: packages.{normalize(package.name)}: entry missing")
    locked_prs = {(e["repo"], e["number"]): e for e in document.get("pull_requests", [])}
    for package in stack.packages:
        for pr in package.prs:
            entry = locked_prs.get((pr.repo, pr.number))
            label = f"pull_requests[{pr.repo}#{pr.number}]"
            if entry is None:
                problems.append(f"{where}: {label}: entry missing")
                continue
            if entry["status"] == "unverified":
                warnings.append(f"{where}: {label}: not verified against GitHub ({entry.get('unverified_reason', '')[:120]})")
            if entry["status"] == "overlay":
                patch = entry.get("patch") or {}
                path = project.root / patch.get("path", "")
                if not patch.get("path") or not path.is_file():
                    problems.append(f"{where}: {label}.patch: file {patch.get('path')} is missing")
                elif sha256_file(path) != patch.get("sha256"):
                    problems.append(
                        f"{where}: {label}.patch: {patch['path']} has sha256 {sha256_file(path)}, the lock says {patch.get('sha256')}"
                    )
    locked_patches = {e["file"]: e for e in document.get("local_patches", [])}
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
            elif sha256_file(path) != entry.get("sha256"):
                problems.append(f"{where}: {label}: {rel} has sha256 {sha256_file(path)}, the lock says {entry.get('sha256')}")
    return CheckReport(problems, warnings)
