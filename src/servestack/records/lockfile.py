"""`pins/<stack>.lock` as a typed record: its one reader (`read_lock`) and one writer (`write_lock`).

`Lock.to_json()` gives back exactly the document `from_json` read (same keys, same optional keys
left out), so a lock re-written by servestack is byte-identical, and the image, which carries the
lock as JSON, keeps its digest. Fields whose content another owner defines (a PR's evidence items,
the stack's fast_path, the smoke model's `make` spec) stay plain JSON here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.records.fields import Fields, read_record, write_record

PR_STATUSES = ("included", "overlay", "unverified")


def _omit_none(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class StackRef:
    name: str
    file: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class LockedDeb:
    """One .deb of a Debian base, as the suite's Packages index gave it."""

    name: str
    version: str
    architecture: str
    size: int
    sha256: str
    filename: str  # below the archive root, e.g. pool/main/b/bash/bash_5.2.15-2+b13_amd64.deb

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "architecture": self.architecture,
                "size": self.size, "sha256": self.sha256, "filename": self.filename}


def _deb(f: Fields) -> LockedDeb:
    f.only("name", "version", "architecture", "size", "sha256", "filename")
    return LockedDeb(name=f.str("name"), version=f.str("version"), architecture=f.str("architecture"), size=f.int("size"), sha256=f.str("sha256"),
                     filename=f.str("filename"))


@dataclass(frozen=True, kw_only=True)
class DebianBase:
    suite: str
    packages: tuple[str, ...]  # what the stack asks for; `resolved` adds the essential set and dependencies
    release_date: int  # of the signed Release the packages were resolved from
    release_sha256: str
    index: str  # by name: where it is, is configuration (sources.debian.archive)
    resolved: dict[str, tuple[LockedDeb, ...]]  # platform -> every package of the base, by name

    def to_json(self) -> dict[str, Any]:
        return {"debian": {"suite": self.suite, "packages": list(self.packages), "release_date": self.release_date,
                           "release_sha256": self.release_sha256, "index": self.index,
                           "resolved": {p: [d.to_json() for d in debs] for p, debs in sorted(self.resolved.items())}}}

    def debs(self, platform: str) -> tuple[LockedDeb, ...]:
        return self.resolved.get(platform, ())


@dataclass(frozen=True, kw_only=True)
class ImageBase:
    reference: str
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"image": {"reference": self.reference, "digest": self.digest}}


def read_base(f: Fields) -> DebianBase | ImageBase:
    if f.has("image"):
        f.only("image")
        i = f.obj("image")
        i.only("reference", "digest")
        return ImageBase(reference=i.str("reference"), digest=i.str("digest"))
    f.only("debian")
    d = f.obj("debian")
    d.only("suite", "packages", "release_date", "release_sha256", "index", "resolved")
    resolved = d.obj("resolved")
    return DebianBase(suite=d.str("suite"), packages=d.strs("packages"), release_date=d.int("release_date"), release_sha256=d.str("release_sha256"),
                      index=d.str("index"), resolved={platform: resolved.items(platform, _deb) for platform in sorted(resolved.data)})


@dataclass(frozen=True, kw_only=True)
class Excluded:
    name: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class LockedPackage:
    version: str
    requirement: str
    commit: str | None  # the upstream commit it was built from, when known


@dataclass(frozen=True, kw_only=True)
class LockedWheel:
    name: str
    version: str
    filename: str
    sha256: str
    size: int | None
    index: str  # the index's name in the stack file: where it is, is this machine's configuration

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "filename": self.filename, "sha256": self.sha256,
                "size": self.size, "index": self.index}


def _wheel(f: Fields) -> LockedWheel:
    if f.has("url"):
        raise f.error("url", "a lock names the index, never a URL; re-lock")
    f.only("name", "version", "filename", "sha256", "size", "index")
    return LockedWheel(name=f.str("name"), version=f.str("version"), filename=f.str("filename"), sha256=f.str("sha256"), size=f.int_or_none("size", None),
                       index=f.str("index"))


@dataclass(frozen=True, kw_only=True)
class OverlayPatch:
    path: str  # relative to the project
    sha256: str
    python_only: bool
    native_files: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "python_only": self.python_only,
                "native_files": list(self.native_files)}


@dataclass(frozen=True, kw_only=True)
class PRHistory:
    """What the PR's history source (GitHub or a git mirror) said, when it could be asked."""
    state: str | None
    head_sha: str | None
    files: tuple[str, ...]


def _evidence_item(f: Fields) -> dict[str, str]:
    wrong = [key for key, value in f.data.items() if not isinstance(value, str)]
    if wrong:
        raise f.error(wrong[0], "expected a string (an evidence item is an object of strings)")
    return dict(f.data)


@dataclass(frozen=True, kw_only=True)
class LockedPR:
    repo: str
    number: int
    package: str
    title: str | None
    merge_commit: str | None
    status: str  # one of PR_STATUSES
    merged: str | None = None
    history: PRHistory | None = None
    evidence: tuple[dict[str, str], ...] = ()  # the stack's evidence items, each with where it was found
    # The PR's diff: applied onto the wheel (status overlay), or, for an included PR whose stack entry
    # names a check, what the stack's variant without it takes out (smoke/ablation.py).
    patch: OverlayPatch | None = None
    diff_unavailable: str | None = None  # an included PR with a check whose diff could not be had, and why
    verified_by: tuple[str, ...] = ()  # status included: "ancestry" and/or "evidence"
    note: str | None = None
    unverified_reason: str | None = None  # status unverified

    @property
    def label(self) -> str:
        return f"{self.repo}#{self.number}"

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"repo": self.repo, "number": self.number, "package": self.package,
                                    "title": self.title, "merge_commit": self.merge_commit, "status": self.status}
        optional = {
            "merged": self.merged,
            "evidence": [dict(e) for e in self.evidence] or None,
            "patch": self.patch.to_json() if self.patch else None,
            "verified_by": list(self.verified_by) or None,
            "note": self.note,
            "unverified_reason": self.unverified_reason,
            "diff_unavailable": self.diff_unavailable,
        }
        document.update(_omit_none(optional))
        if self.history:
            document.update(state=self.history.state, head_sha=self.history.head_sha, files=list(self.history.files))
        return document

    @classmethod
    def from_json(cls, f: Fields) -> "LockedPR":
        f.only("repo", "number", "package", "title", "merge_commit", "status", "merged", "state", "head_sha", "files",
               "evidence", "patch", "verified_by", "note", "unverified_reason", "diff_unavailable")
        status = f.str("status")
        if status not in PR_STATUSES:
            raise f.error("status", f"is {status!r}, expected one of {', '.join(PR_STATUSES)}")
        history = None
        if f.has("state"):
            history = PRHistory(state=f.str_or_none("state"), head_sha=f.str_or_none("head_sha"), files=f.strs("files"))
        patch = None
        if f.has("patch"):
            p = f.obj("patch")
            p.only("path", "sha256", "python_only", "native_files")
            patch = OverlayPatch(path=p.str("path"), sha256=p.str("sha256"), python_only=p.bool("python_only"), native_files=p.strs("native_files"))
        if status == "overlay" and patch is None:
            raise f.error("patch", "missing (an overlay PR names its patch file)")
        return cls(
            repo=f.str("repo"), number=f.int("number"), package=f.str("package"), title=f.str_or_none("title"),
            merge_commit=f.str_or_none("merge_commit"), status=status, merged=f.str_or_none("merged", None),
            history=history, evidence=f.items("evidence", _evidence_item, ()),
            patch=patch, verified_by=f.strs("verified_by", ()), note=f.str_or_none("note", None),
            unverified_reason=f.str_or_none("unverified_reason", None),
            diff_unavailable=f.str_or_none("diff_unavailable", None),
        )


@dataclass(frozen=True, kw_only=True)
class LocalPatch:
    package: str
    file: str  # relative to the project (pins/patches/...)
    sha256: str
    reason: str
    python_only: bool
    native_files: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "file": self.file, "sha256": self.sha256, "reason": self.reason,
                "python_only": self.python_only, "native_files": list(self.native_files)}


def _local_patch(f: Fields) -> LocalPatch:
    f.only("package", "file", "sha256", "reason", "python_only", "native_files")
    return LocalPatch(package=f.str("package"), file=f.str("file"), sha256=f.str("sha256"), reason=f.str("reason"), python_only=f.bool("python_only"),
                      native_files=f.strs("native_files"))


@dataclass(frozen=True, kw_only=True)
class SmokeModel:
    name: str
    path: str | None = None  # a model directory on the serving host
    make: dict[str, Any] | None = None  # a tiny model the build makes (tinymodel.TinyModelSpec fields)
    config: dict[str, Any] | None = None  # a `path` model's kernel shapes, recorded from its checkpoint
    ready_timeout_s: float | None = None  # how long smoke gives each serving shape (None: smoke's default)

    def to_json(self) -> dict[str, Any]:
        return _omit_none({"name": self.name, "path": self.path, "make": self.make, "config": self.config,
                           "ready_timeout_s": self.ready_timeout_s})


@dataclass(frozen=True, kw_only=True)
class Unavailable:
    """A package the stack pins on a named index that could not be had where the lock was made."""

    package: str
    version: str
    index: str
    why: str  # what locking found (no location configured, the index did not answer, no such file)
    accepted_because: str  # the stack's `if_unavailable`: without it the package fails the lock

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "index": self.index, "why": self.why,
                "accepted_because": self.accepted_because}

    @classmethod
    def from_json(cls, f: Fields) -> "Unavailable":
        f.only("package", "version", "index", "why", "accepted_because")
        accepted = f.str("accepted_because")
        if not accepted.strip():
            raise f.error("accepted_because", "empty (expected the stack's `if_unavailable`: why an image without "
                                              "this package is acceptable; without one the package must be locked)")
        return cls(package=f.str("package"), version=f.str("version"), index=f.str("index"), why=f.str("why"), accepted_because=accepted)


@dataclass(frozen=True, kw_only=True)
class UndatedIndex:
    """An index the lock's `resolved_at` could not be applied to: it serves no upload times."""

    index: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"index": self.index, "why": self.why}

    @classmethod
    def from_json(cls, f: Fields) -> "UndatedIndex":
        f.only("index", "why")
        return cls(index=f.str("index"), why=f.str("why"))


@dataclass(frozen=True, kw_only=True)
class Lock:
    lock_version: int
    stack: StackRef
    python: str
    resolved_at: str | None
    source_date_epoch: int
    base: DebianBase | ImageBase
    environment: dict[str, str]
    excluded: tuple[Excluded, ...]
    packages: dict[str, LockedPackage]  # normalized name -> what the stack declared
    platforms: dict[str, tuple[LockedWheel, ...]]
    pull_requests: tuple[LockedPR, ...]
    smoke_model: SmokeModel
    local_patches: tuple[LocalPatch, ...] = ()
    fast_path: dict[str, Any] | None = None  # stack.FastPath, as the stack file gives it
    links: dict[str, dict[str, str]] = field(default_factory=dict)  # image path -> stack.Link
    gpu_node: dict[str, Any] | None = None  # stack.GpuNode, as the stack file gives it
    unavailable: tuple[Unavailable, ...] = ()
    undated_indexes: tuple[UndatedIndex, ...] = ()  # written only when there is one: older locks keep their bytes
    file: Path | str = field(default="", compare=False)  # where it was read from, for messages

    def wheels(self, platform: str) -> tuple[LockedWheel, ...]:
        return self.platforms.get(platform, ())

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "lock_version": self.lock_version,
            "stack": {"name": self.stack.name, "file": self.stack.file, "sha256": self.stack.sha256},
            "python": self.python,
            "resolved_at": self.resolved_at,
            "source_date_epoch": self.source_date_epoch,
            "base": self.base.to_json(),
            "environment": dict(sorted(self.environment.items())),
            "excluded": [{"name": e.name, "reason": e.reason} for e in self.excluded],
            "packages": {name: {"version": p.version, "requirement": p.requirement, "commit": p.commit}
                         for name, p in self.packages.items()},
            "platforms": {platform: [w.to_json() for w in ws] for platform, ws in sorted(self.platforms.items())},
            "pull_requests": [pr.to_json() for pr in self.pull_requests],
            "smoke_model": self.smoke_model.to_json(),
        }
        if self.local_patches:
            document["local_patches"] = [p.to_json() for p in self.local_patches]
        if self.fast_path is not None:
            document["fast_path"] = self.fast_path
        if self.links:
            document["links"] = self.links
        if self.gpu_node is not None:
            document["gpu_node"] = self.gpu_node
        if self.unavailable:
            document["unavailable"] = [u.to_json() for u in self.unavailable]
        if self.undated_indexes:
            document["undated_indexes"] = [u.to_json() for u in self.undated_indexes]
        return document

    @classmethod
    def from_json(cls, f: Fields) -> "Lock":
        f.only("lock_version", "stack", "python", "resolved_at", "source_date_epoch", "base", "environment", "excluded",
               "packages", "platforms", "pull_requests", "local_patches", "smoke_model", "fast_path",
               "links", "gpu_node", "unavailable", "undated_indexes")
        stack = f.obj("stack")
        stack.only("name", "file", "sha256")
        model = f.obj("smoke_model")
        model.only("name", "path", "make", "config", "ready_timeout_s")
        if model.has("make"):
            model.obj("make")  # an object (its fields are the tiny model's spec)

        def package(p: Fields) -> LockedPackage:
            p.only("version", "requirement", "commit")
            return LockedPackage(version=p.str("version"), requirement=p.str("requirement"), commit=p.str_or_none("commit"))

        def excluded(e: Fields) -> Excluded:
            e.only("name", "reason")
            return Excluded(name=e.str("name"), reason=e.str("reason"))

        platforms = f.obj("platforms")
        return cls(
            lock_version=f.int("lock_version"),
            stack=StackRef(name=stack.str("name"), file=stack.str("file"), sha256=stack.str("sha256")),
            python=f.str("python"),
            resolved_at=f.str_or_none("resolved_at"),
            source_date_epoch=f.int("source_date_epoch"),
            base=read_base(f.obj("base")),
            environment=f.str_map("environment"),
            excluded=f.items("excluded", excluded),
            packages=f.entries("packages", package),
            platforms={name: platforms.items(name, _wheel) for name in platforms.data},
            pull_requests=f.items("pull_requests", LockedPR.from_json),
            smoke_model=SmokeModel(name=model.str("name"), path=model.str_or_none("path", None), make=model.json("make", None),
                                   config=model.json("config", None), ready_timeout_s=model.number("ready_timeout_s", None)),
            local_patches=f.items("local_patches", _local_patch, ()),
            fast_path=f.obj("fast_path").data if f.has("fast_path") else None,
            links=f.entries("links", _link, {}),
            gpu_node=f.obj("gpu_node").data if f.has("gpu_node") else None,
            unavailable=f.items("unavailable", Unavailable.from_json, ()),
            undated_indexes=f.items("undated_indexes", UndatedIndex.from_json, ()),
            file=f.file,
        )


def _link(f: Fields) -> dict[str, str]:
    f.only("target", "reason")
    return {"target": f.str("target"), "reason": f.str("reason")}


def read_lock(path: Path, remedy: str = "", shown: Path | str | None = None) -> Lock:
    return read_record(path, Lock.from_json, remedy, shown)


def write_lock(path: Path, lock: Lock) -> None:
    write_record(path, lock.to_json())
