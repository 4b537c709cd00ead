"""The image's config and manifest, assembled as data from the layers (no daemon, no BuildKit).

Media types are chosen for the clusters that pull the image with an unpatched enroot: enroot's
first request is a HEAD of the manifest without an Accept header, which Docker's distribution
registry (2.x) answers 404 for an OCI manifest but 200 for a Docker schema 2 manifest, so the
manifest and config are Docker schema 2. Layers keep the OCI zstd media type, the one value that
makes enroot (>= 4) and containerd decompress them with zstd instead of gunzip.

Both documents are serialized one way (sorted keys, no whitespace), so the manifest digest is a
function of the layers, the environment and the labels only.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from servestack.platforms import PLATFORMS

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
# The Docker manifest list, the index type that goes with Docker schema 2 manifests (enroot, docker
# and containerd pick their platform's entry from it).
INDEX_TYPE = "application/vnd.docker.distribution.manifest.list.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"


@dataclass(frozen=True, kw_only=True)
class LayerRef:
    """A layer as the manifest and config see it."""

    name: str
    digest: str
    diff_id: str
    size: int
    media_type: str = LAYER_TYPE


@dataclass(frozen=True, kw_only=True)
class Document:
    """A serialized JSON document and its digest."""

    data: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


def _serialize(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def created(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def config(platform: str, layers: list[LayerRef], env: dict[str, str], labels: dict[str, str], epoch: int,
           base_config: dict[str, Any] | None = None) -> Document:
    """The image config: the base image's settings (if any) under ours, one history entry per layer."""
    arch, variant = PLATFORMS[platform].oci_architecture, PLATFORMS[platform].oci_variant
    inherited = dict((base_config or {}).get("config") or {})
    base_env = dict(item.split("=", 1) for item in inherited.get("Env") or [])
    inherited.update({
        "Env": [f"{k}={v}" for k, v in {**base_env, **env}.items()],
        "Labels": {**(inherited.get("Labels") or {}), **labels},
    })
    body: dict[str, Any] = {
        "architecture": arch,
        "os": "linux",
        "config": inherited,
        "created": created(epoch),
        "history": [{"created": created(epoch), "created_by": f"servestack layer {layer.name}"} for layer in layers],
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }
    if variant:
        body["variant"] = variant
    return Document(data=_serialize(body), media_type=CONFIG_TYPE)


def manifest(config_doc: Document, layers: list[LayerRef]) -> Document:
    body = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": config_doc.descriptor(),
        "layers": [{"mediaType": layer.media_type, "digest": layer.digest, "size": layer.size} for layer in layers],
    }
    return Document(data=_serialize(body), media_type=MANIFEST_TYPE)


def index(manifests: dict[str, tuple[str, int]]) -> Document:
    """The image index over each platform's manifest (platform -> (digest, size)), in platform order,
    so that its digest is a function of the manifests alone."""
    entries = []
    for platform, (digest, size) in sorted(manifests.items()):
        arch, variant = PLATFORMS[platform].oci_architecture, PLATFORMS[platform].oci_variant
        entry_platform = {"architecture": arch, "os": "linux", **({"variant": variant} if variant else {})}
        entries.append({"mediaType": MANIFEST_TYPE, "digest": digest, "size": size, "platform": entry_platform})
    return Document(data=_serialize({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": entries}), media_type=INDEX_TYPE)
