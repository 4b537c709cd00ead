"""The digest committed beside the lock (pins/<stack>.image.json): whether a build reproduced it, and
writing it when the build's bytecode was compiled by the image's own interpreter version."""

from __future__ import annotations

from pathlib import Path

from ..errors import ServestackError
from ..project import Project
from ..records.steps import ExpectedCheck, ExpectedImage, ImageRecord, read_expected
from ..records.steps import write_expected as write_expected_record


def expected_file(project: Project, stack: str) -> Path:
    return project.pins / f"{stack}.image.json"


UPDATE_COMMAND = "nox -s build -- --stack {stack} && nox -s image -- --stack {stack} --update-expected"


def check_expected(project: Project, stack: str, digest: str, lock_sha256: str) -> ExpectedCheck:
    """Whether this build reproduced the digest committed beside the lock.

    `reproduced`; `different` (same lock, another digest: this machine or this code makes other
    bytes); `stale` (the committed digest is for another lock); `none` (nothing committed).
    """
    path = expected_file(project, stack)
    shown = path.relative_to(project.root).as_posix()
    if not path.exists():
        return ExpectedCheck(shown, "none", None)
    committed = read_expected(path, f"run `{UPDATE_COMMAND.format(stack=stack)}`", shown)
    if committed.lock_sha256 != lock_sha256:
        status = "stale"
    else:
        status = "reproduced" if committed.digest == digest else "different"
    return ExpectedCheck(shown, status, committed.digest)


def write_expected(project: Project, stack: str, result: ImageRecord, image_version: str | None) -> Path:
    """Commit-ready pins/<stack>.image.json; refused when the bytecode was not compiled by the image's exact
    interpreter version (`image_version`, interpreter_version; None: not known), as then no machine that has
    that version makes this digest."""
    path = expected_file(project, stack)
    if image_version is not None and result.compiled_by != image_version:
        raise ServestackError(
            f"{path.relative_to(project.root)} not written: the image's interpreter is Python {image_version}, but this "
            f"build's bytecode was compiled by Python {result.compiled_by} (build/{stack}/image.json: compiled_by), so "
            f"others would not reproduce {result.digest}; put a python{image_version.rsplit('.', 1)[0]} of version "
            f"{image_version} on PATH (Debian's, e.g. /usr/bin) and build again")
    write_expected_record(path, ExpectedImage(stack, result.lock_sha256, result.platform, result.digest,
                                              UPDATE_COMMAND.format(stack=stack)))
    return path
