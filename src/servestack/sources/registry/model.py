"""What the OCI distribution API speaks in: media types, digests, references (tag or digest) and descriptors."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from servestack.records.imageref import split_registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
MANIFEST_TYPES = ", ".join(
    [
        OCI_INDEX,
        OCI_MANIFEST,
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Reference:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> Reference:
        rest, _, digest = text.partition("@")
        if digest and not DIGEST.match(digest):
            raise ValueError(f"{text!r}: digest must be sha256:<64 hex>")
        registry, path = split_registry(rest)
        if registry is None:
            registry = "registry-1.docker.io"
            if "/" not in path:
                path = f"library/{path}"
        repository, _, tag = path.partition(":")
        if not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*", repository):
            raise ValueError(f"{text!r}: {repository!r} is not a valid repository name")
        return cls(registry=registry, repository=repository, tag=tag or (None if digest else "latest"), digest=digest or None)

    def with_digest(self, digest: str) -> str:
        return f"{self.registry}/{self.repository}@{digest}"


@dataclass(frozen=True, kw_only=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    artifact_type: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Descriptor:
        return cls(media_type=d["mediaType"], digest=d["digest"], size=int(d["size"]), artifact_type=d.get("artifactType"),
                   annotations=tuple(sorted((d.get("annotations") or {}).items())))

    @property
    def annotation(self) -> dict[str, str]:
        return dict(self.annotations)
