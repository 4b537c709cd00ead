"""The build and image steps' records as typed values, each with one reader and one writer.

    build/<stack>/build.json   BuildRecord     what `build` fetched, verified and overlaid
    build/<stack>/image.json   ImageRecord     the image `image` pushed, by digest
    pins/<stack>.image.json    ExpectedImage   the digest committed for the committed lock
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.records.fields import Fields, read_record, write_record
from servestack.records.imageref import ImageRef

# --------------------------------------------------------------------------- build.json


@dataclass(frozen=True, kw_only=True)
class BuildInput:
    """A verified wheel the image installs (or a metadata-only alias standing for one)."""
    name: str
    version: str
    filename: str
    sha256: str
    path: str
    declared: bool  # the stack file names the package
    replaced_by: str | None  # the overlaid wheel installed instead
    alias_of: str | None = None
    # The wheel's licence as its metadata declares it (wheels.declared_license): an SPDX expression
    # when the metadata gives one, and the metadata's own words. Absent from records made before.
    license: str | None = None
    license_text: str | None = None
    vendored: tuple[str, ...] = ()  # "name==version" of the distributions the wheel ships inside itself

    def to_json(self) -> dict[str, Any]:
        document = {"name": self.name, "version": self.version, "filename": self.filename, "sha256": self.sha256,
                    "path": self.path, "declared": self.declared, "replaced_by": self.replaced_by,
                    "license": self.license, "license_text": self.license_text, "vendored": list(self.vendored)}
        return {**document, "alias_of": self.alias_of} if self.alias_of is not None else document

    @classmethod
    def from_json(cls, f: Fields) -> "BuildInput":
        f.only("name", "version", "filename", "sha256", "path", "declared", "replaced_by", "alias_of", "license",
               "license_text", "vendored")
        return cls(name=f.str("name"), version=f.str("version"), filename=f.str("filename"), sha256=f.str("sha256"), path=f.str("path"),
                   declared=f.bool("declared"), replaced_by=f.str_or_none("replaced_by"), alias_of=f.str_or_none("alias_of", None),
                   license=f.str_or_none("license", None), license_text=f.str_or_none("license_text", None),
                   vendored=f.strs("vendored", ()))


@dataclass(frozen=True, kw_only=True)
class WheelFile:
    filename: str
    sha256: str
    version: str | None = None


@dataclass(frozen=True, kw_only=True)
class BuiltOverlay:
    """A package's wheel with its PRs and local patches applied (overlay.OverlayResult, as recorded)."""
    package: str
    path: str  # the overlaid wheel
    wheel: WheelFile
    base: WheelFile
    label: str
    prs: tuple[dict[str, Any], ...]  # overlay.AppliedPR as JSON: name, repo, number, patch_sha256, added, ...
    files: dict[str, str | None]

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "path": self.path,
                "wheel": {"filename": self.wheel.filename, "sha256": self.wheel.sha256, "version": self.wheel.version},
                "base": {"filename": self.base.filename, "sha256": self.base.sha256},
                "label": self.label, "prs": [dict(p) for p in self.prs], "files": dict(sorted(self.files.items()))}

    @classmethod
    def from_json(cls, f: Fields) -> "BuiltOverlay":
        f.only("package", "path", "wheel", "base", "label", "prs", "files")
        wheel, base = f.obj("wheel"), f.obj("base")
        wheel.only("filename", "sha256", "version")
        base.only("filename", "sha256")

        def pr(p: Fields) -> dict[str, Any]:
            p.str("name"), p.str("patch_sha256")
            return dict(p.data)

        return cls(package=f.str("package"), path=f.str("path"), wheel=WheelFile(filename=wheel.str("filename"), sha256=wheel.str("sha256"), version=wheel.str("version")),
                   base=WheelFile(filename=base.str("filename"), sha256=base.str("sha256")), label=f.str("label"), prs=f.items("prs", pr),
                   files=f.str_map("files", values_may_be_null=True))


@dataclass(frozen=True, kw_only=True)
class BuiltModel:
    name: str
    path: str
    files: dict[str, str]  # file name -> sha256


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    stack: str
    platform: str
    lock_sha256: str
    source_date_epoch: int
    inputs: tuple[BuildInput, ...]
    overlays: tuple[BuiltOverlay, ...]
    unverified_prs: tuple[str, ...]
    model: BuiltModel | None
    input_hash: str  # names the image these inputs (and the code making images) produce

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack, "platform": self.platform, "lock_sha256": self.lock_sha256,
            "source_date_epoch": self.source_date_epoch, "inputs": [i.to_json() for i in self.inputs],
            "overlays": [o.to_json() for o in self.overlays], "unverified_prs": list(self.unverified_prs),
            "model": {"name": self.model.name, "path": self.model.path, "files": dict(sorted(self.model.files.items()))}
            if self.model else None,
            "input_hash": self.input_hash,
        }

    @classmethod
    def from_json(cls, f: Fields) -> "BuildRecord":
        f.only("stack", "platform", "lock_sha256", "source_date_epoch", "inputs", "overlays", "unverified_prs", "model",
               "input_hash")
        model = f.obj_or_none("model")
        if model:
            model.only("name", "path", "files")
        return cls(stack=f.str("stack"), platform=f.str("platform"), lock_sha256=f.str("lock_sha256"), source_date_epoch=f.int("source_date_epoch"),
                   inputs=f.items("inputs", BuildInput.from_json), overlays=f.items("overlays", BuiltOverlay.from_json),
                   unverified_prs=f.strs("unverified_prs"),
                   model=BuiltModel(name=model.str("name"), path=model.str("path"), files=model.str_map("files")) if model else None,
                   input_hash=f.str("input_hash"))


def read_build(path: Path, remedy: str = "", shown: Path | str | None = None) -> BuildRecord:
    return read_record(path, BuildRecord.from_json, remedy, shown)


def write_build(path: Path, record: BuildRecord) -> None:
    write_record(path, record.to_json())


# --------------------------------------------------------------------------- image.json


def _reference(f: Fields, key: str) -> str:
    value = f.str(key)
    problem = ImageRef.problem(value)
    if problem:
        raise f.error(key, problem)
    return value


@dataclass(frozen=True, kw_only=True)
class ImageLayer:
    digest: str
    size: int
    title: str


@dataclass(frozen=True, kw_only=True)
class ExpectedCheck:
    """Whether the build reproduced pins/<stack>.image.json: reproduced, different, stale or none."""
    file: str
    status: str
    digest: str | None


@dataclass(frozen=True, kw_only=True)
class ImageRecord:
    reference: str  # REPO@sha256:<hex>: past the build, images are referenced by digest only
    stack: str
    platforms: tuple[str, ...]
    lock_sha256: str
    input_hash: str
    total_size: int
    layers: tuple[ImageLayer, ...]
    layer_names: tuple[str, ...]
    skipped: bool  # the registry already held this input hash: nothing built or pushed
    seconds: float
    layers_built: int
    layers_pushed: int
    bytes_pushed: int
    bytes_tarred: int | None = None
    trees: dict[str, float] | None = None  # per-wheel trees made and cached, with their timings
    expected: ExpectedCheck | None = None
    # The exact version of the interpreter that compiled the bytecode ("none": no pycs); part of
    # input_hash. None in records made before it was recorded.
    compiled_by: str | None = None
    manifest_size: int | None = None  # the manifest's bytes, for the image index's entry
    index: str | None = None  # the image index over every platform, when the registry holds them all
    # What the prebuilt layer holds and what compiling it cost (image/prebuilt.py); None: nothing prebuilt.
    prebuilt: dict[str, Any] | None = None

    @property
    def digest(self) -> str:
        return self.reference.split("@", 1)[1]

    @property
    def platform(self) -> str:
        return self.platforms[0]

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "reference": self.reference, "stack": self.stack, "platforms": list(self.platforms),
            "lock_sha256": self.lock_sha256, "input_hash": self.input_hash, "total_size": self.total_size,
            "layers": [{"digest": layer.digest, "size": layer.size, "title": layer.title} for layer in self.layers],
            "layer_names": list(self.layer_names), "skipped": self.skipped, "seconds": self.seconds,
            "layers_built": self.layers_built, "layers_pushed": self.layers_pushed, "bytes_pushed": self.bytes_pushed,
        }
        if self.bytes_tarred is not None:
            document["bytes_tarred"] = self.bytes_tarred
        if self.trees is not None:
            document["trees"] = dict(self.trees)
        if self.compiled_by is not None:
            document["compiled_by"] = self.compiled_by
        if self.manifest_size is not None:
            document["manifest_size"] = self.manifest_size
        if self.index is not None:
            document["index"] = self.index
        if self.prebuilt is not None:
            document["prebuilt"] = self.prebuilt
        if self.expected is not None:
            document["expected"] = {"file": self.expected.file, "status": self.expected.status,
                                    "digest": self.expected.digest}
        return document

    @classmethod
    def from_json(cls, f: Fields) -> "ImageRecord":
        f.only("reference", "stack", "platforms", "lock_sha256", "input_hash", "total_size", "layers", "layer_names",
               "skipped", "seconds", "layers_built", "layers_pushed", "bytes_pushed", "bytes_tarred", "trees", "expected",
               "compiled_by", "manifest_size", "index", "prebuilt")

        def layer(item: Fields) -> ImageLayer:
            item.only("digest", "size", "title")
            return ImageLayer(digest=item.str("digest"), size=item.int("size"), title=item.str("title"))

        reference = _reference(f, "reference")  # first: a tag is the mistake worth naming
        expected = f.obj_or_none("expected")
        if expected:
            expected.only("file", "status", "digest")
        platforms = f.strs("platforms")
        if not platforms:
            raise f.error("platforms", "expected the image's platform, found an empty list")
        trees = f.obj_or_none("trees")
        return cls(
            reference=reference, stack=f.str("stack"), platforms=platforms,
            lock_sha256=f.str("lock_sha256"), input_hash=f.str("input_hash"), total_size=f.int("total_size"),
            layers=f.items("layers", layer), layer_names=f.strs("layer_names"), skipped=f.bool("skipped"),
            seconds=f.number("seconds"), layers_built=f.int("layers_built"), layers_pushed=f.int("layers_pushed"),
            bytes_pushed=f.int("bytes_pushed"), bytes_tarred=f.int_or_none("bytes_tarred", None),
            trees={k: trees.number(k) for k in trees.data} if trees else None,
            expected=ExpectedCheck(file=expected.str("file"), status=expected.str("status"), digest=expected.str_or_none("digest"))
            if expected else None,
            compiled_by=f.str_or_none("compiled_by"), manifest_size=f.int_or_none("manifest_size", None),
            index=f.str_or_none("index", None),
            prebuilt=f.obj("prebuilt").data if f.has("prebuilt") else None,
        )


def read_image(path: Path, remedy: str = "", shown: Path | str | None = None) -> ImageRecord:
    return read_record(path, ImageRecord.from_json, remedy, shown)


def write_image(path: Path, record: ImageRecord) -> None:
    write_record(path, record.to_json())


# --------------------------------------------------------------------------- pins/<stack>.image.json


@dataclass(frozen=True, kw_only=True)
class PlatformImage:
    """One platform's manifest in pins/<stack>.image.json: what the image index lists for it."""

    digest: str
    size: int  # the manifest's bytes


@dataclass(frozen=True, kw_only=True)
class ExpectedImage:
    """The digests a build of this lock must reproduce: one manifest per platform, and the image index
    over all of them once every platform of the lock has one (oci.index)."""

    stack: str
    lock_sha256: str
    platforms: dict[str, PlatformImage]
    index: str | None  # None until every platform of the lock has a digest here
    update: str  # the command that regenerates this file

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "lock_sha256": self.lock_sha256, "index": self.index, "update": self.update,
                "platforms": {name: {"digest": p.digest, "size": p.size} for name, p in sorted(self.platforms.items())}}

    @classmethod
    def from_json(cls, f: Fields) -> "ExpectedImage":
        f.only("stack", "lock_sha256", "platforms", "index", "update")

        def platform(item: Fields) -> PlatformImage:
            item.only("digest", "size")
            return PlatformImage(digest=item.str("digest"), size=item.int("size"))

        platforms = f.entries("platforms", platform)
        if not platforms:
            raise f.error("platforms", "expected at least one platform's manifest digest, found none")
        return cls(stack=f.str("stack"), lock_sha256=f.str("lock_sha256"), platforms=platforms,
                   index=f.str_or_none("index"), update=f.str("update"))


def read_expected(path: Path, remedy: str = "", shown: Path | str | None = None) -> ExpectedImage:
    return read_record(path, ExpectedImage.from_json, remedy, shown)


def write_expected(path: Path, expected: ExpectedImage) -> None:
    write_record(path, expected.to_json())
