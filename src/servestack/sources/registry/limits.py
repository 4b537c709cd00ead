"""How much the client reads from a registry before it stops: every body is streamed, hashed as it
arrives and cut off at a limit, so a hostile or broken registry costs seconds and a bounded amount
of memory, never the body's own size.

A manifest or an index gets a small fixed limit (OCI's distribution spec asks registries to accept
manifests of at least 4 MiB, so nothing legitimate is larger). A blob may not exceed the size its
descriptor declares, and a declared size may not exceed the ceiling for its kind: a descriptor is
as untrusted as the body it describes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from servestack.errors import Overflow

MiB = 1 << 20
MANIFEST_LIMIT = 4 * MiB  # a manifest, and the referrers index (API answer or fallback tag)
ENVELOPE_LIMIT = 4 * MiB  # a DSSE envelope: one subject line per bundle file, base64
CONFIG_LIMIT = 4 * MiB  # an image's config JSON
BUNDLE_FILE_LIMIT = 64 * MiB  # one file of a publication (an SBOM is about 1 MB; a plot less)
BUNDLE_TOTAL_LIMIT = 256 * MiB  # all of one publication's files, which pull holds until it writes them
BLOB_LIMIT = 64 * MiB  # any other small blob read into memory
LAYER_LIMIT = 64 * 1024 * MiB  # an image layer streamed to disk (never into memory)
CHUNK = 1 * MiB


@dataclass(frozen=True, kw_only=True)
class Body:
    data: bytes
    digest: str


def declared_problem(size: object, ceiling: int, what: str) -> str | None:
    """Why a descriptor's declared size cannot be read (not an integer, negative, over the ceiling)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{what} declares size {str(size)[:40]!r}, not a byte count"
    if size > ceiling:
        return f"{what} declares {size} bytes, over the {ceiling}-byte ceiling for its kind"
    return None


def content_length(headers: object) -> int | None:
    try:
        value = headers.get("Content-Length")  # type: ignore[attr-defined]
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def read_bounded(chunks: Iterable[bytes], limit: int) -> Body:
    """The whole body if it is at most LIMIT bytes, hashed as it arrives; Overflow as soon as it is not."""
    h, parts, read = hashlib.sha256(), [], 0
    for chunk in chunks:
        read += len(chunk)
        if read > limit:
            raise Overflow(read, limit)
        h.update(chunk)
        parts.append(chunk)
    return Body(data=b"".join(parts), digest=f"sha256:{h.hexdigest()}")
