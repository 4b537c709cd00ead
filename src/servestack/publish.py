"""Publish an image with its recipes, lock and results as one signed OCI bundle; pull and verify it by digest.

    publish(project, "dev-cpu", key=Path("servestack.key"))           # -> build/dev-cpu/publish.json
    pull("reg/servestack/dev-cpu@sha256:...", key=Path("servestack.pub"), out=Path("dev-cpu"))
    verify_rebuild(project, "reg/servestack/dev-cpu@sha256:...")

The bundle is an OCI 1.1 artifact manifest whose `subject` is the image: the empty config, one
layer per file (titled with its path: the recipes bound to the digest, the lock, the stack file,
the build/image/smoke records, a run's results). Its signature is a second referrer of the image:
an in-toto v1 statement (subjects: the image, the bundle manifest, every file; predicate: SLSA
provenance v1) in a DSSE envelope. Everything in the bundle derives from its inputs and the
lock's SOURCE_DATE_EPOCH, so the same inputs give the same bundle digest.

Planning (the files, the manifests, the statement) returns data; `publish` and `pull` do the I/O.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from . import proc, signing
from .errors import InputError, ServestackError
from .fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from .imageref import ImageRef
from .project import Project, cache_home
from .sources import registry
from .sources.registry import OCI_EMPTY, OCI_INDEX, OCI_MANIFEST, Client, Descriptor, sha256_digest

PUBLICATION_TYPE = "application/vnd.servestack.publication.v1+json"
ATTESTATION_TYPE = "application/vnd.servestack.attestation.v1+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:servestack:build-type:image-from-lock:v1"
BUILDER_ID = "urn:servestack:builder:publish"
TITLE = "org.opencontainers.image.title"
CREATED = "org.opencontainers.image.created"
BUNDLE_ANNOTATION = "io.servestack.publication"
STACK_JSON = "opt/servestack/stack.json"
MEDIA_TYPES = {".json": "application/json", ".lock": "application/json", ".yaml": "application/yaml",
               ".md": "text/markdown", ".png": "image/png", ".svg": "image/svg+xml", ".xml": "application/xml"}
RUN_FILES = ("results.json", "report.md")  # plus every plot


class PublishError(ServestackError):
    """A publication that cannot be made, found or trusted; the message says which part and why."""


@dataclass(frozen=True)
class BundleFile:
    title: str  # a relative POSIX path: where pull writes it
    data: bytes

    @property
    def digest(self) -> str:
        return sha256_digest(self.data)

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES.get(PurePosixPath(self.title).suffix, "application/octet-stream")

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data),
                "annotations": {TITLE: self.title}}


def _title_problem(title: str) -> str | None:
    if not title or any(part in ("", ".", "..") or part.startswith(".") for part in title.split("/")):
        return f"file title {title!r} is not a plain relative path"
    return None


# --------------------------------------------------------------------------- planning


def created_timestamp(lock_doc: dict[str, Any]) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(lock_doc["source_date_epoch"])))


@dataclass(frozen=True)
class Records:
    """Where the lock, the stack file and the build/image/smoke records come from: this checkout, or
    a directory `pull` wrote (a cluster publishing its run for an image it did not build)."""

    lock: Path
    stack_file: Path
    steps: Path  # holds build.json, image.json, smoke.json
    shown: str  # how errors name `steps`

    @classmethod
    def of_project(cls, project: Project, stack: str) -> Records:
        return cls(project.lock_file(stack), project.stack_file(stack), project.artifacts(stack), f"build/{stack}")

    @classmethod
    def pulled(cls, directory: Path, stack: str) -> Records:
        return cls(directory / "pins" / f"{stack}.lock", directory / "pins" / f"{stack}.yaml", directory / "build",
                   str(directory / "build"))

    def read(self, name: str) -> dict[str, Any]:
        try:
            return json.loads((self.steps / name).read_text())
        except FileNotFoundError:
            raise PublishError(f"{self.shown}/{name}: missing; run the session that makes it first") from None
        except ValueError as exc:
            raise PublishError(f"{self.shown}/{name}: not valid JSON ({exc})") from None


def check_smoke(records: Records, image: ImageRef) -> None:
    smoke = records.read("smoke.json")
    where = f"{records.shown}/smoke.json"
    if smoke.get("image") != str(image):
        raise PublishError(f"{where} is for {smoke.get('image')}, not {image}: run `nox -s smoke` on this digest first")
    if smoke.get("status") != "pass":
        failed = [f"{c['probe']}/{c['name']}" for c in smoke.get("checks", []) if c.get("status") == "fail"]
        raise PublishError(f"{where}: smoke failed for {image} ({', '.join(failed) or 'no passing status'}); "
                           f"only an image that passed smoke is published")


def bundle_files(project: Project, stack: str, image: ImageRef, run_id: str | None, scratch: Path,
                 records: Records | None = None) -> list[BundleFile]:
    """Every file of the bundle, sorted by title; the recipes are rendered now, bound to IMAGE, and validated."""
    from . import recipes

    records = records or Records.of_project(project, stack)
    files = [
        BundleFile(f"pins/{stack}.lock", records.lock.read_bytes()),
        BundleFile(f"pins/{stack}.yaml", records.stack_file.read_bytes()),
    ]
    for name in ("build.json", "image.json", "smoke.json"):
        records.read(name)  # present and JSON
        files.append(BundleFile(f"build/{name}", (records.steps / name).read_bytes()))
    rendered = recipes.render_recipes(project, stack, str(image), records.lock, out_dir=scratch / "recipes")
    engine = recipes.engine_file(project, stack)
    problems = recipes.validate_paths(rendered, engine if engine.exists() else None, require_digest=True)
    if problems:
        raise PublishError("the bound recipes do not validate:\n" + "\n".join(str(p) for p in problems))
    files += [BundleFile(f"recipes/{p.name}", p.read_bytes()) for p in rendered]
    if run_id:
        run_dir = project.artifacts(stack) / "runs" / run_id
        if not run_dir.is_dir():
            raise InputError(run_dir, "--run", "no such run; the run ids are the directories of build/<stack>/runs/")
        for path in sorted(run_dir.rglob("*")):
            if path.is_file() and (path.name in RUN_FILES or path.suffix in (".png", ".svg")):
                files.append(BundleFile(f"runs/{run_id}/{path.relative_to(run_dir).as_posix()}", path.read_bytes()))
    return sorted(files, key=lambda f: f.title)


def publication_manifest(files: list[BundleFile], subject: Descriptor, created: str) -> bytes:
    return _json_bytes({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": PUBLICATION_TYPE,
        "config": _empty_descriptor(),
        "layers": [f.descriptor() for f in files],
        "subject": subject.to_json(),
        "annotations": {CREATED: created},
    })


def attestation_manifest(envelope: bytes, subject: Descriptor, bundle_digest: str, created: str) -> bytes:
    return _json_bytes({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ATTESTATION_TYPE,
        "config": _empty_descriptor(),
        "layers": [{"mediaType": DSSE_MEDIA_TYPE, "digest": sha256_digest(envelope), "size": len(envelope),
                    "annotations": {TITLE: "publication.intoto.json"}}],
        "subject": subject.to_json(),
        "annotations": {CREATED: created, BUNDLE_ANNOTATION: bundle_digest},
    })


def _empty_descriptor() -> dict[str, Any]:
    return {"mediaType": OCI_EMPTY, "digest": sha256_digest(registry.EMPTY_JSON), "size": len(registry.EMPTY_JSON)}


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
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
        return cls(git("rev-parse", "HEAD"), url or None, bool(git("status", "--porcelain", "--untracked-files=no")))


def provenance(stack: str, image: ImageRef, bundle_digest: str, files: list[BundleFile], source: Source,
               run_id: str | None, created: str) -> dict[str, Any]:
    """The in-toto statement: the image, the bundle manifest and every file, with SLSA provenance."""
    lock = next(f for f in files if f.title == f"pins/{stack}.lock")
    subjects = [signing.Subject(str(image), image.hex), signing.Subject("publication", bundle_digest.split(":")[1])]
    subjects += [signing.Subject(f.title, f.digest.split(":")[1]) for f in files]
    dependencies: list[dict[str, Any]] = [{"name": f"pins/{stack}.lock", "digest": {"sha256": lock.digest.split(":")[1]}}]
    if source.commit:
        dependencies.insert(0, {"uri": f"git+{source.url or 'local'}@{source.commit}", "digest": {"gitCommit": source.commit}})
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"stack": stack, "run": run_id,
                                   "repository": {"commit": source.commit, "url": source.url, "dirty": source.dirty}},
            "internalParameters": {},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {"builder": {"id": BUILDER_ID}, "metadata": {"invocationId": bundle_digest, "startedOn": created}},
    }
    return signing.statement(subjects, PROVENANCE_V1, predicate)


# --------------------------------------------------------------------------- publish


def _client(image: ImageRef) -> Client:
    return Client.for_reference(str(image))


def _subject(client: Client, image: ImageRef) -> tuple[Descriptor, bytes]:
    found = client.get_manifest(image.digest)
    if found is None:
        raise PublishError(f"{image}: no such manifest in {client.registry}")
    data, media_type = found
    media_type = media_type or json.loads(data).get("mediaType", OCI_MANIFEST)
    return Descriptor(media_type, image.digest, len(data)), data


def skopeo_tls_args(side: str, name: str) -> list[str]:
    """skopeo's trust and credential flags for one side (src/dest) of a copy, from registry's settings."""
    host = registry.Reference.parse(name + "@sha256:" + "0" * 64).registry
    args = []
    ca = registry.ca_file(host)
    if ca is not None:
        args.append(f"--{side}-cert-dir={ca.parent}")
    elif registry.Client(host, "x").base_url.startswith("http:"):
        args.append(f"--{side}-tls-verify=false")
    auth = next((p for p in registry.auth_files() if p.is_file()), None)
    if auth is not None:
        args.append(f"--{side}-authfile={auth}")
    return args


def copy_image(source: ImageRef, to: str) -> ImageRef:
    """Copy SOURCE to the repository TO (REGISTRY/REPO) by digest; the digest must not change."""
    if "@" in to or ImageRef.problem(f"{to}@{source.digest}"):
        raise InputError("--to", "", f"expected REGISTRY/REPOSITORY without tag or digest, got {to!r}")
    target = ImageRef.parse(f"{to}@{source.digest}")
    if target.name == source.name:
        return source
    tag = f"servestack-{source.hex[:16]}"  # skopeo copies to a tag; the digest is checked below
    proc.run(["skopeo", "copy", "--quiet", "--preserve-digests", *skopeo_tls_args("src", source.name),
              *skopeo_tls_args("dest", to), f"docker://{source}", f"docker://{to}:{tag}"], timeout=3600)
    served = registry.resolve_digest(f"{to}:{tag}")
    if served != source.digest:
        raise PublishError(f"copying {source} to {to} changed its digest to {served}")
    return target


def publish(project: Project, stack: str, *, key: Path, image: str | None = None, to: str | None = None,
            run_id: str | None = None, records_dir: Path | None = None,
            echo: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Push the signed bundle as referrers of the image; writes build/<stack>/publish.json.

    The image is IMAGE, or the one build/<stack>/image.json records. Its lock and step records come
    from this checkout, or from RECORDS_DIR, a directory `pull` wrote for the same digest (a cluster
    adding its run's results to an image it did not build)."""
    started = time.monotonic()
    records = Records.pulled(records_dir, stack) if records_dir else Records.of_project(project, stack)
    source_image = ImageRef.parse(image or records.read("image.json").get("reference"))
    check_smoke(records, source_image)
    signer = signing.load_signer(key)  # a bad key fails before anything is pushed
    target = copy_image(source_image, to) if to else source_image
    lock_doc = project.read_json(records.lock, f"run `nox -s lock -- --stack {stack}` first")
    created = created_timestamp(lock_doc)
    with tempfile.TemporaryDirectory(prefix="servestack-publish-") as scratch:
        files = bundle_files(project, stack, target, run_id, Path(scratch), records)
    client = _client(target)
    subject, _ = _subject(client, target)
    manifest = publication_manifest(files, subject, created)
    bundle_digest = sha256_digest(manifest)
    envelope = signing.sign_statement(
        provenance(stack, target, bundle_digest, files, Source.of(project.root), run_id, created), signer)
    attestation = attestation_manifest(envelope, subject, bundle_digest, created)
    attestation_digest = sha256_digest(attestation)

    # Blobs, then manifests (the registry checks their blobs exist), then the referrers index:
    # whatever fails halfway, nothing is indexed that points at something missing.
    for blob in (registry.EMPTY_JSON, envelope, *(f.data for f in files)):
        client.push_blob(blob)
    bundle_headers = client.put_manifest(bundle_digest, manifest, OCI_MANIFEST)
    attestation_headers = client.put_manifest(attestation_digest, attestation, OCI_MANIFEST)
    how = client.add_referrer(target.digest, Descriptor(OCI_MANIFEST, bundle_digest, len(manifest), PUBLICATION_TYPE,
                                                       ((CREATED, created),)), bundle_headers)
    client.add_referrer(target.digest, Descriptor(OCI_MANIFEST, attestation_digest, len(attestation), ATTESTATION_TYPE,
                                                 ((BUNDLE_ANNOTATION, bundle_digest), (CREATED, created))),
                        attestation_headers)
    record = {
        "image": str(target),
        "bundle": f"{target.name}@{bundle_digest}",
        "bundle_digest": bundle_digest,
        "attestation": f"{target.name}@{attestation_digest}",
        "referrers": "api" if how == "api" else f"fallback tag {client.fallback_tag(target.digest)}",
        "files": [{"title": f.title, "digest": f.digest, "size": len(f.data)} for f in files],
        "bundle_size": len(manifest) + sum(len(f.data) for f in files),
        "run": run_id,
        "seconds": round(time.monotonic() - started, 2),
    }
    atomic_write_json(project.artifacts(stack) / "publish.json", record)
    if echo:
        echo(f"publish {stack}: {target}\n  bundle      {record['bundle']} ({len(files)} files, "
             f"{record['bundle_size']} bytes)\n  attestation {record['attestation']}\n  referrers   {record['referrers']}"
             f" ({record['seconds']:.1f} s) -> build/{stack}/publish.json")
    return record


# --------------------------------------------------------------------------- pull


@dataclass(frozen=True)
class Publication:
    image: ImageRef
    bundle_digest: str
    attestation_digest: str
    statement: dict[str, Any]
    files: tuple[BundleFile, ...]
    referrers: str  # "api" or "tag"

    def file(self, title: str) -> BundleFile:
        return next(f for f in self.files if f.title == title)

    @property
    def stack(self) -> str:
        return self.statement["predicate"]["buildDefinition"]["externalParameters"]["stack"]

    @property
    def repository(self) -> dict[str, Any]:
        return self.statement["predicate"]["buildDefinition"]["externalParameters"]["repository"]


def fetch_publication(reference: str, key: Path, bundle: str | None = None) -> Publication:
    """Find the image's bundle, verify its signature with KEY and every file against the statement.

    An image can have several publications (the build's, then each cluster run's results); they
    share the lock's timestamp, so without BUNDLE (a digest) the one signing the most files is taken."""
    image = ImageRef.parse(reference)
    public_key = signing.load_public_key(key)
    client = _client(image)
    _subject(client, image)
    referrers, where = client.referrers(image.digest)
    found_in = ("the referrers API" if where == "api"
                else f"the referrers API or the fallback tag {client.fallback_tag(image.digest)}")
    attestations = [r for r in referrers if r.artifact_type == ATTESTATION_TYPE]
    bundles = {r.digest for r in referrers if r.artifact_type == PUBLICATION_TYPE}
    if not attestations:
        raise PublishError(f"{image}: no signed publication ({len(bundles)} bundle(s), no attestation in {found_in})")
    problems, verified = [], []
    for descriptor in attestations:
        what = f"attestation {descriptor.digest}"
        try:
            manifest = _referrer_manifest(client, descriptor.digest, image, what)
            envelope = client.get_blob(manifest["layers"][0]["digest"])
            statement = signing.verify_envelope(envelope, public_key, what)
            verified.append((descriptor, manifest, statement))
        except (ServestackError, KeyError, IndexError) as exc:
            problems.append(str(exc))
    if not verified:
        raise PublishError(f"{image}: no publication signed by {key}:\n  " + "\n  ".join(problems))
    if bundle:
        verified = [v for v in verified if v[1].get("annotations", {}).get(BUNDLE_ANNOTATION) == bundle]
        if not verified:
            raise PublishError(f"{image}: no attestation signed by {key} names bundle {bundle}")
    verified.sort(key=lambda v: (-len(v[2].get("subject", [])), v[0].digest))
    descriptor, manifest, statement = verified[0]
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement.get("subject", [])}
    if subjects.get(str(image)) != image.hex:
        signed_for = [n for n in subjects if "@sha256:" in n]
        raise PublishError(f"attestation {descriptor.digest}: signed for {', '.join(signed_for) or 'another image'}, "
                           f"not {image}")
    bundle_digest = manifest.get("annotations", {}).get(BUNDLE_ANNOTATION, "")
    if subjects.get("publication") != bundle_digest.split(":")[-1]:
        raise PublishError(f"attestation {descriptor.digest}: names bundle {bundle_digest}, which its statement "
                           f"does not sign")
    bundle_bytes = client.get_manifest(bundle_digest) if bundle_digest else None
    if bundle_bytes is None:
        raise PublishError(f"{image}: the signed bundle {bundle_digest} is missing from {client.registry}")
    bundle = json.loads(bundle_bytes[0])
    if (bundle.get("subject") or {}).get("digest") != image.digest:
        raise PublishError(f"bundle {bundle_digest}: its subject is {(bundle.get('subject') or {}).get('digest')}, "
                           f"not {image.digest}")
    files = []
    for layer in bundle.get("layers", []):
        title = (layer.get("annotations") or {}).get(TITLE, "")
        problem = _title_problem(title)
        if problem:
            raise PublishError(f"bundle {bundle_digest}: {problem}")
        if subjects.get(title) != layer["digest"].split(":")[-1]:
            raise PublishError(f"bundle {bundle_digest}: {title} has digest {layer['digest']}, the signed statement "
                               f"says sha256:{subjects.get(title, '(not signed)')}")
        try:
            data = client.get_blob(layer["digest"])
        except registry.RegistryError as exc:
            raise PublishError(f"bundle file {title}: {exc}") from None
        files.append(BundleFile(title, data))
    signed_files = set(subjects) - {str(image), "publication"}
    if signed_files != {f.title for f in files}:
        missing = sorted(signed_files - {f.title for f in files})
        raise PublishError(f"bundle {bundle_digest}: signed files missing from it: {', '.join(missing)}")
    return Publication(image, bundle_digest, descriptor.digest, statement, tuple(files), where)


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
    client = _client(image)
    _, manifest_bytes = _subject(client, image)
    manifest = json.loads(manifest_bytes)
    if manifest.get("mediaType") == OCI_INDEX or "manifests" in manifest:
        raise PublishError(f"{image} is a multi-platform index; publish and pull a platform's manifest digest")
    config = json.loads(client.get_blob(manifest["config"]["digest"]))
    labels = (config.get("config") or {}).get("Labels") or {}
    label = labels.get("io.servestack.lock.sha256")
    if label != lock_sha256:
        raise PublishError(f"{image}: label io.servestack.lock.sha256 is {label}, the bundle's lock is {lock_sha256}")
    top = manifest["layers"][-1]
    stack_json = _file_in_layer(client.get_blob(top["digest"]), top["mediaType"], STACK_JSON)
    if stack_json is None:
        raise PublishError(f"{image}: its top layer has no /{STACK_JSON}")
    own = json.loads(stack_json)
    if own.get("lock_sha256") != lock_sha256 or own.get("lock") != json.loads(lock.data):
        raise PublishError(f"{image}: /{STACK_JSON} records lock {own.get('lock_sha256')}, the bundle's lock is "
                           f"{lock_sha256}")
    return [f"label io.servestack.lock.sha256 = {lock_sha256[:16]}", f"/{STACK_JSON} records the same lock"]


def _file_in_layer(blob: bytes, media_type: str, path: str) -> bytes | None:
    if media_type.endswith(("+zstd", ".zstd")):
        import zstandard

        blob = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read()
    elif media_type.endswith("gzip") or blob[:2] == b"\x1f\x8b":
        blob = zlib.decompress(blob, 16 + zlib.MAX_WBITS)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in tar:
            if member.name.lstrip("./") == path and member.isfile():
                extracted = tar.extractfile(member)
                return extracted.read() if extracted else None
    return None


def _default_out(image: ImageRef) -> Path:
    return Path.cwd() / f"servestack-{image.hex[:12]}"


def pull(reference: str, *, key: Path, out: Path | None = None, bundle: str | None = None,
         echo: Callable[[str], None] | None = print) -> Path:
    """Verify the image's publication and write its recipes, lock and results to OUT (untouched on any error)."""
    started = time.monotonic()
    image = ImageRef.parse(reference)
    out = (out or _default_out(image)).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(out, "--out", "exists and is not an empty directory; pull writes a fresh one")
    publication = fetch_publication(reference, key, bundle)
    checked = check_image_agrees(publication)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None))
    try:
        for f in publication.files:
            target = staging / f.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.data)
        (staging / "publication.json").write_text(canonical_json({
            "image": str(image), "bundle": publication.bundle_digest, "attestation": publication.attestation_digest,
            "key_sha256": sha256_file(key), "statement": publication.statement,
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
             + "".join(f"  image       {line}\n" for line in checked)
             + f"  source      commit {publication.repository.get('commit')}"
             f"{' (dirty tree)' if publication.repository.get('dirty') else ''}\n"
             f"  wrote       {out}: {len(recipes)} recipes bound to the digest (srtctl apply -f), lock, records "
             f"({time.monotonic() - started:.1f} s)")
    return out


# --------------------------------------------------------------------------- verify --rebuild


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
    previous = os.environ.get("SERVESTACK_CACHE")
    os.environ["SERVESTACK_CACHE"] = str(cache)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SERVESTACK_CACHE", None)
        else:
            os.environ["SERVESTACK_CACHE"] = previous


def verify_rebuild(project: Project, reference: str, *, key: Path,
                   echo: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Rebuild the image from the bundle's lock at the bundle's commit in a scratch worktree; same digest?"""
    from . import build, services
    from . import image as image_step

    started = time.monotonic()
    publication = fetch_publication(reference, key)
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
        rebuilt_project = Project(worktree)
        # The bundle's lock and stack file are what is verified, even when published from a dirty tree.
        for title in (f"pins/{stack}.lock", f"pins/{stack}.yaml"):
            (worktree / title).write_bytes(publication.file(title).data)
        if echo:
            echo(f"verify {reference}: rebuilding {stack} from its lock at commit {commit[:12]} in {worktree}")
        with _derived_caches_fresh(scratch / "cache"):
            build.build(rebuilt_project, stack)
            result = image_step.build_image(rebuilt_project, stack, rebuild=True,
                                            registry_address=services.ensure_registry(VERIFY_REGISTRY))
    finally:
        proc.run(["git", "-C", str(project.root), "worktree", "remove", "--force", str(worktree)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    rebuilt = ImageRef.parse(result["reference"])
    record = {"image": str(publication.image), "rebuilt": str(rebuilt), "same": rebuilt.digest == publication.image.digest,
              "commit": commit, "seconds": round(time.monotonic() - started, 1)}
    if echo:
        echo(f"verify {publication.image.digest}: rebuilt {rebuilt.digest} in {record['seconds']:.0f} s: "
             + ("SAME digest" if record["same"] else "DIFFERENT digest"))
    return record

