"""The signed statement: in-toto v1 over the image, the bundle manifest and every file, with SLSA provenance v1
naming the checkout it comes from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.publish import signing
from servestack.publish.bundle import BundleFile
from servestack.records.imageref import ImageRef
from servestack.util import proc

PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:servestack:build-type:image-from-lock:v1"
BUILDER_ID = "urn:servestack:builder:publish"


@dataclass(frozen=True, kw_only=True)
class Source:
    """Which checkout the publication comes from."""
    commit: str | None
    url: str | None
    dirty: bool

    @classmethod
    def of(cls, root: Path) -> Source:
        def git(*args: str) -> str | None:
            done = proc.run(["git", "-C", str(root), *args], check=False)
            return done.stdout.strip() if done.returncode == 0 else None

        url = git("config", "--get", "remote.origin.url")
        if url and "@" in url.split("//")[-1].split("/")[0]:
            url = None  # a URL with credentials in it never goes into a statement
        return cls(commit=git("rev-parse", "HEAD"), url=url or None, dirty=bool(git("status", "--porcelain", "--untracked-files=no")))


def signed_identity(image: ImageRef, repository: str | None = None) -> str:
    """The name a statement signs the image under: its repository path and digest, not the registry's
    host, so the same digest pulled through a mirror or another name of the registry verifies."""
    return f"{repository or image.repository}@{image.digest}"


def provenance(stack: str, image: ImageRef, bundle_digest: str, files: list[BundleFile], source: Source,
               run_id: str | None, created: str, published: str, platforms: tuple[ImageRef, ...] = (),
               smoke_served: bool = True) -> dict[str, Any]:
    """The in-toto statement: the image, the bundle manifest and every file, with SLSA provenance.
    `created` is the lock's time (the bundle's, so equal inputs give an equal bundle); `published`
    when this publication was made (finishedOn: pull takes the newest of an image's publications).
    PLATFORMS: for an image index, each platform's manifest, named as the image is. SMOKE_SERVED false:
    the smoke in the bundle served nothing, and the publisher let it through (`--allow-static-smoke`)."""
    lock = next(f for f in files if f.title == f"pins/{stack}.lock")
    subjects = [signing.Subject(name=signed_identity(image), sha256=image.hex),
                signing.Subject(name="publication", sha256=bundle_digest.split(":")[1])]
    subjects += [signing.Subject(name=signed_identity(p), sha256=p.hex) for p in platforms]
    subjects += [signing.Subject(name=f.title, sha256=f.digest.split(":")[1]) for f in files]
    dependencies: list[dict[str, Any]] = [{"name": f"pins/{stack}.lock", "digest": {"sha256": lock.digest.split(":")[1]}}]
    if source.commit:
        dependencies.insert(0, {"uri": f"git+{source.url or 'local'}@{source.commit}", "digest": {"gitCommit": source.commit}})
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"stack": stack, "run": run_id, "smokeServed": smoke_served,
                                   "repository": {"commit": source.commit, "url": source.url, "dirty": source.dirty}},
            "internalParameters": {},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {"builder": {"id": BUILDER_ID}, "metadata": {"invocationId": bundle_digest, "startedOn": created,
                                                                    "finishedOn": published}},
    }
    return signing.statement(subjects, PROVENANCE_V1, predicate)
