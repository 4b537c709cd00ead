"""Reading named files out of an image layer as a runtime would see them: any compression, each
path at most once, and no entry that climbs out of the root."""

from __future__ import annotations

import io
import tarfile
import zlib

from .bundle import PublishError


def decompressed(blob: bytes, media_type: str) -> bytes:
    if media_type.endswith(("+zstd", ".zstd")):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read()
    if media_type.endswith("gzip") or blob[:2] == b"\x1f\x8b":
        return zlib.decompress(blob, 16 + zlib.MAX_WBITS)
    return blob


def files_in_layer(blob: bytes, media_type: str, paths: set[str]) -> dict[str, bytes]:
    """The regular files at PATHS (relative to the root) that the layer holds."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(decompressed(blob, media_type))) as tar:
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
                raise PublishError(f"/{path} in the layer is not a regular file ({member.type!r})")
            found[path] = extracted.read()
    return found


def file_in_layer(blob: bytes, media_type: str, path: str) -> bytes | None:
    return files_in_layer(blob, media_type, {path}).get(path)
