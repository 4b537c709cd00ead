"""`publish`: copy the image if asked (by digest), then push the bundle and its attestation as referrers of the
image: blobs, then manifests, then the referrers index, so nothing indexed points at something missing."""

from __future__ import annotations

import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servestack.errors import InputError, PublishError, ServestackError
from servestack.publish import cosign, sbom, signing
from servestack.publish.bundle import (
    ATTESTATION_TYPE,
    BUNDLE_ANNOTATION,
    CREATED,
    PUBLICATION_TYPE,
    BundleFile,
    Records,
    attestation_manifest,
    bundle_files,
    check_smoke,
    created_timestamp,
    publication_manifest,
    sbom_manifest,
)
from servestack.publish.listing import is_listed, listing_annotations
from servestack.publish.provenance import PROVENANCE_V1, Source, provenance, signed_identity
from servestack.records.imageref import ImageRef
from servestack.records.lockfile import read_lock
from servestack.records.steps import read_build
from servestack.sources import registry
from servestack.sources.registry import OCI_MANIFEST, Client, Descriptor, sha256_digest
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import Project


def image_client(image: ImageRef) -> Client:
    return Client.for_reference(str(image))


def image_subject(client: Client, image: ImageRef) -> tuple[Descriptor, bytes]:
    found = client.get_manifest(image.digest)
    if found is None:
        raise PublishError(f"{image}: no such manifest in {client.registry}")
    data, media_type = found
    media_type = media_type or json.loads(data).get("mediaType", OCI_MANIFEST)
    return Descriptor(media_type=media_type, digest=image.digest, size=len(data)), data


def copy_image(source: ImageRef, to: str) -> ImageRef:
    """Copy SOURCE to the repository TO (REGISTRY/REPO) by digest: the manifest's bytes unchanged
    (so its digest), every blob it names (a multi-platform index: each platform's manifest too),
    then a tag so the registry keeps it. Our own client, not skopeo: skopeo 1.9 refuses a Docker
    v2s2 manifest with zstd layers, which is what every stack's image is."""
    if "@" in to or ImageRef.problem(f"{to}@{source.digest}"):
        raise InputError("--to", "", f"expected REGISTRY/REPOSITORY without tag or digest, got {to!r}")
    target = ImageRef.parse(f"{to}@{source.digest}")
    if target.name == source.name:
        return source
    src, dst = image_client(source), image_client(target)
    with tempfile.TemporaryDirectory(prefix="servestack-copy-") as scratch:
        data, media_type = _copy_manifest(src, dst, source.digest, Path(scratch))
    dst.put_manifest(f"servestack-{source.hex[:16]}", data, media_type)
    served = registry.resolve_digest(f"{to}:servestack-{source.hex[:16]}")
    if served != source.digest:
        raise PublishError(f"copying {source} to {to} changed its digest to {served}")
    return target


def _copy_manifest(src: Client, dst: Client, digest: str, scratch: Path) -> tuple[bytes, str]:
    found = src.get_manifest(digest)
    if found is None:
        raise PublishError(f"{src.registry}/{src.repository}@{digest}: no such manifest")
    data, media_type = found
    body = json.loads(data)
    media_type = media_type or body.get("mediaType", OCI_MANIFEST)
    for child in body.get("manifests", []):  # an index: its platforms first
        _copy_manifest(src, dst, child["digest"], scratch)
    for blob in [body.get("config"), *body.get("layers", [])]:
        if not blob or dst.has_blob(blob["digest"]):
            continue
        if dst.registry == src.registry and dst.mount_blob(blob["digest"], src.repository):
            continue
        path = scratch / blob["digest"].replace(":", "-")
        src.download_blob(blob["digest"], path)  # checked against its digest on the way
        dst.push_blob_file(path, blob["digest"])
        path.unlink()
    dst.put_manifest(digest, data, media_type)
    return data, media_type


def _signed_already(client: Client, image: ImageRef, bundle_digest: str,
                    signer: signing.CryptoSigner) -> tuple[bytes, bytes] | None:
    """(attestation manifest, envelope) of a publication of this bundle this key signed, if any (one made
    before the listing was signed is made again, with it)."""
    referrers, _ = client.referrers(image.digest)
    for r in referrers:
        if r.artifact_type != ATTESTATION_TYPE or r.annotation.get(BUNDLE_ANNOTATION) != bundle_digest \
                or not is_listed(r.annotation):
            continue
        try:
            found = client.get_manifest(r.digest)
            if found is None:
                continue
            envelope = client.get_blob(json.loads(found[0])["layers"][0]["digest"])
            signing.verify_envelope(envelope, signer.public_key, f"attestation {r.digest}")
        except (ServestackError, KeyError, IndexError, ValueError, TypeError):
            continue  # damaged or another key's: a complete one is written beside it
        return found[0], envelope
    return None


def _ensure(client: Client, blobs: list[bytes], manifests: list[tuple[bytes, str, str]],
            repaired: list[str]) -> None:
    """Every blob, then every (manifest, artifact type, what) present: each is checked with a HEAD
    and pushed only when missing, so a re-run repairs a damaged publication and leaves a whole one
    alone. Blobs first: the registry refuses a manifest whose blobs are missing."""
    for data in dict.fromkeys(blobs):
        if not client.has_blob(sha256_digest(data)):
            client.push_blob(data)
            repaired.append(f"blob {sha256_digest(data)}")
    for data, _, what in manifests:
        digest = sha256_digest(data)
        if not client.has_manifest(digest):
            client.put_manifest(digest, data, OCI_MANIFEST)
            repaired.append(f"{what} manifest {digest}")


def check_records_belong(client: Client, image: ImageRef, manifest: dict[str, Any], records: Records,
                         files: list[BundleFile], also: frozenset[str] = frozenset()) -> None:
    """The records are this image's: the lock is the one its label names, and every run result names its
    digest (or one of ALSO: the index and its other platforms). A publication of another lock would be
    signed and then refused by every pull."""
    config = json.loads(client.get_blob(manifest["config"]["digest"], size=manifest["config"].get("size")))
    label = ((config.get("config") or {}).get("Labels") or {}).get("io.servestack.lock.sha256")
    lock_sha256 = sha256_digest(records.lock.read_bytes()).split(":")[1]
    if label != lock_sha256:
        raise PublishError(f"{records.lock}: lock {lock_sha256[:16]}, but {image} was built from lock {str(label)[:16]} "
                           f"(its label io.servestack.lock.sha256): publish the records of this image")
    for f in files:
        if f.title.startswith("runs/") and f.title.endswith("/results.json"):
            try:
                named = json.loads(f.data).get("image")
            except (ValueError, AttributeError):
                raise PublishError(f"{records.shown}/{f.title}: not a JSON object of results") from None
            if named is not None and str(named).rsplit("@", 1)[-1] not in {image.digest, *also}:
                raise PublishError(f"{records.shown}/{f.title}: results of {str(named)[:200]}, not of {image}")


def _push_plain_sbom(client: Client, image: ImageRef, subject: Descriptor, document: bytes, created: str) -> str:
    """The SBOM where scanners look, a plain referrer of the image holding the bytes the bundle
    signs; pushed again on a re-publish, which adds nothing (its manifest is a function of them)."""
    manifest = sbom_manifest(document, subject, created)
    client.push_blob(registry.EMPTY_JSON)
    client.push_blob(document)
    digest = sha256_digest(manifest)
    client.add_referrer(image.digest, Descriptor(media_type=OCI_MANIFEST, digest=digest, size=len(manifest), artifact_type=sbom.SPDX_JSON,
                                                annotations=((CREATED, created),)),
                        client.put_manifest(digest, manifest, OCI_MANIFEST))
    return digest


def _sign_and_push(client: Client, target: ImageRef, subject: Descriptor, files: list[BundleFile], stack: str,
                   signer: signing.CryptoSigner, project: Project, run_id: str | None, created: str,
                   attestations: list[tuple[bytes, str]], platforms: tuple[ImageRef, ...] = (),
                   smoke_served: bool = True) -> dict[str, Any]:
    """The bundle of FILES and its signed statement as referrers of TARGET, and cosign's layouts; a
    re-run adds nothing for the same files and repairs what is missing."""
    manifest = publication_manifest(files, subject, created)
    bundle_digest = sha256_digest(manifest)
    already = _signed_already(client, target, bundle_digest, signer)
    if already is not None:  # the same files, signed by this key: re-signing would add a second publication
        attestation, envelope = already
    else:
        published = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        envelope = signing.sign_statement(provenance(stack, target, bundle_digest, files, Source.of(project.root),
                                                     run_id, created, published, platforms, smoke_served), signer)
        attestation = attestation_manifest(envelope, subject, bundle_digest, created,
                                           listing_annotations(signer, target.digest, sha256_digest(envelope)))
    attestation_digest = sha256_digest(attestation)
    listed = tuple(sorted(json.loads(attestation)["annotations"].items()))
    # Blobs, then manifests (the registry checks their blobs exist), then the referrers index:
    # whatever fails halfway, nothing is indexed that points at something missing; and a re-run
    # finds what a failure or a deletion left missing and puts it back.
    repaired: list[str] = []
    _ensure(client, [registry.EMPTY_JSON, envelope, *(f.data for f in files)],
            [(manifest, PUBLICATION_TYPE, "bundle"), (attestation, ATTESTATION_TYPE, "attestation")], repaired)
    headers = {"OCI-Subject": target.digest} if client.referrers(target.digest)[1] == "api" else {}
    how = client.add_referrer(target.digest, Descriptor(media_type=OCI_MANIFEST, digest=bundle_digest, size=len(manifest),
                                                       artifact_type=PUBLICATION_TYPE, annotations=((CREATED, created),)), headers)
    client.add_referrer(target.digest, Descriptor(media_type=OCI_MANIFEST, digest=attestation_digest, size=len(attestation),
                                                 artifact_type=ATTESTATION_TYPE, annotations=listed), headers)
    tags = cosign.attach(client, target, subject, signer, [(envelope, PROVENANCE_V1), *attestations])
    return {
        "image": str(target),
        "bundle": f"{target.name}@{bundle_digest}",
        "bundle_digest": bundle_digest,
        "attestation": f"{target.name}@{attestation_digest}",
        "referrers": "api" if how == "api" else f"fallback tag {client.fallback_tag(target.digest)}",
        "cosign": tags,
        "files": [{"title": f.title, "digest": f.digest, "size": len(f.data)} for f in files],
        "bundle_size": len(manifest) + sum(len(f.data) for f in files),
        "run": run_id,
        "repaired": repaired if already is not None else [],
        "damaged": tags.get("damaged", []),
    }


def _publish_image(project: Project, stack: str, records: Records, target: ImageRef, signer: signing.CryptoSigner,
                   run_id: str | None, platform: str | None = None, also: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One image manifest's publication: its SBOM (from its own base layers; another PLATFORM of an index
    has the lock's wheels for it), the bundle, the statement, cosign's layouts."""
    lock = read_lock(records.lock, f"run `nox -s lock -- --stack {stack}` first")
    created = created_timestamp(lock)
    client = image_client(target)
    subject, image_manifest = image_subject(client, target)
    build = read_build(records.steps / "build.json", "run the session that makes it first", f"{records.shown}/build.json")
    base = sbom.base_system(client, json.loads(image_manifest), records.image())
    wheels = sbom.lock_build(build, lock, platform or build.platform)
    document = sbom.spdx_document(stack, target, wheels, lock, base, created, build_from_lock=wheels is not build)
    with tempfile.TemporaryDirectory(prefix="servestack-publish-") as scratch:
        files = bundle_files(project, stack, target, run_id, Path(scratch), records, document)
    check_records_belong(client, target, json.loads(image_manifest), records, files, also)
    # First, so no publication is indexed whose SBOM pull would not find.
    sbom_digest = _push_plain_sbom(client, target, subject, document, created)
    # Signed where `cosign verify-attestation --type spdxjson` looks, beside the provenance.
    sbom_envelope = signing.sign_statement(signing.statement(
        [signing.Subject(name=signed_identity(target), sha256=target.hex)], sbom.SPDX_PREDICATE, json.loads(document)), signer)
    record = _sign_and_push(client, target, subject, files, stack, signer, project, run_id, created,
                            [(sbom_envelope, sbom.SPDX_PREDICATE)], smoke_served=records.smoke().served)
    return {**record, "sbom": {"referrer": f"{target.name}@{sbom_digest}", "packages": len(json.loads(document)["packages"]),
                               "document": document}}


def index_platforms(manifest: dict[str, Any]) -> dict[str, str]:
    """{platform name: manifest digest} of an image index (linux/arm64/v8 is named linux/arm64)."""
    found = {}
    for entry in manifest.get("manifests") or []:
        platform = entry.get("platform") or {}
        found[f"{platform.get('os')}/{platform.get('architecture')}"] = entry.get("digest")
    return found


def _publish_index(project: Project, stack: str, records: Records, target: ImageRef, signer: signing.CryptoSigner,
                   run_id: str | None, manifest: dict[str, Any]) -> dict[str, Any]:
    """Every platform's manifest published on its own (so its digest pulls alone), then the index: one
    bundle naming the index and each platform, with every platform's SBOM, recipes bound to the index."""
    platforms = index_platforms(manifest)
    related = frozenset([target.digest, *platforms.values()])
    each = {name: _publish_image(project, stack, records, ImageRef.parse(f"{target.name}@{digest}"), signer, run_id,
                                 name, related) for name, digest in sorted(platforms.items())}
    lock = read_lock(records.lock, f"run `nox -s lock -- --stack {stack}` first")
    created = created_timestamp(lock)
    client = image_client(target)
    subject, _ = image_subject(client, target)
    with tempfile.TemporaryDirectory(prefix="servestack-publish-") as scratch:
        files = bundle_files(project, stack, target, run_id, Path(scratch), records)
    files = sorted(files + [BundleFile(title=platform_sbom_title(name), data=r["sbom"]["document"])
                            for name, r in each.items()], key=lambda f: f.title)
    record = _sign_and_push(client, target, subject, files, stack, signer, project, run_id, created, [],
                            tuple(ImageRef.parse(r["image"]) for r in each.values()), records.smoke().served)
    for r in each.values():
        del r["sbom"]["document"]
    return {**record, "platforms": each}


def platform_sbom_title(platform: str) -> str:
    """Where an index's bundle holds PLATFORM's SBOM (the platform's own bundle has it as sbom.spdx.json)."""
    return f"sbom/{platform.replace('/', '-')}.spdx.json"


def publish(project: Project, stack: str, *, key: Path, image: str | None = None, to: str | None = None,
            run_id: str | None = None, records_dir: Path | None = None, allow_static_smoke: bool = False) -> dict[str, Any]:
    """Push the signed bundle as referrers of the image; writes build/<stack>/publish.json.

    The image is IMAGE, or the one build/<stack>/image.json records: its image index when it records
    one (every platform's manifest is published too), else its manifest. Its lock and step records come
    from this checkout, or from RECORDS_DIR, a directory `pull` wrote for the same digest (a cluster
    adding its run's results to an image it did not build)."""
    started = time.monotonic()
    records = Records.pulled(records_dir, stack) if records_dir else Records.of_project(project, stack)
    recorded = ImageRef.parse(records.image().reference)
    index = records.image().index
    source_image = ImageRef.parse(image or (f"{recorded.name}@{index}" if index else str(recorded)))
    _, source_bytes = image_subject(image_client(source_image), source_image)
    source_manifest = json.loads(source_bytes)
    is_index = "manifests" in source_manifest
    if is_index and recorded.digest not in index_platforms(source_manifest).values():
        raise PublishError(f"{records.shown}/image.json is for {recorded}, which is not a platform of the index "
                           f"{source_image}: publish the records of one of its platforms")
    check_smoke(records, ImageRef.parse(f"{source_image.name}@{recorded.digest}") if is_index else source_image,
                allow_static_smoke)
    signer = signing.load_signer(key)  # a bad key fails before anything is pushed
    unprotected = signing.key_permission_problem(key)
    if unprotected:
        console.progress(unprotected)
    target = copy_image(source_image, to) if to else source_image
    if is_index:
        record = _publish_index(project, stack, records, target, signer, run_id, source_manifest)
    else:
        record = _publish_image(project, stack, records, target, signer, run_id)
        del record["sbom"]["document"]
    record["seconds"] = round(time.monotonic() - started, 2)
    atomic_write_json(project.artifacts(stack) / "publish.json", record)
    console.progress(_said(stack, record))
    return record


def _said(stack: str, record: dict[str, Any]) -> str:
    tags = record["cosign"]
    lines = [f"publish {stack}: {record['image']}",
             f"  bundle      {record['bundle']} ({len(record['files'])} files, {record['bundle_size']} bytes)",
             f"  attestation {record['attestation']}", f"  referrers   {record['referrers']}"]
    lines += [f"  platform    {name}: {r['image']}, bundle {r['bundle_digest'][:19]}, sbom {r['sbom']['packages']} packages"
              for name, r in record.get("platforms", {}).items()]
    if "sbom" in record:
        lines.append(f"  sbom        {record['sbom']['referrer']} (SPDX 2.3, {record['sbom']['packages']} packages)")
    lines.append(f"  cosign      {tags['signature']}, {tags['attestation']} (cosign 2); {len(tags['bundles'])} "
                 f"Sigstore bundles among the referrers (cosign 3)")
    lines += [f"  repaired    {line}" for line in record["repaired"]]
    lines += [f"  damaged     {line}" for line in record["damaged"]]
    return "\n".join(lines) + f" ({record['seconds']:.1f} s) -> build/{stack}/publish.json"
