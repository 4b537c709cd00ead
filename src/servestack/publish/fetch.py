"""`pull`: take the image's newest verified publication (candidates.py), check the image's own label and
stack.json agree with the bundle's lock and that scanners find its SBOM, and write the files (atomically)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.errors import InputError, PublishError, ServestackError
from servestack.platforms import choose
from servestack.publish import sbom
from servestack.publish.bundle import sbom_manifest
from servestack.publish.candidates import Publication, fetch_publication, published_at, referrer_manifest
from servestack.publish.layerfiles import files_in_layer_file
from servestack.publish.provenance import signed_identity
from servestack.publish.push import image_client, image_subject, index_platforms, platform_sbom_title
from servestack.publish.signedtime import not_before
from servestack.records.imageref import ImageRef
from servestack.sources.registry import OCI_INDEX, sha256_digest, transfer
from servestack.sources.registry.limits import CONFIG_LIMIT, declared_problem
from servestack.util.console import console
from servestack.util.fsutil import canonical_json, sha256_bytes, sha256_file
from servestack.util.interrupts import held
from servestack.util.project import Project

__all__ = ["STACK_JSON", "Publication", "check_image_agrees", "check_sbom", "fetch_publication", "pull"]
MAX_SKIPPED_SHOWN = 20  # lines of skipped candidates printed; publication.json's caller can ask for the rest
MAX_WARNINGS_SHOWN = 5  # lines of unsigned SBOM referrers printed; the rest are counted
MAX_SBOMS_EXAMINED = 20  # other SPDX referrers fetched to say why they are unsigned; more are only counted

STACK_JSON = "opt/servestack/stack.json"


@dataclass(frozen=True, kw_only=True)
class ImageLock:
    """What the image itself says its lock is: its label, and its own /opt/servestack/stack.json."""
    label: str | None
    stack_json: dict[str, Any] | None


def image_lock(image: ImageRef) -> ImageLock:
    """The image's lock label (config) and stack.json (top layer), read once per pull."""
    client = image_client(image)
    _, manifest_bytes = image_subject(client, image)
    manifest = json.loads(manifest_bytes)
    if manifest.get("mediaType") == OCI_INDEX or "manifests" in manifest:
        raise PublishError(f"{image} is a multi-platform index; its platform's manifest carries the lock")
    problem = declared_problem(manifest["config"].get("size"), CONFIG_LIMIT, f"{image}: its config")
    if problem:
        raise PublishError(problem)
    config = json.loads(client.get_blob(manifest["config"]["digest"], size=manifest["config"]["size"]))
    labels = (config.get("config") or {}).get("Labels") or {}
    top = manifest["layers"][-1]
    with tempfile.TemporaryDirectory(prefix="servestack-pull-") as scratch:  # a layer goes to disk, not memory
        layer = Path(scratch) / "top"
        client.download_blob(top["digest"], layer, size=top.get("size"))
        stack_json = files_in_layer_file(layer, top["mediaType"], {STACK_JSON}).get(STACK_JSON)
    return ImageLock(label=labels.get("io.servestack.lock.sha256"),
                     stack_json=json.loads(stack_json) if stack_json is not None else None)


def check_image_agrees(publication: Publication, image: ImageRef | None = None,
                       facts: ImageLock | None = None) -> list[str]:
    """The image's labels and its own stack.json (top layer) against the bundle's lock; returns what was
    checked. IMAGE: the platform's manifest when the publication is of an index; FACTS: read already."""
    image = image or publication.image
    lock = publication.file(f"pins/{publication.stack}.lock")
    lock_sha256 = sha256_bytes(lock.data)
    facts = facts or image_lock(image)
    if facts.label != lock_sha256:
        raise PublishError(f"{image}: label io.servestack.lock.sha256 is {facts.label}, the bundle's lock is "
                           f"{lock_sha256}")
    if facts.stack_json is None:
        raise PublishError(f"{image}: its top layer has no /{STACK_JSON}")
    own = facts.stack_json
    if own.get("lock_sha256") != lock_sha256 or own.get("lock") != json.loads(lock.data):
        raise PublishError(f"{image}: /{STACK_JSON} records lock {own.get('lock_sha256')}, the bundle's lock is "
                           f"{lock_sha256}")
    return [f"label io.servestack.lock.sha256 = {lock_sha256[:16]}", f"/{STACK_JSON} records the same lock"]


def check_sbom(publication: Publication) -> tuple[list[str], list[str]]:
    """The signed SBOM is valid SPDX describing this image and a plain SPDX referrer (what scanners
    read) holds its bytes. Returns what was checked (nothing for a publication made before SBOMs)
    and the other SPDX referrers that hold an SBOM no verified publication signs: another tool's,
    a forgery, one listed but missing, or one naming another subject (a replay). Those are named,
    not refused: like a replayed publication, another party's referrer must not block this one,
    and the user is told a scanner may read it instead."""
    signed = next((f for f in publication.files if f.title == sbom.SBOM_TITLE), None)
    if signed is None:
        return [], []
    image = publication.image
    value = sbom.read_sbom(signed.data, image, f"bundle file {sbom.SBOM_TITLE}")
    client = image_client(image)
    subject, _ = image_subject(client, image)
    created = signed_time_created(publication.statement)
    expected = sha256_digest(sbom_manifest(signed.data, subject, created)) if created else None
    plain = sorted((r for r in publication.listed if r.artifact_type == sbom.SPDX_JSON),
                   key=lambda r: r.digest != expected)  # publish's own referrer first: one fetch, usually
    holding, unsigned, why = [], [], {}
    for n, r in enumerate(plain):
        if n > MAX_SBOMS_EXAMINED:  # junk is counted, never fetched one by one
            unsigned.append(r.digest)
            continue
        try:
            manifest = referrer_manifest(client, r, image, f"{sbom.SPDX_JSON} referrer {r.digest}")
        except (ServestackError, ValueError, TypeError, AttributeError) as exc:
            unsigned.append(r.digest)
            why[r.digest] = f" ({str(exc)[:300]})"
            continue
        layers = [layer.get("digest") for layer in manifest.get("layers", [])]
        if layers == [signed.digest]:
            holding.append(r.digest)
        elif len(layers) != 1 or layers[0] not in publication.signed_sboms:
            unsigned.append(r.digest)
    if not holding:
        raise PublishError(f"{image}: no {sbom.SPDX_JSON} referrer holds the SBOM the publication signs "
                           f"({signed.digest}), so scanners would not find it")
    checked = [f"{sbom.SBOM_TITLE}: SPDX 2.3, {len(value['packages'])} packages, describes the digest; the "
               f"{sbom.SPDX_JSON} referrer {holding[0][:19]} holds the signed bytes"]
    checked += [f"WARNING: {sbom.SPDX_JSON} referrer {digest} holds an SBOM no publication verified with this key "
                f"signs (another tool's, or forged): a scanner may read it instead{why.get(digest, '')}"
                for digest in unsigned[:MAX_WARNINGS_SHOWN]]
    if len(unsigned) > MAX_WARNINGS_SHOWN:
        checked.append(f"WARNING: ... and {len(unsigned) - MAX_WARNINGS_SHOWN} more {sbom.SPDX_JSON} referrers no "
                       f"publication signs ({len(unsigned)} in all: publication.json's unsigned_sboms)")
    return checked, unsigned


def signed_time_created(statement: dict[str, Any]) -> str | None:
    """The lock's time the statement records (startedOn): what publish stamped the SBOM referrer with."""
    value = ((statement.get("predicate") or {}).get("runDetails") or {}).get("metadata", {}).get("startedOn")
    return value if isinstance(value, str) else None


def _default_out(image: ImageRef) -> Path:
    return Path.cwd() / f"servestack-{image.hex[:12]}"


def _check_recipes(staging: Path) -> list[str]:
    """The bundle's recipes pass `recipes validate` before they reach OUT (the engine's rules where this
    checkout describes their stack's engine): raises InputErrors, returns the warnings."""
    from servestack.recipes import check_before_run

    files = sorted((staging / "recipes").glob("*.yaml"))
    return [str(w).replace(str(staging) + os.sep, "") for w in check_before_run(files, Project.find())] if files else []


def pull(reference: str, *, key: Path, out: Path | None = None, bundle: str | None = None,
         repository: str | None = None, not_before_time: str | None = None, platform: str | None = None,
         timeout: float = transfer.DEFAULT_TIMEOUT) -> Path:
    """Verify the image's publication and write its recipes, lock and results to OUT (untouched on any
    error). NOT_BEFORE_TIME (RFC 3339) refuses every publication signed as made before it: a rollback floor.
    An image index: PLATFORM's manifest (default: this machine's) must be named by the index's signed
    statement and carry a publication of its own with the same lock. Everything read from registries is
    done within TIMEOUT seconds (sources/registry/transfer.py)."""
    started = time.monotonic()
    image = ImageRef.parse(reference)
    out = (out or _default_out(image)).absolute()
    if out.is_symlink():
        raise InputError(out, "--out", f"is a symbolic link (to {os.readlink(out)}); pull writes a fresh directory: "
                                       "name the directory itself")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(out, "--out", "exists and is not an empty directory; pull writes a fresh one")
    floor = not_before(not_before_time)
    with transfer.deadline(timeout):
        _, top = image_subject(image_client(image), image)
        entries = index_platforms(json.loads(top)) if "manifests" in json.loads(top) else {}
        if platform and not entries:
            raise InputError("--platform", "", f"{image} is one platform's manifest, not an image index")
        name = choose(tuple(entries), platform, f"image index {image}") if entries else None
        runs = ImageRef.parse(f"{image.name}@{entries[name]}") if name else image
        facts: list[ImageLock] = []

        def usable(candidate: Publication) -> None:  # a stale lock is skipped, the next newest taken
            if name and _subjects(candidate).get(signed_identity(runs, repository)) != runs.hex:
                raise PublishError(f"its statement does not name {name}'s manifest {runs.digest}")
            facts[:] = facts or [image_lock(runs)]
            check_image_agrees(candidate, image=runs, facts=facts[0])

        publication = fetch_publication(reference, key, bundle, repository, floor=floor, usable=usable)
        checked = check_image_agrees(publication, image=runs, facts=facts[0])
        own = _platform_publication(publication, runs, name, key, repository) if name else publication
        sbom_checked, unsigned_sboms = check_sbom(own)
    if own is not publication:
        assert name  # a platform's own publication is sought only for a named platform
        checked.append(f"{name}: {runs.digest} is signed on its own (attestation {own.attestation_digest[:19]}), "
                       f"the same lock; its SBOM is the bundle's {platform_sbom_title(name)}")
    with held():  # a signal here is raised once OUT is whole, or its staging is gone
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None))
        try:
            for f in publication.files:
                target = staging / f.title
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(f.data)
            warnings = _check_recipes(staging)
            (staging / "publication.json").write_text(canonical_json({
                "image": str(image), "bundle": publication.bundle_digest, "attestation": publication.attestation_digest,
                "key_sha256": sha256_file(key), "statement": publication.statement, "unsigned_sboms": unsigned_sboms,
                "published": published_at(publication), "skipped": list(publication.skipped),
                **({"platform": {"name": name, "image": str(runs), "bundle": own.bundle_digest,
                                 "attestation": own.attestation_digest}} if name else {}),
            }))
            out.parent.mkdir(parents=True, exist_ok=True)
            if out.exists():
                out.rmdir()
            os.replace(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    console.progress(f"pull {image}\n  signature   attestation {publication.attestation_digest} verifies with {key}\n"
                     f"  bundle      {publication.bundle_digest}: {len(publication.files)} files match the signed statement\n"
                     + f"  published   {published_at(publication)} (the newest that verifies, of "
                     f"{len(publication.skipped) + 1} candidate{'s' if publication.skipped else ''})\n"
                     + "".join(f"  skipped     {line}\n" for line in publication.skipped[:MAX_SKIPPED_SHOWN])
                     + (f"  skipped     ... and {len(publication.skipped) - MAX_SKIPPED_SHOWN} more (publication.json)\n"
                        if len(publication.skipped) > MAX_SKIPPED_SHOWN else "")
                     + "".join(f"  image       {line}\n" for line in checked)
                     + "".join(f"  sbom        {line}\n" for line in sbom_checked)
                     + f"  source      commit {publication.repository.get('commit')}"
                     f"{' (dirty tree)' if publication.repository.get('dirty') else ''}\n"
                     f"  wrote       {out}: {publication.recipes} recipes bound to the digest and lock (srtctl apply -f), lock, records "
                     f"({time.monotonic() - started:.1f} s)"
                     + "".join(f"\n  warning     {w}" for w in warnings))
    return out


def _subjects(publication: Publication) -> dict[str, str]:
    return {s["name"]: s["digest"]["sha256"] for s in publication.statement.get("subject", [])}


def _platform_publication(index: Publication, runs: ImageRef, name: str, key: Path,
                          repository: str | None) -> Publication:
    """The platform manifest's own newest publication of the index publication's lock, whose SBOM is the
    one the index's bundle holds for it."""
    lock_title = f"pins/{index.stack}.lock"
    lock = index.file(lock_title).data

    def same_lock(candidate: Publication) -> None:
        if not any(f.title == lock_title and f.data == lock for f in candidate.files):
            raise PublishError(f"its lock is not the index publication's ({lock_title})")

    own = fetch_publication(str(runs), key, None, repository, usable=same_lock)
    title = platform_sbom_title(name)
    held_sbom = next((f.data for f in index.files if f.title == title), None)
    signed_sbom = next((f.data for f in own.files if f.title == sbom.SBOM_TITLE), None)
    if held_sbom != signed_sbom:
        raise PublishError(f"{runs}: its own publication's {sbom.SBOM_TITLE} is not the index bundle's {title}")
    return own
