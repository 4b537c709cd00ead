"""The digests committed beside the lock (pins/<stack>.image.json): one manifest per platform and the
image index over them; whether a build reproduced its platform's, and writing it when the build's
bytecode was compiled by the image's own interpreter version."""

from __future__ import annotations

from pathlib import Path

from servestack.errors import ServestackError
from servestack.image import oci
from servestack.records.steps import ExpectedCheck, ExpectedImage, ImageRecord, PlatformImage, read_expected
from servestack.records.steps import write_expected as write_expected_record
from servestack.util.project import Project


def expected_file(project: Project, stack: str) -> Path:
    return project.pins / f"{stack}.image.json"


UPDATE_COMMAND = ("nox -s build -- --stack {stack} --platform PLATFORM && "
                  "nox -s image -- --stack {stack} --update-expected   (once for each of the lock's platforms)")


def read_committed(project: Project, stack: str) -> ExpectedImage | None:
    path = expected_file(project, stack)
    if not path.exists():
        return None
    return read_expected(path, f"run `{UPDATE_COMMAND.format(stack=stack)}`", path.relative_to(project.root).as_posix())


def check_expected(project: Project, stack: str, platform: str, digest: str, lock_sha256: str) -> ExpectedCheck:
    """Whether this build reproduced the digest committed beside the lock for its platform.

    `reproduced`; `different` (same lock, another digest: this machine or this code makes other
    bytes); `stale` (the committed digests are for another lock); `none` (nothing committed for this
    platform).
    """
    shown = expected_file(project, stack).relative_to(project.root).as_posix()
    committed = read_committed(project, stack)
    held = committed.platforms.get(platform) if committed else None
    if committed is None or (held is None and committed.lock_sha256 == lock_sha256):
        return ExpectedCheck(file=shown, status="none", digest=None)
    if committed.lock_sha256 != lock_sha256:
        return ExpectedCheck(file=shown, status="stale", digest=held.digest if held else None)
    assert held is not None
    return ExpectedCheck(file=shown, status="reproduced" if held.digest == digest else "different", digest=held.digest)


def index_of(platforms: dict[str, PlatformImage], lock_platforms: tuple[str, ...] | list[str]) -> str | None:
    """The image index's digest, once every platform of the lock has its manifest."""
    if set(platforms) != set(lock_platforms):
        return None
    return oci.index({name: (p.digest, p.size) for name, p in platforms.items()}).digest


def write_expected(project: Project, stack: str, result: ImageRecord, image_version: str | None,
                   lock_platforms: tuple[str, ...] | list[str]) -> Path:
    """Commit-ready pins/<stack>.image.json with this build's platform (the others' kept when they are for
    the same lock); refused when the bytecode was not compiled by the image's exact interpreter version
    (`image_version`, interpreter_version; None: not known), as then no machine that has that version
    makes this digest."""
    path = expected_file(project, stack)
    if image_version is not None and result.compiled_by != image_version:
        raise ServestackError(
            f"{path.relative_to(project.root)} not written: the image's interpreter is Python {image_version}, but this "
            f"build's bytecode was compiled by Python {result.compiled_by} (build/{stack}/image.json: compiled_by), so "
            f"others would not reproduce {result.digest}; put a python{image_version.rsplit('.', 1)[0]} of version "
            f"{image_version} on PATH (Debian's, e.g. /usr/bin) and build again")
    if result.manifest_size is None:
        raise ServestackError(f"build/{stack}/image.json has no manifest_size (made by an older servestack); run "
                              f"`nox -s image -- --stack {stack}` again")
    prior = read_committed(project, stack)
    kept = dict(prior.platforms) if prior and prior.lock_sha256 == result.lock_sha256 else {}
    platforms = {**kept, result.platform: PlatformImage(digest=result.digest, size=result.manifest_size)}
    write_expected_record(path, ExpectedImage(stack=stack, lock_sha256=result.lock_sha256, platforms=platforms,
                                              index=index_of(platforms, lock_platforms),
                                              update=UPDATE_COMMAND.format(stack=stack)))
    return path
