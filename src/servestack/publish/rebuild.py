"""`verify --rebuild`: rebuild the image from the bundle's lock at the bundle's commit, in a scratch worktree with
fresh derived caches and its own registry, and compare digests."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servestack import settings
from servestack.errors import PublishError
from servestack.publish.fetch import fetch_publication
from servestack.publish.push import image_client, image_subject, index_platforms
from servestack.records.imageref import ImageRef
from servestack.sources.registry import Client, transfer
from servestack.sources.registry.limits import CONFIG_LIMIT, declared_problem
from servestack.util import proc
from servestack.util.console import console
from servestack.util.project import Project, cache_home

VERIFY_REGISTRY = "127.0.0.1:5098"  # its own registry: a rebuild never replaces what others pull
# Shared with the rebuild: what was fetched from outside (content-addressed, verified on use), the
# Debian base, and the per-wheel installed trees (keyed by the wheel's hash; several GB, which a
# second copy would not fit beside on a builder). Everything the image is assembled from them (every
# layer, the base blobs, the config and the manifest) is made again.
FETCHED_CACHES = ("blobs", "bases", "tools", "installed")


@contextlib.contextmanager
def _derived_caches_fresh(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    for name in FETCHED_CACHES:
        if (cache_home() / name).exists():
            (cache / name).symlink_to(cache_home() / name)
    with settings.overriding("SERVESTACK_CACHE", str(cache)):
        yield


def _manifest_platform(client: Client, manifest: dict[str, Any]) -> str:
    """os/architecture of an image manifest, from its config (as index_platforms names an index's entries)."""
    config = manifest.get("config") or {}
    problem = declared_problem(config.get("size"), CONFIG_LIMIT, "the image's config")
    if problem:
        raise PublishError(problem)
    value = json.loads(client.get_blob(config["digest"], size=config["size"]))
    return f"{value.get('os')}/{value.get('architecture')}"


def verify_rebuild(project: Project, reference: str, *, key: Path,
                   timeout: float = transfer.DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Rebuild the image from the bundle's lock at the bundle's commit in a scratch worktree; same digest?
    The publication is read from the registry within TIMEOUT seconds; the rebuild has no deadline."""
    from servestack import image as image_step
    from servestack import inputs, services

    started = time.monotonic()
    with transfer.deadline(timeout):
        publication = fetch_publication(reference, key)
        client = image_client(publication.image)
        _, top = image_subject(client, publication.image)
        entries = index_platforms(json.loads(top)) if "manifests" in json.loads(top) else {}
        # One platform's manifest is rebuilt for its own platform (an arm64 digest verified on amd64 too).
        platform = None if entries else _manifest_platform(client, json.loads(top))
    stack = publication.stack
    commit = publication.repository.get("commit")
    if not commit:
        raise PublishError(f"{reference}: its provenance names no repository commit; nothing to rebuild from")
    if proc.run(["git", "-C", str(project.root), "cat-file", "-e", f"{commit}^{{commit}}"], check=False).returncode:
        raise PublishError(f"commit {commit} (from the provenance) is not in {project.root}; fetch it first")
    scratch = Path(tempfile.mkdtemp(prefix="servestack-verify-"))
    worktree = scratch / "checkout"
    try:
        proc.run(["git", "-C", str(project.root), "worktree", "add", "--detach", str(worktree), commit])
        rebuilt_project = Project(root=worktree)
        # The bundle's lock and stack file are what is verified, even when published from a dirty tree.
        for title in (f"pins/{stack}.lock", f"pins/{stack}.yaml"):
            (worktree / title).write_bytes(publication.file(title).data)
        console.progress(f"verify {reference}: rebuilding {stack} from its lock at commit {commit[:12]} in {worktree}")
        with _derived_caches_fresh(scratch / "cache"):
            inputs.build(rebuilt_project, stack, platform=platform)
            result = image_step.build_image(rebuilt_project, stack, rebuild=True,
                                            registry_address=services.ensure_registry(VERIFY_REGISTRY))
    finally:
        proc.run(["git", "-C", str(project.root), "worktree", "remove", "--force", str(worktree)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    rebuilt = ImageRef.parse(result.reference)
    # An index is verified by the platform rebuilt here: its manifest must be the one the index lists.
    expected = entries.get(result.platform, "(no manifest for this platform)") if entries else publication.image.digest
    record = {"image": str(publication.image), "rebuilt": str(rebuilt), "same": rebuilt.digest == expected,
              "commit": commit, "seconds": round(time.monotonic() - started, 1),
              **({"platform": result.platform, "expected": expected} if entries else {})}
    console.progress(f"verify {expected}: rebuilt {rebuilt.digest} in {record['seconds']:.0f} s: "
                     + ("SAME digest" if record["same"] else "DIFFERENT digest"))
    return record
