"""`pins/<stack>.lock` as a typed record: its one reader (`read_lock`) and one writer (`write_lock`).

`Lock.to_json()` gives back exactly the document `from_json` read (same keys, same optional keys
left out), so a lock re-written by servestack is byte-identical, and the image, which carries the
lock as JSON, keeps its digest. Fields whose content another owner defines (a PR's evidence items,
the stack's fast_path, the smoke model's `make` spec) stay plain JSON here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

from servestack.records.codec import Record, decode, json_quirks, one_of
from servestack.records.fields import Fields, read_record, write_record

PR_STATUSES = ("included", "overlay", "unverified")


@dataclass(frozen=True, kw_only=True)
class StackRef(Record):
    name: str
    file: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class LockedDeb(Record):
    """One .deb of a Debian base, as the suite's Packages index gave it."""

    name: str
    version: str
    architecture: str
    size: int
    sha256: str
    filename: str  # below the archive root, e.g. pool/main/b/bash/bash_5.2.15-2+b13_amd64.deb


@dataclass(frozen=True, kw_only=True)
class DebianBase(Record):
    suite: str
    packages: tuple[str, ...]  # what the stack asks for; `resolved` adds the essential set and dependencies
    release_date: int  # of the signed Release the packages were resolved from
    release_sha256: str
    index: str  # by name: where it is, is configuration (sources.debian.archive)
    resolved: dict[str, tuple[LockedDeb, ...]]  # platform -> every package of the base, by name

    def debs(self, platform: str) -> tuple[LockedDeb, ...]:
        return self.resolved.get(platform, ())


@dataclass(frozen=True, kw_only=True)
class ImageBase(Record):
    reference: str
    digest: str


# The lock's `base` names its kind by its one key: {"image": ...} or {"debian": ...}.
BASE_KINDS: dict[str, type[Record]] = {"image": ImageBase, "debian": DebianBase}


@dataclass(frozen=True, kw_only=True)
class Excluded(Record):
    name: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class LockedPackage(Record):
    version: str
    requirement: str
    commit: str | None  # the upstream commit it was built from, when known


@dataclass(frozen=True, kw_only=True)
class LockedWheel(Record):
    name: str
    version: str
    filename: str
    sha256: str
    size: int | None = None
    index: str  # the index's name in the stack file: where it is, is this machine's configuration

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        if f.has("url"):
            raise f.error("url", "a lock names the index, never a URL; re-lock")
        return decode(cls, f)


@dataclass(frozen=True, kw_only=True)
class OverlayPatch(Record):
    path: str  # relative to the project
    sha256: str
    python_only: bool
    native_files: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PRHistory(Record):
    """What the PR's history source (GitHub or a git mirror) said, when it could be asked."""
    state: str | None
    head_sha: str | None
    files: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class LockedPR(Record):
    repo: str
    number: int
    package: str
    title: str | None
    merge_commit: str | None
    status: str = field(metadata=json_quirks(check=one_of(*PR_STATUSES)))
    # The fields below are written only when set.
    merged: str | None = field(default=None, metadata=json_quirks(omit=True))
    # its keys (state, head_sha, files) sit beside the PR's own
    history: PRHistory | None = field(default=None, metadata=json_quirks(inline=True))
    # the stack's evidence items, each with where it was found
    evidence: tuple[dict[str, str], ...] = field(default=(), metadata=json_quirks(omit=True))
    # The PR's diff: applied onto the wheel (status overlay), or, for an included PR whose stack entry
    # names a check, what the stack's variant without it takes out (smoke/ablation.py).
    patch: OverlayPatch | None = field(default=None, metadata=json_quirks(omit=True))
    # an included PR with a check whose diff could not be had, and why
    diff_unavailable: str | None = field(default=None, metadata=json_quirks(omit=True))
    # status included: "ancestry" and/or "evidence"
    verified_by: tuple[str, ...] = field(default=(), metadata=json_quirks(omit=True))
    note: str | None = field(default=None, metadata=json_quirks(omit=True))
    unverified_reason: str | None = field(default=None, metadata=json_quirks(omit=True))  # status unverified

    @property
    def label(self) -> str:
        return f"{self.repo}#{self.number}"

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        pr = decode(cls, f)
        if pr.status == "overlay" and pr.patch is None:
            raise f.error("patch", "missing (an overlay PR names its patch file)")
        return pr


@dataclass(frozen=True, kw_only=True)
class LocalPatch(Record):
    package: str
    file: str  # relative to the project (pins/patches/...)
    sha256: str
    reason: str
    python_only: bool
    native_files: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SmokeModel(Record):
    name: str
    # a model directory on the serving host
    path: str | None = field(default=None, metadata=json_quirks(omit=True))
    # a tiny model the build makes (tinymodel.TinyModelSpec fields)
    make: dict[str, Any] | None = field(default=None, metadata=json_quirks(omit=True))
    # a `path` model's kernel shapes, recorded from its checkpoint
    config: dict[str, Any] | None = field(default=None, metadata=json_quirks(omit=True))
    # how long smoke gives each serving shape (None: smoke's default)
    ready_timeout_s: float | None = field(default=None, metadata=json_quirks(omit=True))


def _a_reason(accepted_because: str) -> str | None:
    return None if accepted_because.strip() else (
        "empty (expected the stack's `if_unavailable`: why an image without "
        "this package is acceptable; without one the package must be locked)")


@dataclass(frozen=True, kw_only=True)
class Unavailable(Record):
    """A package the stack pins on a named index that could not be had where the lock was made."""

    package: str
    version: str
    index: str
    why: str  # what locking found (no location configured, the index did not answer, no such file)
    # the stack's `if_unavailable`: without it the package fails the lock
    accepted_because: str = field(metadata=json_quirks(check=_a_reason))


@dataclass(frozen=True, kw_only=True)
class UndatedIndex(Record):
    """An index the lock's `resolved_at` could not be applied to: it serves no upload times."""

    index: str
    why: str


@dataclass(frozen=True, kw_only=True)
class LockedLink(Record):
    """A symlink the image's top layer adds (stack.Link): the installed file `target` matches, and why."""

    target: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Lock(Record):
    lock_version: int
    stack: StackRef
    python: str
    resolved_at: str | None
    source_date_epoch: int
    base: DebianBase | ImageBase = field(metadata=json_quirks(tags=BASE_KINDS))
    environment: dict[str, str]
    excluded: tuple[Excluded, ...]
    packages: dict[str, LockedPackage]  # normalized name -> what the stack declared
    platforms: dict[str, tuple[LockedWheel, ...]]
    pull_requests: tuple[LockedPR, ...]
    smoke_model: SmokeModel
    # The fields below are written only when set: older locks keep their bytes.
    local_patches: tuple[LocalPatch, ...] = field(default=(), metadata=json_quirks(omit=True))
    # stack.FastPath, as the stack file gives it
    fast_path: dict[str, Any] | None = field(default=None, metadata=json_quirks(omit=True))
    # image path -> stack.Link
    links: dict[str, LockedLink] = field(default_factory=dict, metadata=json_quirks(omit=True))
    # stack.GpuNode, as the stack file gives it
    gpu_node: dict[str, Any] | None = field(default=None, metadata=json_quirks(omit=True))
    unavailable: tuple[Unavailable, ...] = field(default=(), metadata=json_quirks(omit=True))
    undated_indexes: tuple[UndatedIndex, ...] = field(default=(), metadata=json_quirks(omit=True))
    # where it was read from, for messages
    file: Path | str = field(default="", compare=False, metadata=json_quirks(written=False))

    def wheels(self, platform: str) -> tuple[LockedWheel, ...]:
        return self.platforms.get(platform, ())

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        return replace(decode(cls, f), file=f.file)


def read_lock(path: Path, remedy: str = "", shown: Path | str | None = None) -> Lock:
    return read_record(path, Lock.from_json, remedy, shown)


def write_lock(path: Path, lock: Lock) -> None:
    write_record(path, lock.to_json())
