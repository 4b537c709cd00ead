"""One call, one operation: for callers that talk to one registry once per step (the lock, the image build)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from servestack.errors import RegistryError, ServestackError
from servestack.sources.registry.client import Client
from servestack.sources.registry.model import Reference, sha256_digest


def resolve_digest(reference: str, retries: int = 4) -> str:
    """The digest the registry serves for `reference` (a tag, or a digest that is then checked)."""
    ref = Reference.parse(reference)
    client = Client(ref.registry, ref.repository, retries=retries)
    try:
        found = client.get_manifest(ref.digest or ref.tag or "latest", what=f"image {reference}")
    except RegistryError as exc:
        raise ServestackError(f"image {reference}: {exc}") from None
    if found is None:
        raise ServestackError(f"image {reference}: not found in {ref.registry} (HTTP 404)")
    return sha256_digest(found[0])


def blob_exists(address: str, repository: str, digest: str) -> bool:
    return Client(address, repository).has_blob(digest)


def mount_blob(address: str, repository: str, digest: str, source_repository: str) -> bool:
    return Client(address, repository).mount_blob(digest, source_repository)


def push_blob(address: str, repository: str, digest: str, path: Path,
              on_bytes: Callable[[int], None] | None = None) -> None:
    Client(address, repository).push_blob_file(path, digest, on_bytes)


def push_bytes(address: str, repository: str, digest: str, data: bytes) -> None:
    if sha256_digest(data) != digest:
        raise ServestackError(f"push_bytes: the data hashes to {sha256_digest(data)}, not {digest}")
    Client(address, repository).push_blob(data)


def put_manifest(address: str, repository: str, reference: str, data: bytes, media_type: str) -> str:
    """Store a manifest under a tag or digest; returns the digest the registry computed."""
    headers = Client(address, repository).put_manifest(reference, data, media_type)
    return headers.get("Docker-Content-Digest") or sha256_digest(data)


def get_manifest(address: str, repository: str, reference: str) -> tuple[bytes, str] | None:
    """A manifest's bytes and media type, or None when the registry does not have it."""
    return Client(address, repository).get_manifest(reference)


def download_blob(address: str, repository: str, digest: str, dest: Path) -> None:
    Client(address, repository).download_blob(digest, dest)


def get_blob(address: str, repository: str, digest: str) -> bytes:
    """A small blob (a config) in memory, checked against its digest."""
    return Client(address, repository).get_blob(digest)
