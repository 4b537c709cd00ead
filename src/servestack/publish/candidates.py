"""Which of an image's publications pull takes: every attestation among its referrers is a
candidate; each is verified (the signature with the key, that it names this image, its signed time,
its bundle's files against the statement, every recipe bound to this image) and the newest that
verifies is taken. A candidate that fails is skipped and named, never fatal: whoever can push a
referrer (a co-tenant, a replay of another image's publication) must not be able to block this one.
Everything read is bounded (sources/registry/limits.py), so a hostile registry costs seconds."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from securesystemslib.signer import SSlibKey

from servestack.errors import PublishError, RegistryError, ServestackError, SignatureError
from servestack.publish import sbom, signing
from servestack.publish.binding import check_bindings
from servestack.publish.bundle import (
    ATTESTATION_TYPE,
    BUNDLE_ANNOTATION,
    PUBLICATION_TYPE,
    TITLE,
    BundleFile,
    titles_problem,
)
from servestack.publish.listing import is_listed, listing_checker
from servestack.publish.provenance import PROVENANCE_V1, signed_identity
from servestack.publish.push import image_client, image_subject
from servestack.publish.signedtime import published_instant, utc_text
from servestack.records.imageref import ImageRef, names_a_digest
from servestack.sources.registry import Client, Descriptor
from servestack.sources.registry.limits import (
    BUNDLE_FILE_LIMIT,
    BUNDLE_TOTAL_LIMIT,
    ENVELOPE_LIMIT,
    MANIFEST_LIMIT,
    declared_problem,
)
from servestack.util.fsutil import sha256_bytes


@dataclass(frozen=True, kw_only=True)
class Publication:
    image: ImageRef
    bundle_digest: str
    attestation_digest: str
    statement: dict[str, Any]
    files: tuple[BundleFile, ...]
    referrers: str  # "api" or "tag"
    published: datetime  # the signed finishedOn, in UTC
    recipes: int = 0  # how many recipes were checked to bind this image and the bundle's lock
    skipped: tuple[str, ...] = ()  # the other candidates, each with why it was not taken
    signed_sboms: frozenset[str] = frozenset()  # the SBOM digests of every publication that verified
    listed: tuple[Descriptor, ...] = field(default=(), repr=False)  # the image's referrers, deduplicated

    def file(self, title: str) -> BundleFile:
        return next(f for f in self.files if f.title == title)

    @property
    def stack(self) -> str:
        return self.statement["predicate"]["buildDefinition"]["externalParameters"]["stack"]

    @property
    def repository(self) -> dict[str, Any]:
        return self.statement["predicate"]["buildDefinition"]["externalParameters"]["repository"]


def published_at(publication: Publication) -> str:
    return utc_text(publication.published)


def deduplicated(referrers: list[Descriptor]) -> list[Descriptor]:
    """One descriptor per (artifact type, digest), in digest order: an index may list one manifest
    thousands of times, and each copy would be verified (and held) again."""
    unique = {(r.artifact_type, r.digest): r for r in reversed(referrers)}
    return sorted(unique.values(), key=lambda r: (r.digest, str(r.artifact_type)))


def fetch_publication(reference: str, key: Path, bundle: str | None = None, repository: str | None = None,
                      *, floor: datetime | None = None, now: datetime | None = None,
                      usable: Callable[[Publication], object] | None = None) -> Publication:
    """Find the image's publications, verify each and take the newest valid one, or the one naming
    BUNDLE; none older than FLOOR (`--not-before`). A candidate that fails is skipped and named in
    `skipped`; only when none verifies does this fail. The signature names the image's repository
    path and digest; REPOSITORY says which path it names when that differs (a copy in another
    repository). USABLE raises PublishError for a signed publication that cannot be used (its lock is
    not the image's): it is skipped and the next newest taken.

    Which candidates are fetched is decided by what the key signed, never by their number or order:
    every listing signature is checked (listing.py), and only envelopes the key signed for this image
    are fetched, once each. Attestations without one (made before listings were signed) are examined
    one by one, within the deadline, only when no signed listing gives a usable publication."""
    image = ImageRef.parse(reference)
    public_key = signing.load_public_key(key)
    client = image_client(image)
    image_subject(client, image)
    listed, where = client.referrers(image.digest)
    referrers = deduplicated(listed)
    found_in = ("the referrers API" if where == "api"
                else f"the referrers API or the fallback tag {client.fallback_tag(image.digest)}")
    attestations = [r for r in referrers if r.artifact_type == ATTESTATION_TYPE]
    bundles = {r.digest for r in referrers if r.artifact_type == PUBLICATION_TYPE}
    if not attestations:
        raise PublishError(f"{image}: no signed publication ({len(bundles)} bundle(s), no attestation in {found_in})")
    now = now or datetime.now(UTC)
    check = listing_checker(public_key, image.digest)
    signed: dict[str, Descriptor] = {}  # envelope digest -> the first attestation listing it
    junk = 0
    for r in attestations:
        envelope = check(r.annotation) if is_listed(r.annotation) else None
        if envelope is not None:
            signed.setdefault(envelope, r)
        elif is_listed(r.annotation):
            junk += 1
    legacy = [r for r in attestations if not is_listed(r.annotation)]
    skipped: list[str] = [f"{junk} attestation(s) whose listing this key did not sign for {image.digest} (another "
                          f"key's, another image's, or junk): not fetched"] if junk else []
    candidates = [_candidate(functools.partial(_from_envelope, client, image, r.digest, e, public_key, where,
                                               repository, now), r.digest, floor)
                  for e, r in signed.items()]
    chosen = _choose(candidates, bundle, usable, skipped)
    if chosen is None and legacy:
        if bundle:  # the annotation is unsigned: it only orders the search, the statement must still name BUNDLE
            legacy.sort(key=lambda r: r.annotation.get(BUNDLE_ANNOTATION) != bundle)
        candidates += [_candidate(functools.partial(_verified, client, image, r, public_key, where, repository, now),
                                  r.digest, floor) for r in legacy]
        chosen = _choose(candidates, bundle, usable, skipped)
    elif legacy:
        skipped.append(f"{len(legacy)} attestation(s) without a signed listing (made before listings were signed, or "
                       f"junk): not examined, a newer signed one was taken")
    if chosen is None:
        # Nothing listed was signed by this key: the key is the wrong one (README, "Exit codes": 8), not a
        # publication that is missing or broken (10).
        failure = SignatureError if not signed else PublishError
        raise failure(f"{image}: no publication signed by {key} verifies"
                           + (f" and names bundle {bundle}" if bundle else "")
                           + (f" and is not older than {utc_text(floor)}" if floor else "") + ":\n  "
                           + "\n  ".join(skipped[:MAX_REASONS])
                           + (f"\n  ... and {len(skipped) - MAX_REASONS} more" if len(skipped) > MAX_REASONS else ""))
    valid = [c for c in candidates if isinstance(c, Publication)]
    signed_sboms = frozenset(f.digest for v in valid for f in v.files if f.title == sbom.SBOM_TITLE)
    return replace(chosen, skipped=tuple(skipped), signed_sboms=signed_sboms, listed=tuple(referrers))


MAX_REASONS = 20  # reasons a failed pull prints; the count says how many more


def _candidate(verify: Callable[[], Publication], digest: str, floor: datetime | None) -> Publication | str:
    """The verified publication, or why attestation DIGEST is skipped."""
    try:
        candidate = verify()
    except (ServestackError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        return f"attestation {digest}: {str(exc)[:500]}"
    if floor is not None and candidate.published < floor:
        return (f"attestation {digest}: verifies, published {published_at(candidate)}, before --not-before "
                f"{utc_text(floor)}")
    return candidate


def _choose(candidates: list[Publication | str], bundle: str | None, usable: Callable[[Publication], object] | None,
            skipped: list[str]) -> Publication | None:
    """The newest usable publication (naming BUNDLE when given); every other candidate's reason goes to SKIPPED."""
    already = set(skipped)  # a second round (attestations without a signed listing) repeats the first's reasons
    reasons = [c for c in candidates if isinstance(c, str) and c not in already]
    valid = [c for c in candidates if isinstance(c, Publication)]
    if bundle:
        reasons += [f"attestation {v.attestation_digest}: names bundle {v.bundle_digest}, not {bundle}" for v in valid
                    if v.bundle_digest != bundle]
        valid = [v for v in valid if v.bundle_digest == bundle]
    valid.sort(key=lambda v: (v.published, v.attestation_digest), reverse=True)
    chosen = None
    for v in valid:
        if chosen is not None:
            reasons.append(f"attestation {v.attestation_digest}: verifies, published {published_at(v)}, older than "
                           f"the one taken")
            continue
        try:
            if usable is not None:
                usable(v)
            chosen = v
        except PublishError as exc:
            reasons.append(f"WARNING: attestation {v.attestation_digest}: signed with this key, published "
                           f"{published_at(v)}, but unusable: {str(exc)[:400]}")
    skipped += [r for r in dict.fromkeys(reasons) if r not in already]
    return chosen


def _from_envelope(client: Client, image: ImageRef, attestation: str, envelope_digest: str, public_key: SSlibKey,
                   where: str, repository: str | None, now: datetime) -> Publication:
    envelope = client.get_blob(envelope_digest, limit=ENVELOPE_LIMIT)
    return _publication(client, image, attestation, envelope, public_key, where, repository, now)


def _verified(client: Client, image: ImageRef, descriptor: Descriptor, public_key: SSlibKey, where: str,
              repository: str | None, now: datetime) -> Publication:
    """A candidate without a signed listing: its manifest, then its envelope."""
    manifest = referrer_manifest(client, descriptor, image, f"attestation {descriptor.digest}")
    envelope_layer = manifest["layers"][0]
    problem = declared_problem(envelope_layer.get("size"), ENVELOPE_LIMIT, "its envelope")
    if problem:
        raise PublishError(problem)
    envelope = client.get_blob(envelope_layer["digest"], size=envelope_layer["size"])
    return _publication(client, image, descriptor.digest, envelope, public_key, where, repository, now)


def _publication(client: Client, image: ImageRef, attestation: str, envelope: bytes, public_key: SSlibKey, where: str,
                 repository: str | None, now: datetime) -> Publication:
    statement = signing.verify_envelope(envelope, public_key, f"attestation {attestation}")
    if statement.get("predicateType") != PROVENANCE_V1:
        raise PublishError(f"signed for another purpose: predicate type {str(statement.get('predicateType'))[:100]!r}, "
                           f"not {PROVENANCE_V1}")
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement.get("subject", [])}
    identity = signed_identity(image, repository)
    names = {identity, str(image)}  # publications before the identity left the host out signed the full name
    if not any(subjects.get(n) == image.hex for n in names):
        signed_for = [n for n in subjects if names_a_digest(n)]
        raise PublishError(f"signed for {', '.join(signed_for)[:300] or 'another image'}, not {identity}"
                           + ("" if repository else " (a copy in another repository: say which one the signature "
                                                    "names, --repository)"))
    published = published_instant(statement, now)
    if not isinstance(subjects.get("publication"), str):
        raise PublishError("its statement signs no bundle")
    bundle_digest = f"sha256:{subjects['publication']}"
    bundle_bytes = client.get_manifest(bundle_digest)
    if bundle_bytes is None:
        raise PublishError(f"the signed bundle {bundle_digest} is missing from {client.registry}")
    files = _bundle_files(client, image, bundle_digest, json.loads(bundle_bytes[0]), subjects)
    signed_files = {n for n in subjects if not names_a_digest(n)} - names - {"publication"}
    if signed_files != {f.title for f in files}:
        missing = sorted(signed_files - {f.title for f in files})
        raise PublishError(f"bundle {bundle_digest}: signed files missing from it: {', '.join(missing)[:500]}")
    stack = statement["predicate"]["buildDefinition"]["externalParameters"]["stack"]
    lock = next((f for f in files if f.title == f"pins/{stack}.lock"), None)
    if lock is None:
        raise PublishError(f"bundle {bundle_digest}: no pins/{str(stack)[:80]}.lock")
    recipes = check_bindings(tuple(files), identity, sha256_bytes(lock.data))
    return Publication(image=image, bundle_digest=bundle_digest, attestation_digest=attestation, statement=statement,
                       files=tuple(files), referrers=where, published=published, recipes=recipes)


def _bundle_files(client: Client, image: ImageRef, bundle_digest: str, bundle: dict[str, Any],
                  subjects: dict[str, str]) -> list[BundleFile]:
    """The bundle's files, each read up to its declared size once every declaration is in bounds."""
    if (bundle.get("subject") or {}).get("digest") != image.digest:
        raise PublishError(f"bundle {bundle_digest}: its subject is {(bundle.get('subject') or {}).get('digest')}, "
                           f"not {image.digest}")
    layers = bundle.get("layers", [])
    problem = titles_problem([(layer.get("annotations") or {}).get(TITLE, "") for layer in layers])
    if problem:
        raise PublishError(f"bundle {bundle_digest}: {problem}")
    for layer in layers:
        problem = declared_problem(layer.get("size"), BUNDLE_FILE_LIMIT, f"file {layer['annotations'][TITLE]}")
        if problem:
            raise PublishError(f"bundle {bundle_digest}: {problem}")
    if sum(layer["size"] for layer in layers) > BUNDLE_TOTAL_LIMIT:
        raise PublishError(f"bundle {bundle_digest}: its files declare more than {BUNDLE_TOTAL_LIMIT} bytes in all")
    files = []
    for layer in layers:
        title = layer["annotations"][TITLE]
        if subjects.get(title) != layer["digest"].split(":")[-1]:
            raise PublishError(f"bundle {bundle_digest}: {title} has digest {layer['digest']}, the signed statement "
                               f"says sha256:{subjects.get(title, '(not signed)')}")
        try:
            data = client.get_blob(layer["digest"], size=layer["size"])
        except RegistryError as exc:
            raise PublishError(f"bundle file {title}: {exc}") from None
        files.append(BundleFile(title=title, data=data))
    return files


def referrer_manifest(client: Client, descriptor: Descriptor, image: ImageRef, what: str) -> dict[str, Any]:
    """A referrer's manifest, read no further than its descriptor declares, whose subject must be IMAGE."""
    problem = declared_problem(descriptor.size, MANIFEST_LIMIT, "its descriptor")
    if problem:
        raise PublishError(f"{what}: {problem}")
    found = client.get_manifest(descriptor.digest, limit=descriptor.size)
    if found is None:
        raise PublishError(f"{what}: listed as a referrer but missing from {client.registry}")
    manifest = json.loads(found[0])
    if (manifest.get("subject") or {}).get("digest") != image.digest:
        raise PublishError(f"{what}: its subject is {str((manifest.get('subject') or {}).get('digest'))[:80]}, "
                           f"not {image.digest}")
    return manifest
