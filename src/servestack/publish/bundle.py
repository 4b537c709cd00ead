"""What a publication is, planned as data: the files (lock, stack file, step records, the recipes bound to the
digest, a run's results), the bundle and attestation manifests, and where the records come from."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from servestack.errors import InputError, PublishError
from servestack.records.imageref import ImageRef
from servestack.records.lockfile import Lock
from servestack.records.smokefile import SmokeRecord, read_smoke
from servestack.records.steps import ImageRecord, read_image
from servestack.sources import registry
from servestack.sources.registry import OCI_EMPTY, OCI_MANIFEST, Descriptor, sha256_digest
from servestack.util.project import Project

PUBLICATION_TYPE = "application/vnd.servestack.publication.v1+json"
ATTESTATION_TYPE = "application/vnd.servestack.attestation.v1+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
TITLE = "org.opencontainers.image.title"
CREATED = "org.opencontainers.image.created"
BUNDLE_ANNOTATION = "io.servestack.publication"
SPDX_JSON = "application/spdx+json"
SBOM_TITLE = "sbom.spdx.json"  # the SBOM's place in the bundle (publish/sbom.py writes it)
MEDIA_TYPES = {".json": "application/json", ".lock": "application/json", ".yaml": "application/yaml",
               ".md": "text/markdown", ".png": "image/png", ".svg": "image/svg+xml", ".xml": "application/xml"}
RUN_FILES = ("results.json", "report.md")  # plus every plot


@dataclass(frozen=True, kw_only=True)
class BundleFile:
    title: str  # a relative POSIX path: where pull writes it
    data: bytes

    @property
    def digest(self) -> str:
        return sha256_digest(self.data)

    @property
    def media_type(self) -> str:
        if self.title.endswith(".spdx.json"):
            return SPDX_JSON
        return MEDIA_TYPES.get(PurePosixPath(self.title).suffix, "application/octet-stream")

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data),
                "annotations": {TITLE: self.title}}


RESERVED = ("publication.json",)  # what pull writes beside the bundle's files
MAX_TITLE = 1024  # characters in a file title; a path component may have at most 255, as on Linux


def title_problem(title: object) -> str | None:
    if not isinstance(title, str):
        return f"file title {str(title)[:80]!r} is not a string"
    if len(title) > MAX_TITLE or any(len(part.encode()) > 255 for part in title.split("/")):
        return f"file title {title[:60]!r}... ({len(title)} characters) is longer than a file name or path may be"
    if not title or any(part in ("", ".", "..") or part.startswith(".") for part in title.split("/")):
        return f"file title {title!r} is not a plain relative path"
    if any(ch == "\\" or ord(ch) < 32 for ch in title):
        return f"file title {title!r} holds a control character or a backslash"
    if title.split("/")[0] in RESERVED:
        return f"file title {title!r} is where pull writes its own record; a bundle cannot hold it"
    return None


def titles_problem(titles: list[str]) -> str | None:
    """The first title that is not a plain relative path, or that another title uses as its directory."""
    problem = next(filter(None, map(title_problem, titles)), None)
    if problem:
        return problem
    directories = {"/".join(title.split("/")[:n]): title for title in titles for n in range(1, title.count("/") + 1)}
    return next((f"file title {title!r} is also the directory of {directories[title]!r}" for title in titles
                 if title in directories), None)


def created_timestamp(lock: Lock) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(lock.source_date_epoch))


@dataclass(frozen=True, kw_only=True)
class Records:
    """Where the lock, the stack file and the build/image/smoke records come from: this checkout, or
    a directory `pull` wrote (a cluster publishing its run for an image it did not build)."""

    lock: Path
    stack_file: Path
    steps: Path  # holds build.json, image.json, smoke.json
    shown: str  # how errors name `steps`

    @classmethod
    def of_project(cls, project: Project, stack: str) -> Records:
        return cls(lock=project.lock_file(stack), stack_file=project.stack_file(stack), steps=project.artifacts(stack),
                   shown=f"build/{stack}")

    @classmethod
    def pulled(cls, directory: Path, stack: str) -> Records:
        return cls(lock=directory / "pins" / f"{stack}.lock", stack_file=directory / "pins" / f"{stack}.yaml", steps=directory / "build",
                   shown=str(directory / "build"))

    def image(self) -> ImageRecord:
        return read_image(self.steps / "image.json", "run the session that makes it first", f"{self.shown}/image.json")

    def smoke(self) -> SmokeRecord:
        return read_smoke(self.steps / "smoke.json", "run the session that makes it first", f"{self.shown}/smoke.json")

    def read(self, name: str) -> dict[str, Any]:
        try:
            return json.loads((self.steps / name).read_text())
        except FileNotFoundError:
            raise PublishError(f"{self.shown}/{name}: missing; run the session that makes it first") from None
        except ValueError as exc:
            raise PublishError(f"{self.shown}/{name}: not valid JSON ({exc})") from None


def check_smoke(records: Records, image: ImageRef, allow_static: bool = False) -> None:
    """The records' smoke is of IMAGE and passed, and served (unless ALLOW_STATIC)."""
    smoke = records.smoke()
    where = f"{records.shown}/smoke.json"
    if smoke.image != str(image):
        raise PublishError(f"{where} is for {smoke.image}, not {image}: run `nox -s smoke` on this digest first")
    if not smoke.ok:
        failed = [f"{c.probe}/{c.name}" for c in smoke.failed]
        raise PublishError(f"{where}: smoke failed for {image} ({', '.join(failed) or 'no passing status'}); "
                           f"only an image that passed smoke is published")
    if not smoke.served and not allow_static:
        skipped = [c for c in smoke.checks if c.probe != "static"]
        why = skipped[0].detail if skipped else "no serving check in the record"
        raise PublishError(f"{where}: the smoke of {image} served nothing: its static probe passed and its "
                           f"{len(skipped)} serving checks did not run ({why}). Smoke it where it serves (a GPU "
                           f"model on a GPU host: the README's canary), or publish the static probe's PASS as "
                           f"such with --allow-static-smoke (the signed statement records it)")


def bundle_files(project: Project, stack: str, image: ImageRef, run_id: str | None, scratch: Path,
                 records: Records | None = None, sbom: bytes | None = None) -> list[BundleFile]:
    """Every file of the bundle, sorted by title; the recipes are rendered now, bound to IMAGE, and validated."""
    from servestack import recipes

    records = records or Records.of_project(project, stack)
    files = [
        BundleFile(title=f"pins/{stack}.lock", data=records.lock.read_bytes()),
        BundleFile(title=f"pins/{stack}.yaml", data=records.stack_file.read_bytes()),
    ]
    if sbom is not None:
        files.append(BundleFile(title=SBOM_TITLE, data=sbom))
    records.read("build.json")  # present and JSON
    records.image(), records.smoke()  # present and well-formed, by their readers
    for name in ("build.json", "image.json", "smoke.json"):
        files.append(BundleFile(title=f"build/{name}", data=(records.steps / name).read_bytes()))
    # Which PRs were shown necessary (`nox -s ablate`), when that was run on this very image.
    from servestack.smoke.ablation import REPORT

    if (records.steps / REPORT).is_file() and records.read(REPORT).get("image") == str(image):
        files.append(BundleFile(title=f"build/{REPORT}", data=(records.steps / REPORT).read_bytes()))
    rendered = recipes.render_recipes(project, stack, str(image), records.lock, out_dir=scratch / "recipes")
    engine = recipes.engine_file(project, stack)
    problems = recipes.validate_paths(rendered, engine if engine.exists() else None, require_digest=True)
    if problems:
        raise PublishError("the bound recipes do not validate:\n" + "\n".join(str(p) for p in problems))
    files += [BundleFile(title=f"recipes/{p.name}", data=p.read_bytes()) for p in rendered]
    if run_id:
        run_dir = project.artifacts(stack) / "runs" / run_id
        if not run_dir.is_dir():
            raise InputError(run_dir, "--run", "no such run; the run ids are the directories of build/<stack>/runs/")
        for path in sorted(run_dir.rglob("*")):
            if path.is_file() and (path.name in RUN_FILES or path.suffix in (".png", ".svg")):
                files.append(BundleFile(title=f"runs/{run_id}/{path.relative_to(run_dir).as_posix()}", data=path.read_bytes()))
    return sorted(files, key=lambda f: f.title)


def referrer_manifest(artifact_type: str, layers: list[dict[str, Any]], subject: Descriptor,
                      annotations: dict[str, str]) -> bytes:
    """An OCI 1.1 artifact manifest of the image (empty config, SUBJECT), as canonical JSON."""
    return _json_bytes({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                        "config": _empty_descriptor(), "layers": layers, "subject": subject.to_json(),
                        "annotations": annotations})


def publication_manifest(files: list[BundleFile], subject: Descriptor, created: str) -> bytes:
    return referrer_manifest(PUBLICATION_TYPE, [f.descriptor() for f in files], subject, {CREATED: created})


def attestation_manifest(envelope: bytes, subject: Descriptor, bundle_digest: str, created: str,
                         listing: dict[str, str] | None = None) -> bytes:
    """LISTING: the annotations that let pull check the signature from the referrers listing (listing.py)."""
    layer = {"mediaType": DSSE_MEDIA_TYPE, "digest": sha256_digest(envelope), "size": len(envelope),
             "annotations": {TITLE: "publication.intoto.json"}}
    return referrer_manifest(ATTESTATION_TYPE, [layer], subject,
                             {CREATED: created, BUNDLE_ANNOTATION: bundle_digest, **(listing or {})})


def sbom_manifest(sbom: bytes, subject: Descriptor, created: str) -> bytes:
    """The SBOM as a plain referrer of the image, where scanners look for one (trivy: artifactType
    application/spdx+json); the same bytes as the bundle's signed copy."""
    return referrer_manifest(SPDX_JSON, [BundleFile(title=SBOM_TITLE, data=sbom).descriptor()], subject, {CREATED: created})


def _empty_descriptor() -> dict[str, Any]:
    return {"mediaType": OCI_EMPTY, "digest": sha256_digest(registry.EMPTY_JSON), "size": len(registry.EMPTY_JSON)}


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
