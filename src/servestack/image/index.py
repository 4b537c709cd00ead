"""The image index over every platform's manifest, pushed once the registry holds them all.

Each `image` run builds one platform. The index is the one reference a multi-platform stack
publishes: docker, containerd and enroot pick their platform's manifest from it. Its entries are the
digests committed in pins/<stack>.image.json, so it exists only for a lock whose every platform has
been built and recorded, and its digest is the one committed there.
"""

from __future__ import annotations

import dataclasses

from servestack.errors import ServestackError
from servestack.image import oci
from servestack.image.expected import read_committed
from servestack.records.imageref import ImageRef
from servestack.records.steps import ImageRecord, write_image
from servestack.sources import registry
from servestack.util.project import Project


def push_index(project: Project, stack: str, address: str, repository: str, lock_sha256: str) -> str | None:
    """The index's digest once pushed; None while a platform's manifest is missing (here or in the registry)."""
    committed = read_committed(project, stack)
    if committed is None or committed.lock_sha256 != lock_sha256 or committed.index is None:
        return None
    if any(registry.get_manifest(address, repository, p.digest) is None for p in committed.platforms.values()):
        return None
    document = oci.index({name: (p.digest, p.size) for name, p in committed.platforms.items()})
    served = registry.put_manifest(address, repository, f"index-{lock_sha256[:16]}", document.data, document.media_type)
    if served != committed.index:
        raise ServestackError(f"registry {address} stored the image index as {served}, but pins/{stack}.image.json "
                              f"commits {committed.index}")
    return served


def record_index(project: Project, stack: str, result: ImageRecord) -> str | None:
    """Push the index when it can be made, and note it in build/<stack>/image.json."""
    ref = ImageRef.parse(result.reference)
    if ref.registry is None:  # the image step pushes every image it makes: its reference names where
        raise ServestackError(f"{result.reference}: names no registry to push {stack}'s index to")
    index = push_index(project, stack, ref.registry, ref.repository, result.lock_sha256)
    if index:
        write_image(project.artifacts(stack) / "image.json", dataclasses.replace(result, index=index))
    return index
