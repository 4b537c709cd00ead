"""Reading named files out of an image layer as a runtime would see them: any compression, each
path at most once, and no entry that climbs out of the root. The layer is read as a stream, so a
base layer of gigabytes costs its named files' bytes in memory, not its own."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import BinaryIO

from servestack.errors import PublishError


def decompressed(stream: BinaryIO, media_type: str) -> BinaryIO:
    if media_type.endswith(("+zstd", ".zstd")):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(stream)
    # BufferedReader reads through any stream with readinto (a BytesIO here); typeshed asks for a raw one.
    buffered = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(stream)  # type: ignore[type-var]
    if media_type.endswith("gzip") or buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered)  # type: ignore[return-value]
    return buffered


def files_in_layer(stream: BinaryIO, media_type: str, paths: set[str], *, regular: bool = True) -> dict[str, bytes]:
    """The files at PATHS (relative to the root) that the layer holds. A named path that is not a
    regular file is an error, or, with `regular=False`, not returned (a symlink the caller reads
    through its target instead)."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=decompressed(stream, media_type), mode="r|") as tar:
        for member in tar:
            parts = [p for p in member.name.split("/") if p not in ("", ".")]
            if ".." in parts:
                raise PublishError(f"layer entry {member.name!r} climbs out of the image's root: no runtime would put "
                                   f"it where its name says, so the layer is not read")
            path = "/".join(parts)
            if path not in paths:
                continue
            if path in found:
                raise PublishError(f"the layer holds /{path} twice: which one a runtime sees depends on the unpacker")
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is None:
                if regular:
                    raise PublishError(f"/{path} in the layer is not a regular file ({member.type!r})")
                continue
            found[path] = extracted.read()
    return found


def file_in_layer(blob: bytes, media_type: str, path: str) -> bytes | None:
    return files_in_layer(io.BytesIO(blob), media_type, {path}).get(path)


def files_in_layer_file(layer: Path, media_type: str, paths: set[str], **options: bool) -> dict[str, bytes]:
    with layer.open("rb") as stream:
        return files_in_layer(stream, media_type, paths, **options)
