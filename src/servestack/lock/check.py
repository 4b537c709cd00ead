"""`lock --check`: does the lock still describe its stack file? Offline, so every build runs it first.

It names the entry that no longer matches: the stack file's hash, a patch's hash, a package, PR or
platform the stack has and the lock lacks, a package let go without the stack's reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from servestack.lock import LOCK_VERSION, load_lock, relative
from servestack.util.fsutil import sha256_file
from servestack.util.project import Project
from servestack.wheels import normalize


@dataclass(frozen=True, kw_only=True)
class CheckReport:
    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def check(project: Project, stack_name: str) -> CheckReport:
    """Offline: does the lock still describe the stack file, and do its patches match their hashes?"""
    from servestack.records.stack import load_stack  # pydantic: only checking needs the stack's model

    lock_path = project.lock_file(stack_name)
    where = relative(project, lock_path) if lock_path.exists() else str(lock_path)
    problems: list[str] = []
    warnings: list[str] = []
    document = load_lock(project, stack_name)
    stack_file = project.stack_file(stack_name)
    stack = load_stack(stack_file)

    recorded = document.stack.sha256
    actual = sha256_file(stack_file)
    if recorded != actual:
        problems.append(
            f"{where}: stack.sha256: {relative(project, stack_file)} changed since the lock "
            f"(lock has {recorded}, file has {actual}); run `nox -s lock -- --stack {stack_name}`"
        )
    if document.lock_version != LOCK_VERSION:
        problems.append(f"{where}: lock_version: is {document.lock_version}, this servestack writes {LOCK_VERSION}; re-lock")
    let_go = {u.package: u for u in document.unavailable}
    for i, gone in enumerate(document.unavailable):
        package = stack.package(gone.package)
        if package is None or package.if_unavailable is None:
            problems.append(
                f"{where}: unavailable[{i}]: {gone.package} {gone.version} could not be had from index "
                f"{gone.index!r} ({gone.why[:200]}), and {relative(project, stack_file)} does not accept that: "
                f"configure the index and re-lock, or state the package's `if_unavailable`")
        else:
            warnings.append(f"{where}: unavailable[{i}]: {gone.package} {gone.version} is not in the image "
                            f"(index {gone.index!r}: {gone.why[:160]}); accepted because: {gone.accepted_because[:200]}")
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
            if entry.patch:
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
            rel = relative(project, project.patches / patch.file)
            held = locked_patches.get(rel)
            label = f"local_patches[{rel}]"
            path = project.root / rel
            if held is None:
                problems.append(f"{where}: {label}: entry missing")
            elif not path.is_file():
                problems.append(f"{where}: {label}: file {rel} is missing")
            elif sha256_file(path) != held.sha256:
                problems.append(f"{where}: {label}: {rel} has sha256 {sha256_file(path)}, the lock says {held.sha256}")
    return CheckReport(problems=problems, warnings=warnings)
