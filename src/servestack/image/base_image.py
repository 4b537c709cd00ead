"""The image's base: the Debian root file system assembled from the lock's packages (servestack.debian),
compressed into one layer, or a base image's layers by digest, unchanged."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.errors import ServestackError
from servestack.image import layers, oci
from servestack.platforms import PLATFORMS
from servestack.records.lockfile import DebianBase, ImageBase, Lock
from servestack.sources import registry
from servestack.util.progress import Progress
from servestack.util.project import cache_home


def debian_base(lock_base: DebianBase, platform: str) -> Path:
    """The Debian base's root file system, assembled from the lock's packages (servestack.debian)."""
    from servestack.debian.tarball import tarball

    return tarball(lock_base, platform)


def interpreter_version(lock: Lock, platform: str) -> str | None:
    """The exact version (X.Y.Z) of the image's interpreter, the Debian base's python<X.Y>-minimal as the
    lock pins it. The bytecode is compiled by the host's interpreter of this version (trees.compiler).
    None for a base image: not known without reading its layers."""
    if not isinstance(lock.base, DebianBase):
        return None
    from servestack.debian.tarball import interpreter_version as debian_interpreter

    return debian_interpreter(lock.base, platform, lock.python)


@dataclass(frozen=True, kw_only=True)
class Base:
    layers: list[oci.LayerRef]
    paths: dict[str, Path]  # blob digest -> local file, for blobs that are pushed from here
    config: dict[str, Any] | None  # a base image's config (its environment is inherited)
    source: tuple[str, str] | None = None  # (registry, repository) of a base image


def _image_base(base: ImageBase, platform: str, address: str) -> Base:
    """A base image by digest: its layers become the image's first layers, unchanged."""
    ref = registry.Reference.parse(base.reference)
    found = registry.get_manifest(ref.registry, ref.repository, base.digest)
    if found is None:
        raise ServestackError(f"base image {base.reference}@{base.digest}: not in its registry")
    manifest = json.loads(found[0])
    if "manifests" in manifest:  # an index: take this platform's manifest
        arch = PLATFORMS[platform].oci_architecture
        digest = next((m["digest"] for m in manifest["manifests"] if (m.get("platform") or {}).get("architecture") == arch), None)
        if digest is None:
            raise ServestackError(f"base image {base.reference}: no manifest for {platform}")
        found = registry.get_manifest(ref.registry, ref.repository, digest)
        if found is None:
            raise ServestackError(f"base image {base.reference}: its index names {digest} for {platform}, which is not in its registry")
        manifest = json.loads(found[0])
    config = json.loads(registry.get_blob(ref.registry, ref.repository, manifest["config"]["digest"]))
    refs = [oci.LayerRef(name="base", digest=layer["digest"], diff_id=diff_id, size=layer["size"], media_type=layer["mediaType"])
            for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"])]
    return Base(layers=refs, paths={}, config=config, source=(ref.registry, ref.repository))


def base_layers(lock: Lock, platform: str, address: str, progress: Progress) -> Base:
    if isinstance(lock.base, ImageBase):
        return _image_base(lock.base, platform, address)
    tarball = debian_base(lock.base, platform)
    key = base_key(tarball)
    if layers.cached(key) is None:  # as a rule EarlyLayers compressed it already; if not, its bytes count here
        progress.expect(tarball.stat().st_size)
    blob = layers.compress_tarball(tarball, lambda n: progress.add("tarred", n), lambda n: progress.add("compressed", n), key)
    return Base(layers=[oci.LayerRef(name="base", digest=blob.digest, diff_id=blob.diff_id, size=blob.size)], paths={blob.digest: blob.path}, config=None)


@functools.lru_cache(maxsize=None)
def base_key(tarball: Path) -> str:
    """The Debian base tarball's layer key, found once per process: finding it reads all its 225 MB, and
    EarlyLayers and `base_layers` both need it in every build. A base tarball never changes under its name
    (named by its archive state, renamed into place whole)."""
    return layers.tarball_key(tarball)


def send_base_blob(base: Base, address: str, repository: str, digest: str) -> None:
    """A base image's blob: mounted when it is in the same registry, else copied through the cache."""
    assert base.source
    source_registry, source_repository = base.source
    if source_registry == address and registry.mount_blob(address, repository, digest, source_repository):
        return
    path = cache_home() / "base-blobs" / digest.replace(":", "-")
    if not path.exists():
        registry.download_blob(source_registry, source_repository, digest, path)
    registry.push_blob(address, repository, digest, path)
