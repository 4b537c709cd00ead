"""The build and image steps' records as typed values, each with one reader and one writer.

    build/<stack>/build.json   BuildRecord     what `build` fetched, verified and overlaid
    build/<stack>/image.json   ImageRecord     the image `image` pushed, by digest
    pins/<stack>.image.json    ExpectedImage   the digest committed for the committed lock
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from servestack.records.codec import Record, decode, json_quirks
from servestack.records.fields import Fields, read_record, write_record
from servestack.records.imageref import ImageRef

# --------------------------------------------------------------------------- build.json


@dataclass(frozen=True, kw_only=True)
class BuildInput(Record):
    """A verified wheel the image installs (or a metadata-only alias standing for one)."""
    name: str
    version: str
    filename: str
    sha256: str
    path: str
    declared: bool  # the stack file names the package
    replaced_by: str | None  # the overlaid wheel installed instead
    alias_of: str | None = field(default=None, metadata=json_quirks(omit=True))
    # The wheel's licence as its metadata declares it (wheels.declared_license): an SPDX expression
    # when the metadata gives one, and the metadata's own words. Absent from records made before.
    license: str | None = None
    license_text: str | None = None
    vendored: tuple[str, ...] = ()  # "name==version" of the distributions the wheel ships inside itself


@dataclass(frozen=True, kw_only=True)
class WheelFile(Record):
    filename: str
    sha256: str
    version: str | None = field(default=None, metadata=json_quirks(omit=True))  # the base wheel's goes unrecorded


def _names_its_patch(pr: Fields) -> None:
    pr.str("name"), pr.str("patch_sha256")


@dataclass(frozen=True, kw_only=True)
class BuiltOverlay(Record):
    """A package's wheel with its PRs and local patches applied (overlay.OverlayResult, as recorded)."""
    package: str
    path: str  # the overlaid wheel
    wheel: WheelFile
    base: WheelFile
    label: str
    prs: tuple[dict[str, Any], ...]  # overlay.AppliedPR as JSON: name, repo, number, patch_sha256, added, ...
    files: dict[str, str | None]

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        f.items("prs", _names_its_patch)  # the rest of an applied PR is the overlay's to define
        return decode(cls, f)


@dataclass(frozen=True, kw_only=True)
class BuiltModel(Record):
    name: str
    path: str
    files: dict[str, str]  # file name -> sha256


@dataclass(frozen=True, kw_only=True)
class BuildRecord(Record):
    stack: str
    platform: str
    lock_sha256: str
    source_date_epoch: int
    inputs: tuple[BuildInput, ...]
    overlays: tuple[BuiltOverlay, ...]
    unverified_prs: tuple[str, ...]
    model: BuiltModel | None
    input_hash: str  # names the image these inputs (and the code making images) produce


def read_build(path: Path, remedy: str = "", shown: Path | str | None = None) -> BuildRecord:
    return read_record(path, BuildRecord.from_json, remedy, shown)


def write_build(path: Path, record: BuildRecord) -> None:
    write_record(path, record.to_json())


# --------------------------------------------------------------------------- image.json


def _platforms_named(platforms: tuple[str, ...]) -> str | None:
    return None if platforms else "expected the image's platform, found an empty list"


@dataclass(frozen=True, kw_only=True)
class ImageLayer(Record):
    digest: str
    size: int
    title: str


@dataclass(frozen=True, kw_only=True)
class ExpectedCheck(Record):
    """Whether the build reproduced pins/<stack>.image.json: reproduced, different, stale or none."""
    file: str
    status: str
    digest: str | None


@dataclass(frozen=True, kw_only=True)
class ImageRecord(Record):
    # REPO@sha256:<hex>: past the build, images are referenced by digest only. Declared first: a tag is
    # the mistake worth naming.
    reference: str = field(metadata=json_quirks(check=ImageRef.problem))
    stack: str
    platforms: tuple[str, ...] = field(metadata=json_quirks(check=_platforms_named))
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
    # The fields below are written only when set: records made before each keep their bytes.
    bytes_tarred: int | None = field(default=None, metadata=json_quirks(omit=True))
    # per-wheel trees made and cached, with their timings
    trees: dict[str, float] | None = field(default=None, metadata=json_quirks(omit=True))
    expected: ExpectedCheck | None = field(default=None, metadata=json_quirks(omit=True))
    # The exact version of the interpreter that compiled the bytecode ("none": no pycs); part of
    # input_hash. None in records made before it was recorded.
    compiled_by: str | None = field(default=None, metadata=json_quirks(omit=True))
    # the manifest's bytes, for the image index's entry
    manifest_size: int | None = field(default=None, metadata=json_quirks(omit=True))
    # the image index over every platform, when the registry holds them all
    index: str | None = field(default=None, metadata=json_quirks(omit=True))
    # What the prebuilt layer holds and what compiling it cost (image/prebuilt.py); None: nothing prebuilt.
    prebuilt: dict[str, Any] | None = field(default=None, metadata=json_quirks(omit=True))

    @property
    def digest(self) -> str:
        return self.reference.split("@", 1)[1]

    @property
    def platform(self) -> str:
        return self.platforms[0]


def read_image(path: Path, remedy: str = "", shown: Path | str | None = None) -> ImageRecord:
    return read_record(path, ImageRecord.from_json, remedy, shown)


def write_image(path: Path, record: ImageRecord) -> None:
    write_record(path, record.to_json())


# --------------------------------------------------------------------------- pins/<stack>.image.json


@dataclass(frozen=True, kw_only=True)
class PlatformImage(Record):
    """One platform's manifest in pins/<stack>.image.json: what the image index lists for it."""

    digest: str
    size: int  # the manifest's bytes


def _a_platform_named(platforms: dict[str, PlatformImage]) -> str | None:
    return None if platforms else "expected at least one platform's manifest digest, found none"


@dataclass(frozen=True, kw_only=True)
class ExpectedImage(Record):
    """The digests a build of this lock must reproduce: one manifest per platform, and the image index
    over all of them once every platform of the lock has one (oci.index)."""

    stack: str
    lock_sha256: str
    platforms: dict[str, PlatformImage] = field(metadata=json_quirks(check=_a_platform_named))
    index: str | None  # None until every platform of the lock has a digest here
    update: str  # the command that regenerates this file


def read_expected(path: Path, remedy: str = "", shown: Path | str | None = None) -> ExpectedImage:
    return read_record(path, ExpectedImage.from_json, remedy, shown)


def write_expected(path: Path, expected: ExpectedImage) -> None:
    write_record(path, expected.to_json())
