"""`pull`: find the image's publication, verify its signature and every file against the signed statement, check
the image's own label and stack.json agree with the bundle's lock, and write the files (atomically)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import signing
from ..errors import InputError, ServestackError
from ..fsutil import canonical_json, sha256_bytes, sha256_file
from ..imageref import ImageRef
from ..project import Project
from ..sources import registry
from ..sources.registry import OCI_INDEX, Client
from . import sbom
from .bundle import (
    ATTESTATION_TYPE,
    BUNDLE_ANNOTATION,
    PUBLICATION_TYPE,
    TITLE,
    BundleFile,
    PublishError,
    titles_problem,
)
from .layerfiles import file_in_layer
from .provenance import signed_identity
from .push import image_client, image_subject

STACK_JSON = "opt/servestack/stack.json"


@dataclass(frozen=True)
class Publication:
    image: ImageRef
    bundle_digest: str
    attestation_digest: str
    statement: dict[str, Any]
    files: tuple[BundleFile, ...]
    referrers: str  # "api" or "tag"
    skipped: tuple[str, ...] = ()  # the other candidates, each with why it was not taken
    signed_sboms: frozenset[str] = frozenset()  # the SBOM digests of every publication that verified

    def file(self, title: str) -> BundleFile:
        return next(f for f in self.files if f.title == title)

    @property
    def stack(self) -> str:
        return self.statement["predicate"]["buildDefinition"]["externalParameters"]["stack"]

    @property
    def repository(self) -> dict[str, Any]:
        return self.statement["predicate"]["buildDefinition"]["externalParameters"]["repository"]


def published_at(statement: dict[str, Any]) -> str:
    """When a publication was made, as its signed statement says (older ones: the lock's time)."""
    metadata = (statement.get("predicate") or {}).get("runDetails", {}).get("metadata") or {}
    return str(metadata.get("finishedOn") or metadata.get("startedOn") or "")


def fetch_publication(reference: str, key: Path, bundle: str | None = None, repository: str | None = None) -> Publication:
    """Find the image's publications, verify each (its signature with KEY, that it is for this
    image, every file against its statement) and take the newest valid one, or the one naming
    BUNDLE. A candidate that fails (another key, a replay for another digest, a missing file) is
    skipped and named in `skipped`; only when none verifies does this fail. The signature names the
    image's repository path and digest; REPOSITORY says which path it names when that differs
    (a copy in another repository)."""
    image = ImageRef.parse(reference)
    public_key = signing.load_public_key(key)
    client = image_client(image)
    image_subject(client, image)
    referrers, where = client.referrers(image.digest)
    found_in = ("the referrers API" if where == "api"
                else f"the referrers API or the fallback tag {client.fallback_tag(image.digest)}")
    attestations = [r for r in referrers if r.artifact_type == ATTESTATION_TYPE]
    bundles = {r.digest for r in referrers if r.artifact_type == PUBLICATION_TYPE}
    if not attestations:
        raise PublishError(f"{image}: no signed publication ({len(bundles)} bundle(s), no attestation in {found_in})")
    valid, skipped = [], []
    for descriptor in sorted(attestations, key=lambda d: d.digest):
        try:
            valid.append(_verified(client, image, descriptor.digest, public_key, where, repository))
        except (ServestackError, KeyError, IndexError, TypeError, ValueError) as exc:
            skipped.append(f"attestation {descriptor.digest}: {exc}")
    if bundle:
        named = [v for v in valid if v.bundle_digest == bundle]
        skipped += [f"attestation {v.attestation_digest}: names bundle {v.bundle_digest}, not {bundle}" for v in valid
                    if v.bundle_digest != bundle]
        valid = named
    if not valid:
        raise PublishError(f"{image}: no publication signed by {key} verifies"
                           + (f" and names bundle {bundle}" if bundle else "") + ":\n  " + "\n  ".join(skipped))
    signed_sboms = frozenset(f.digest for v in valid for f in v.files if f.title == sbom.SBOM_TITLE)
    valid.sort(key=lambda v: (published_at(v.statement), v.attestation_digest), reverse=True)
    chosen, *older = valid
    skipped += [f"attestation {v.attestation_digest}: verifies, published {published_at(v.statement)}, older than "
                f"the one taken" for v in older]
    return replace(chosen, skipped=tuple(skipped), signed_sboms=signed_sboms)


def _verified(client: Client, image: ImageRef, attestation: str, public_key, where: str,
              repository: str | None = None) -> Publication:
    what = f"attestation {attestation}"
    manifest = _referrer_manifest(client, attestation, image, what)
    envelope = client.get_blob(manifest["layers"][0]["digest"])
    statement = signing.verify_envelope(envelope, public_key, what)
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement.get("subject", [])}
    identity = signed_identity(image, repository)
    names = {identity, str(image)}  # publications before the identity left the host out signed the full name
    if not any(subjects.get(n) == image.hex for n in names):
        signed_for = [n for n in subjects if "@sha256:" in n]
        raise PublishError(f"signed for {', '.join(signed_for) or 'another image'}, not {identity}"
                           + ("" if repository else " (a copy in another repository: say which one the signature "
                                                    "names, --repository)"))
    bundle_digest = manifest.get("annotations", {}).get(BUNDLE_ANNOTATION, "")
    if subjects.get("publication") != bundle_digest.split(":")[-1]:
        raise PublishError(f"names bundle {bundle_digest}, which its statement does not sign")
    bundle_bytes = client.get_manifest(bundle_digest) if bundle_digest else None
    if bundle_bytes is None:
        raise PublishError(f"the signed bundle {bundle_digest} is missing from {client.registry}")
    bundle = json.loads(bundle_bytes[0])
    if (bundle.get("subject") or {}).get("digest") != image.digest:
        raise PublishError(f"bundle {bundle_digest}: its subject is {(bundle.get('subject') or {}).get('digest')}, "
                           f"not {image.digest}")
    problem = titles_problem([(layer.get("annotations") or {}).get(TITLE, "") for layer in bundle.get("layers", [])])
    if problem:
        raise PublishError(f"bundle {bundle_digest}: {problem}")
    files = []
    for layer in bundle.get("layers", []):
        title = (layer.get("annotations") or {}).get(TITLE, "")
        if subjects.get(title) != layer["digest"].split(":")[-1]:
            raise PublishError(f"bundle {bundle_digest}: {title} has digest {layer['digest']}, the signed statement "
                               f"says sha256:{subjects.get(title, '(not signed)')}")
        try:
            data = client.get_blob(layer["digest"])
        except registry.RegistryError as exc:
            raise PublishError(f"bundle file {title}: {exc}") from None
        files.append(BundleFile(title, data))
    signed_files = set(subjects) - names - {"publication"}
    if signed_files != {f.title for f in files}:
        missing = sorted(signed_files - {f.title for f in files})
        raise PublishError(f"bundle {bundle_digest}: signed files missing from it: {', '.join(missing)}")
    return Publication(image, bundle_digest, attestation, statement, tuple(files), where)


def _referrer_manifest(client: Client, digest: str, image: ImageRef, what: str) -> dict[str, Any]:
    found = client.get_manifest(digest)
    if found is None:
        raise PublishError(f"{what}: listed as a referrer but missing from {client.registry}")
    manifest = json.loads(found[0])
    if (manifest.get("subject") or {}).get("digest") != image.digest:
        raise PublishError(f"{what}: its subject is {(manifest.get('subject') or {}).get('digest')}, not {image.digest}")
    return manifest


def check_image_agrees(publication: Publication) -> list[str]:
    """The image's labels and its own stack.json (top layer) against the bundle's lock; returns what was checked."""
    image = publication.image
    stack = publication.stack
    lock = publication.file(f"pins/{stack}.lock")
    lock_sha256 = sha256_bytes(lock.data)
    client = image_client(image)
    _, manifest_bytes = image_subject(client, image)
    manifest = json.loads(manifest_bytes)
    if manifest.get("mediaType") == OCI_INDEX or "manifests" in manifest:
        raise PublishError(f"{image} is a multi-platform index; publish and pull a platform's manifest digest")
    config = json.loads(client.get_blob(manifest["config"]["digest"]))
    labels = (config.get("config") or {}).get("Labels") or {}
    label = labels.get("io.servestack.lock.sha256")
    if label != lock_sha256:
        raise PublishError(f"{image}: label io.servestack.lock.sha256 is {label}, the bundle's lock is {lock_sha256}")
    top = manifest["layers"][-1]
    stack_json = file_in_layer(client.get_blob(top["digest"]), top["mediaType"], STACK_JSON)
    if stack_json is None:
        raise PublishError(f"{image}: its top layer has no /{STACK_JSON}")
    own = json.loads(stack_json)
    if own.get("lock_sha256") != lock_sha256 or own.get("lock") != json.loads(lock.data):
        raise PublishError(f"{image}: /{STACK_JSON} records lock {own.get('lock_sha256')}, the bundle's lock is "
                           f"{lock_sha256}")
    return [f"label io.servestack.lock.sha256 = {lock_sha256[:16]}", f"/{STACK_JSON} records the same lock"]


def check_sbom(publication: Publication) -> tuple[list[str], list[str]]:
    """The signed SBOM is valid SPDX describing this image and a plain SPDX referrer (what scanners
    read) holds its bytes. Returns what was checked (nothing for a publication made before SBOMs)
    and the other SPDX referrers that hold an SBOM no verified publication signs: another tool's,
    or a forgery. Those are named, not refused: like a replayed publication, another party's
    referrer must not block this one, and the user is told a scanner may read it instead."""
    signed = next((f for f in publication.files if f.title == sbom.SBOM_TITLE), None)
    if signed is None:
        return [], []
    image = publication.image
    value = sbom.read_sbom(signed.data, image, f"bundle file {sbom.SBOM_TITLE}")
    client = image_client(image)
    plain = [r for r in client.referrers(image.digest)[0] if r.artifact_type == sbom.SPDX_JSON]
    holding, unsigned = [], []
    for r in plain:
        manifest = _referrer_manifest(client, r.digest, image, f"{sbom.SPDX_JSON} referrer {r.digest}")
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
                f"signs (another tool's, or forged): a scanner may read it instead" for digest in unsigned]
    return checked, unsigned


def _default_out(image: ImageRef) -> Path:
    return Path.cwd() / f"servestack-{image.hex[:12]}"


def _check_recipes(staging: Path) -> list[str]:
    """The bundle's recipes pass `recipes validate` before they reach OUT (the engine's rules where this
    checkout describes their stack's engine): raises InputErrors, returns the warnings."""
    from ..recipes import check_before_run

    files = sorted((staging / "recipes").glob("*.yaml"))
    return [str(w).replace(str(staging) + os.sep, "") for w in check_before_run(files, Project.find())] if files else []


def pull(reference: str, *, key: Path, out: Path | None = None, bundle: str | None = None,
         repository: str | None = None, echo: Callable[[str], None] | None = print) -> Path:
    """Verify the image's publication and write its recipes, lock and results to OUT (untouched on any error)."""
    started = time.monotonic()
    image = ImageRef.parse(reference)
    out = (out or _default_out(image)).absolute()
    if out.is_symlink():
        raise InputError(out, "--out", f"is a symbolic link (to {os.readlink(out)}); pull writes a fresh directory: "
                                       "name the directory itself")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(out, "--out", "exists and is not an empty directory; pull writes a fresh one")
    publication = fetch_publication(reference, key, bundle, repository)
    checked = check_image_agrees(publication)
    sbom_checked, unsigned_sboms = check_sbom(publication)
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
        }))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if echo:
        recipes = [f.title for f in publication.files if f.title.startswith("recipes/")]
        echo(f"pull {image}\n  signature   attestation {publication.attestation_digest} verifies with {key}\n"
             f"  bundle      {publication.bundle_digest}: {len(publication.files)} files match the signed statement\n"
             + f"  published   {published_at(publication.statement)} (the newest that verifies, of "
             f"{len(publication.skipped) + 1} candidate{'s' if publication.skipped else ''})\n"
             + "".join(f"  skipped     {line}\n" for line in publication.skipped)
             + "".join(f"  image       {line}\n" for line in checked)
             + "".join(f"  sbom        {line}\n" for line in sbom_checked)
             + f"  source      commit {publication.repository.get('commit')}"
             f"{' (dirty tree)' if publication.repository.get('dirty') else ''}\n"
             f"  wrote       {out}: {len(recipes)} recipes bound to the digest (srtctl apply -f), lock, records "
             f"({time.monotonic() - started:.1f} s)"
             + "".join(f"\n  warning     {w}" for w in warnings))
    return out
