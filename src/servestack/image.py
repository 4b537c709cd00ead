"""`servestack image`: plan the layers from containers/image.yaml, write the ones not cached, push what
the registry lacks, and check the digest against the one committed beside the lock.

Planning (`plan`) returns data and needs no daemon. Writing a layer is tar + zstd + sha256 in this
process (layers.py); the config and manifest are assembled here (oci.py) and pushed through the
registry HTTP API, blob by blob, skipping blobs the registry already holds. No docker daemon is
involved. The same lock and the same code give the same manifest digest on any machine:
`pins/<stack>.image.json` records the digest expected for the committed lock.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import build as build_step
from . import layers, oci, prune, services
from .errors import ServestackError
from .fsutil import canonical_json, sha256_bytes, sha256_file
from .lock import load_lock
from .progress import Progress, phase
from .project import Project, cache_home
from .records.lockfile import DebianBase, ImageBase, Lock
from .records.steps import (BuildRecord, ExpectedCheck, ExpectedImage, ImageLayer, ImageRecord, read_expected, read_image,
                            write_image)
from .records.steps import write_expected as write_expected_record
from .sources import registry
from .trees import VENV, Tree, children_cpu_seconds, compiler, install_all, site_packages
from .wheels import normalize

if TYPE_CHECKING:
    from .imageplan import ImagePlan  # pydantic: a build the registry already holds never reads the plan

log = logging.getLogger("servestack.image")

ARCH = {"linux/amd64": "amd64", "linux/arm64": "arm64"}


@dataclass(frozen=True)
class Layer:
    name: str
    entries: tuple[layers.Entry, ...]

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)


# --------------------------------------------------------------------------- planning


def _chunks(name: str, entries: list[layers.Entry], limit: int) -> list[Layer]:
    """`entries` as one layer, or split by path into layers of at most `limit` bytes."""
    out: list[list[layers.Entry]] = [[]]
    size = 0
    for e in sorted(entries, key=lambda e: e.path):
        if out[-1] and size + e.size > limit:
            out.append([])
            size = 0
        out[-1].append(e)
        size += e.size
    if len(out) == 1:
        return [Layer(name, tuple(out[0]))]
    return [Layer(f"{name}-{i}", tuple(chunk)) for i, chunk in enumerate(out) if chunk]


def _generated(work: Path, relpath: str, data: bytes, image_path: str) -> layers.Entry:
    path = work / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
    os.chmod(path, 0o644)
    return layers.entry_for(path, image_path)


def _venv_entries(work: Path, python: str) -> list[layers.Entry]:
    """A venv is a pyvenv.cfg and links to the interpreter; written here, nothing runs in the image."""
    cfg = f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python}\nexecutable = /usr/bin/python{python}\n"
    entries = [_generated(work, "venv/pyvenv.cfg", cfg.encode(), f"{VENV}/pyvenv.cfg")]
    entries += [layers.Entry(f"{VENV}/bin/{name}", "symlink", 0o777, link=f"/usr/bin/python{python}")
                for name in ("python", "python3", f"python{python}")]
    return entries


def own_layers(name: str, entries: list[layers.Entry], spec: ImagePlan) -> list[Layer] | None:
    """A package's own layer(s) when it installs more than `own_layer_above` bytes; None when it shares one."""
    if sum(e.size for e in entries) > (spec.source("packages").own_layer_above or 0):
        return _chunks(f"pkg-{name}", entries, spec.max_layer_bytes)
    return None


def plan(record: BuildRecord, lock: Lock, trees: dict[str, Tree], spec: ImagePlan, work: Path) -> list[Layer]:
    """The layers above the base, from the build record, its lock and the installed trees (keyed by wheel sha256).

    Every file lands in exactly one layer. Files an overlay changes or adds go to the top layer and
    leave their package's layer, so a changed PR changes only the top layer.
    """
    python = lock.python
    site = site_packages(python)
    overlay_by_base = {o.base.sha256: o for o in record.overlays}
    overlay_files: dict[str, str] = {}
    top: list[layers.Entry] = []
    packages: list[tuple[str, list[layers.Entry]]] = []
    seen: set[str] = set()
    for item in sorted(record.inputs, key=lambda i: normalize(i.name)):
        entries = list(trees[item.sha256].entries)
        applied = overlay_by_base.get(item.sha256)
        if applied:
            old = {e.path: e.sha256 for e in entries}
            changed = [e for e in trees[applied.wheel.sha256].entries
                       if ".dist-info/" in e.path or old.get(e.path) != e.sha256]
            top += changed
            overlay_files.update({e.path: e.sha256 for e in changed})
            kept = {e.path for e in trees[applied.wheel.sha256].entries} - overlay_files.keys()
            entries = [e for e in entries if e.path in kept]
        unique = [e for e in entries if e.path not in seen]
        if len(unique) != len(entries):
            log.warning("%s: %d files already installed by another package are kept from the first",
                        item.name, len(entries) - len(unique))
        seen.update(e.path for e in unique)
        packages.append((normalize(item.name), unique))

    shared: list[list[layers.Entry]] = [[] for _ in range(spec.source("packages").shared_layers or 1)]
    own: list[Layer] = []
    for name, entries in packages:
        mine = own_layers(name, entries, spec)
        if mine is not None:
            own += mine
        else:
            shared[int(sha256_bytes(name.encode())[:8], 16) % len(shared)] += entries
    package_layers = [layer for i, bucket in enumerate(shared) if bucket
                      for layer in _chunks(f"shared-{i}", bucket, spec.max_layer_bytes)] + own

    model: list[Layer] = []
    if record.model:
        model_dir, name = Path(record.model.path), record.model.name
        model = _chunks("model", [layers.entry_for(p, f"opt/servestack/models/{name}/{p.name}")
                                  for p in sorted(model_dir.iterdir()) if p.is_file()], spec.max_layer_bytes)
    top += link_entries(lock, seen)
    stack_json = canonical_json({
        "lock_sha256": record.lock_sha256,
        "lock": lock.to_json(),
        "overlays": {o.package: {"version": o.wheel.version, "prs": [p["name"] for p in o.prs],
                                    "files": {t[len(site) + 1:] if t.startswith(site) else t: h
                                              for t, h in sorted(overlay_files.items())}}
                     for o in record.overlays},
    })
    top.append(_generated(work, "stack.json", stack_json.encode(), "opt/servestack/stack.json"))
    by_source = {"venv": [Layer("venv", tuple(_venv_entries(work, python)))], "packages": package_layers,
                 "model": model, "top": [Layer("top", tuple(sorted(top, key=lambda e: e.path)))]}
    return [layer for source in spec.layers if source.source != "base" for layer in by_source[source.source]]


def link_entries(lock: Lock, installed: set[str]) -> list[layers.Entry]:
    """The stack's links, each to the one installed file its target glob matches under site-packages."""
    site = site_packages(lock.python)
    entries = []
    for path, link in sorted(lock.links.items()):
        pattern = f"{site}/{link['target']}"
        matches = sorted(p for p in installed if fnmatch.fnmatchcase(p, pattern))
        if len(matches) != 1:
            raise ServestackError(
                f"{lock.file}: links.{path}.target {link['target']!r} matches {len(matches)} installed files "
                f"({', '.join(matches[:5]) or 'none'}); expected exactly one under {site}")
        entries.append(layers.Entry(path.lstrip("/"), "symlink", 0o777, link="/" + matches[0]))
    return entries


# --------------------------------------------------------------------------- the base


def debian_base(lock_base: DebianBase, platform: str) -> Path:
    """The Debian base's root file system, assembled from the lock's packages (servestack.base)."""
    from .base.tarball import tarball

    return tarball(lock_base, platform)


def interpreter_version(lock: Lock, platform: str) -> str | None:
    """The exact version (X.Y.Z) of the image's interpreter, the Debian base's python<X.Y>-minimal as the
    lock pins it. The bytecode is compiled by the host's interpreter of this version (trees.compiler).
    None for a base image: not known without reading its layers."""
    if not isinstance(lock.base, DebianBase):
        return None
    from .base.tarball import interpreter_version as debian_interpreter

    return debian_interpreter(lock.base, platform, lock.python)


@dataclass(frozen=True)
class Base:
    layers: list[oci.LayerRef]
    paths: dict[str, Path]  # blob digest -> local file, for blobs that are pushed from here
    config: dict[str, Any] | None  # a base image's config (its environment is inherited)
    source: tuple[str, str] | None = None  # (registry, repository) of a base image


def _image_base(base: ImageBase, platform: str, address: str) -> Base:
    """A base image by digest: its layers become the image's first layers, unchanged."""
    ref = registry.Reference.parse(base.reference)
    found = registry.get_manifest(ref.registry, ref.repository, base.digest)
    if found is None:
        raise ServestackError(f"base image {base.reference}@{base.digest}: not in its registry")
    manifest = json.loads(found[0])
    if "manifests" in manifest:  # an index: take this platform's manifest
        arch = oci.PLATFORMS[platform][0]
        digest = next((m["digest"] for m in manifest["manifests"] if (m.get("platform") or {}).get("architecture") == arch), None)
        if digest is None:
            raise ServestackError(f"base image {base.reference}: no manifest for {platform}")
        manifest = json.loads(registry.get_manifest(ref.registry, ref.repository, digest)[0])
    config = json.loads(registry.get_blob(ref.registry, ref.repository, manifest["config"]["digest"]))
    refs = [oci.LayerRef("base", layer["digest"], diff_id, layer["size"], layer["mediaType"])
            for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"])]
    return Base(refs, {}, config, (ref.registry, ref.repository))


def _base(lock: Lock, platform: str, address: str, progress: Progress) -> Base:
    if isinstance(lock.base, ImageBase):
        return _image_base(lock.base, platform, address)
    tarball = debian_base(lock.base, platform)
    key = _base_key(tarball)
    if layers.cached(key) is None:  # as a rule EarlyLayers compressed it already; if not, its bytes count here
        progress.expect(tarball.stat().st_size)
    blob = layers.compress_tarball(tarball, lambda n: progress.add("tarred", n), lambda n: progress.add("compressed", n), key)
    return Base([oci.LayerRef("base", blob.digest, blob.diff_id, blob.size)], {blob.digest: blob.path}, None)


@functools.lru_cache(maxsize=None)
def _base_key(tarball: Path) -> str:
    """The Debian base tarball's layer key, found once per process: finding it reads all its 225 MB, and
    EarlyLayers and `_base` both need it in every build. A base tarball never changes under its name
    (named by its archive state, renamed into place whole)."""
    return layers.tarball_key(tarball)


def _send_base_blob(base: Base, address: str, repository: str, digest: str) -> None:
    """A base image's blob: mounted when it is in the same registry, else copied through the cache."""
    assert base.source
    source_registry, source_repository = base.source
    if source_registry == address and registry.mount_blob(address, repository, digest, source_repository):
        return
    path = cache_home() / "base-blobs" / digest.replace(":", "-")
    if not path.exists():
        registry.download_blob(source_registry, source_repository, digest, path)
    registry.push_blob(address, repository, digest, path)


# --------------------------------------------------------------------------- build and push


class PushStopped(ServestackError):
    """A push given up because the build is stopping (an interrupt, a failure, or a blob no longer used)."""


class Uploads:
    """Blobs pushed as soon as they are written, two at a time, each digest once, only those the
    registry lacks: the layers written while trees are still being made go up meanwhile, so the
    push is not all left for after the last tree. `wait` waits for the manifest's blobs; leaving the
    context stops every push still under way (at its next chunk) instead of waiting for it, so an
    interrupted build does not first push a multi-GB blob, and a layer the plan then dropped is not
    pushed to the end."""

    def __init__(self, address: str, repository: str):
        self.address, self.repository = address, repository
        self.on_bytes: Callable[[int], None] | None = None  # progress, once the layer step shows it
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="push")
        self._jobs: dict[str, Future[None]] = {}
        self._pushed: dict[str, int] = {}  # digest -> size, of the blobs the registry lacked
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, kind, *exc) -> None:
        self._stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def send(self, digest: str, path: Path | None, size: int, base: Base | None = None) -> None:
        with self._lock:
            if digest not in self._jobs:
                self._jobs[digest] = self._pool.submit(self._push, digest, path, size, base)

    def wait(self, digests: list[str]) -> list[int]:
        """The pushes of `digests` (the manifest's blobs, each sent before) have finished; the first
        failure is raised. Returns the sizes of those the registry lacked. A blob sent but not in
        `digests` (an early layer the plan changed) is not waited for; its failure is only logged."""
        with self._lock:
            jobs = dict(self._jobs)
        for digest in dict.fromkeys(digests):
            jobs[digest].result()
        for digest, job in jobs.items():
            if digest not in digests and job.done() and not job.cancelled() and job.exception() is not None:
                log.warning("push of %s failed; the manifest does not use it: %s", digest, job.exception())
        return [self._pushed[digest] for digest in dict.fromkeys(digests) if digest in self._pushed]

    def _push(self, digest: str, path: Path | None, size: int, base: Base | None) -> None:
        if self._stopping.is_set() or registry.blob_exists(self.address, self.repository, digest):
            return
        if path is None and base is not None:
            _send_base_blob(base, self.address, self.repository, digest)
        else:
            registry.push_blob(self.address, self.repository, digest, path, self._count)
        self._pushed[digest] = size

    def _count(self, n: int) -> None:
        """Called for each chunk read for the push: where a stopping build gives the push up."""
        if self._stopping.is_set():
            raise PushStopped("image: push given up, the build is stopping")
        if self.on_bytes:
            self.on_bytes(n)


class EarlyLayers:
    """Layers written while the other trees are still being made, so tar and zstd overlap the installs.

    The installs and bytecode leave a core idle whenever fewer trees than cores are left (torch's
    bytecode alone is the longest job), and the layers could not start before the last tree. Here a
    package that will have its own layer is written as soon as its tree is ready, as `plan` makes
    it when no earlier package installed one of its files; the Debian base is compressed first.
    This is speculation that costs time, never correctness: every layer is found by its key, so if
    `plan` drops a file from it the key differs and that layer is written again after planning.
    Each layer written (or found cached) here is handed to `uploads` at once, when there is one.
    """

    def __init__(self, record: BuildRecord, spec: ImagePlan, epoch: int, base: Path | None, uploads: Uploads | None = None):
        self.spec, self.epoch, self.base, self.uploads = spec, epoch, base, uploads
        self.names = {i.sha256: normalize(i.name) for i in record.inputs}
        self.names = {sha: n for sha, n in self.names.items()
                      if sha not in {o.base.sha256 for o in record.overlays}}  # overlaid: split by plan
        self.written: dict[str, int] = {}  # layer key -> bytes tarred, for layers this build wrote
        self._queue: queue.Queue[list[Layer] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="early-layers", daemon=True)
        self._thread.start()

    def offer(self, sha256: str, tree: Tree) -> None:
        """A tree is ready: queue its package's own layer(s), if it will have any."""
        if sha256 in self.names:
            mine = own_layers(self.names[sha256], list(tree.entries), self.spec)
            if mine:
                self._queue.put(mine)

    def _write(self, entries: tuple[layers.Entry, ...]) -> None:
        members = layers.with_parents(entries)
        key = layers.layer_key(members, self.epoch)
        blob = layers.cached(key)
        if blob is None:
            blob = layers.write_layer(members, self.epoch, key)
            self.written[key] = blob.uncompressed
        self._upload(blob)

    def _upload(self, blob: layers.Blob) -> None:
        if self.uploads is not None:
            self.uploads.send(blob.digest, blob.path, blob.size)

    def _run(self) -> None:
        try:
            if self.base is not None:
                self._upload(layers.compress_tarball(self.base, key=_base_key(self.base)))
            while (batch := self._queue.get()) is not None:
                for layer in batch:
                    self._write(layer.entries)
        except Exception:  # noqa: BLE001 - speculation only: the layer is written again after planning
            log.warning("writing layers early failed; they are written after planning", exc_info=True)
            while self._queue.get() is not None:
                pass

    def finish(self) -> dict[str, int]:
        self._queue.put(None)
        self._thread.join()
        return self.written



def _labels(record: BuildRecord, lock: Lock) -> dict[str, str]:
    # Facts about the content only: no input hash (it covers servestack's own code), so a change to a
    # comment in image.py does not change the digest; the registry cache tag carries the input hash.
    prs = [f"{p.label}:{p.status}" for p in lock.pull_requests]
    return {
        "org.opencontainers.image.title": f"servestack/{record.stack}",
        "org.opencontainers.image.description": f"servestack stack {record.stack} built from its lock",
        "org.opencontainers.image.created": oci.created(record.source_date_epoch),
        "org.opencontainers.image.licenses": "Apache-2.0",
        "io.servestack.stack": record.stack,
        "io.servestack.lock.sha256": record.lock_sha256,
        "io.servestack.prs": ",".join(prs),
    }


def image_input_hash(record: BuildRecord, compiled_by: str) -> str:
    """What names the image: the build's inputs and code (build.json's input_hash) and the exact version of
    the interpreter that compiles its bytecode (trees.compiler; "none": no pycs), which the build step
    cannot know: another patch release writes other pycs, so the registry must not hand its image back."""
    return sha256_bytes(canonical_json({"build": record.input_hash, "compiled_by": compiled_by}).encode())


def image_record(reference: str, platform: str, manifest: dict[str, Any], names: list[str], record: BuildRecord,
                 compiled_by: str, **extra: Any) -> ImageRecord:
    layer_list = tuple(ImageLayer(layer["digest"], layer["size"], name) for layer, name in zip(manifest["layers"], names))
    return ImageRecord(
        reference=reference, stack=record.stack, platforms=(platform,), lock_sha256=record.lock_sha256,
        input_hash=image_input_hash(record, compiled_by), compiled_by=compiled_by, total_size=sum(layer.size for layer in layer_list) + manifest["config"]["size"],
        layers=layer_list, layer_names=tuple(names), **extra,
    )


def _write_layers(stack: str, planned: list[Layer], epoch: int, lock: Lock, platform: str, address: str,
                  uploads: Uploads, early: dict[str, int]) -> tuple[Base, list[oci.LayerRef], dict[str, Any]]:
    """Write every layer whose key is new, pushing each blob the registry lacks as soon as it is ready.
    `early`: the layers this build already wrote while making trees (key -> bytes tarred); `uploads`
    may already be pushing them."""
    members = [layers.with_parents(layer.entries) for layer in planned]  # once: keyed, sized and written
    keys = [layers.layer_key(m, epoch) for m in members]
    todo = [m for m, key in zip(members, keys) if layers.cached(key) is None]
    early = {key: early[key] for key in keys if key in early}
    stats = {"layers_built": len(todo) + len(early), "bytes_tarred": 0, "layers_pushed": 0, "bytes_pushed": 0}
    title = f"image {stack}"
    # The tar streams' bytes (headers and padding too), not the files': "tarred" counts the streams.
    progress = Progress(title, ("tarred", "compressed", "pushed"), total=sum(layers.tar_size(m) for m in todo),
                        paced_by="tarred")
    with progress:
        uploads.on_bytes = lambda n: progress.add("pushed", n)
        progress.set_step("base")
        base = _base(lock, platform, address, progress)
        for ref in base.layers:
            uploads.send(ref.digest, base.paths.get(ref.digest), ref.size, base)
        refs: list[oci.LayerRef] = []
        for index, (layer, layer_members, key) in enumerate(zip(planned, members, keys), 1):
            progress.set_step(f"layer {index} of {len(planned)}: {layer.name}")
            blob = layers.write_layer(layer_members, epoch, key,
                                      lambda n: progress.add("tarred", n), lambda n: progress.add("compressed", n))
            refs.append(oci.LayerRef(layer.name, blob.digest, blob.diff_id, blob.size))
            uploads.send(blob.digest, blob.path, blob.size)
        progress.set_step("pushing")
        pushed = uploads.wait([ref.digest for ref in base.layers] + [ref.digest for ref in refs])
        uploads.on_bytes = None
    stats.update(bytes_tarred=progress.counters["tarred"] + sum(early.values()), layers_pushed=len(pushed),
                 bytes_pushed=sum(pushed))
    return base, refs, stats


def build_image(project: Project, stack: str, registry_address: str | None = None, *, rebuild: bool = False) -> ImageRecord:
    """Build and push the stack's image; skipped when the registry holds this input hash, unless REBUILD
    (verify --rebuild must really build to compare digests)."""
    started = time.monotonic()
    out = project.artifacts(stack)
    image_json = out / "image.json"
    image_json.unlink(missing_ok=True)
    record = build_step.load_build(project, stack)
    lock = load_lock(project, stack)
    if record.lock_sha256 != sha256_file(project.lock_file(stack)):
        raise ServestackError(f"build/{stack}/build.json was made from another lock; run `nox -s build` again")
    address = registry_address or services.ensure_registry()
    repository = f"servestack/{stack}"
    platform = record.platform
    compiled_by = compiler(lock.python, interpreter_version(lock, platform)).version
    cache_tag = f"in-{image_input_hash(record, compiled_by)[:32]}"
    title = f"image {stack}"

    existing = None if rebuild else registry.get_manifest(address, repository, cache_tag)
    if existing is not None:
        digest = "sha256:" + hashlib.sha256(existing[0]).hexdigest()
        held = json.loads(existing[0])
        names = [h.get("created_by", "").removeprefix("servestack layer ") for h in
                 json.loads(registry.get_blob(address, repository, held["config"]["digest"])).get("history", [])]
        result = image_record(f"{address}/{repository}@{digest}", platform, held, names, record, compiled_by, skipped=True,
                              bytes_pushed=0, layers_pushed=0, layers_built=0, seconds=round(time.monotonic() - started, 2),
                              expected=check_expected(project, stack, digest, record.lock_sha256))
        write_image(image_json, result)
        print(f"{title}: the registry already holds this build ({cache_tag}); nothing built or pushed: {result.reference}")
        return result

    from .imageplan import load_plan

    spec = load_plan(project.containers / "image.yaml")
    with Uploads(address, repository) as uploads:
        return _build_and_push(project, stack, record, lock, spec, address, repository, cache_tag, compiled_by, uploads,
                               started)


def _build_and_push(project: Project, stack: str, record: BuildRecord, lock: Lock, spec: ImagePlan, address: str,
                    repository: str, cache_tag: str, compiled_by: str, uploads: Uploads, started: float) -> ImageRecord:
    """The trees, the layers (the large packages' written and pushed while the other trees are made), the
    config and manifest."""
    title, platform, python, epoch = f"image {stack}", record.platform, lock.python, record.source_date_epoch
    wheels = {item.sha256: Path(item.path) for item in record.inputs}
    wheels.update({o.wheel.sha256: Path(o.path) for o in record.overlays})
    out = project.artifacts(stack)
    early = EarlyLayers(record, spec, epoch, debian_base(lock.base, platform) if isinstance(lock.base, DebianBase) else None,
                        uploads)
    children, trees_started = children_cpu_seconds(), time.monotonic()
    try:
        with phase(title, f"{len(wheels)} wheels installed into per-wheel trees, bytecode compiled module by module on all cores; "
                          "the large packages' layers written and pushed as their trees are ready"):
            made = install_all(list((path, sha) for sha, path in wheels.items()), python,
                               interpreter_version(lock, platform), on_tree=early.offer)
    finally:
        written_early = early.finish()
    bytecode_cpu, trees_seconds = children_cpu_seconds() - children, time.monotonic() - trees_started
    trees = dict(zip(wheels, made))
    work = out / "generated"
    planned = plan(record, lock, trees, spec, work)
    too_big = [layer.name for layer in planned if layer.size > spec.max_layer_bytes]
    if too_big:
        raise ServestackError(f"layers over {spec.max_layer_bytes} bytes: {too_big}")
    print(f"{title}: {len(planned) + 1} layers ({sum(layer.size for layer in planned) / 1e9:.2f} GB above the base) "
          f"for {platform}", flush=True)
    base, refs, stats = _write_layers(stack, planned, epoch, lock, platform, address, uploads, written_early)
    all_refs = base.layers + refs
    environment = {**spec.environment, **lock.environment}
    config_doc = oci.config(platform, all_refs, environment, _labels(record, lock), epoch, base.config)
    if not registry.blob_exists(address, repository, config_doc.digest):
        registry.push_bytes(address, repository, config_doc.digest, config_doc.data)
    manifest_doc = oci.manifest(config_doc, all_refs)
    served = registry.put_manifest(address, repository, cache_tag, manifest_doc.data, manifest_doc.media_type)
    if served != manifest_doc.digest:
        raise ServestackError(f"registry {address} stored the manifest as {served}, expected {manifest_doc.digest}")
    made_trees = [t for t in made if t.made]
    result = image_record(
        f"{address}/{repository}@{served}", platform, json.loads(manifest_doc.data), [r.name for r in all_refs], record,
        compiled_by, skipped=False, seconds=round(time.monotonic() - started, 2), **stats,
        trees={"made": len(made_trees), "cached": len(made) - len(made_trees), "seconds": round(trees_seconds, 1),
               "install_seconds": round(sum(t.install_seconds for t in made_trees), 1),
               "bytecode_seconds": round(sum(t.bytecode_seconds for t in made_trees), 1),
               "install_cpu_seconds": round(sum(t.install_cpu_seconds for t in made_trees), 1),
               "bytecode_cpu_seconds": round(bytecode_cpu, 1),
               "bytecode_bytes": sum(e.size for t in made for e in t.entries if e.path.endswith(".pyc"))},
        expected=check_expected(project, stack, served, record.lock_sha256),
    )
    write_image(out / "image.json", result)
    _prune_caches(title, stack, [t.path for t in made], [r.digest for r in all_refs])
    print(f"{title}: {result.reference} ({result.total_size / 1e9:.2f} GB in {len(all_refs)} layers; "
          f"{stats['layers_built']} written, {stats['layers_pushed']} pushed, {stats['bytes_pushed'] / 1e6:.1f} MB; "
          f"{result.seconds:.1f} s)", flush=True)
    return result


def _prune_caches(title: str, stack: str, trees: list[Path], digests: list[str]) -> None:
    """Keep the layer and tree caches bounded (prune.py); a failure to prune never fails the build."""
    try:
        prune.record_use(stack, trees, digests)
        pruned = prune.prune()
    except OSError as exc:
        log.warning("%s: the caches were not pruned: %s", title, exc)
        return
    if pruned.removed:
        print(f"{title}: cache pruned: {pruned.removed} layer blobs, keys and trees no recent build used, "
              "and sha256 records of changed or removed files "
              f"({pruned.freed_bytes / 1e9:.2f} GB freed)", flush=True)


def load_image(project: Project, stack: str) -> ImageRecord:
    path = project.artifacts(stack) / "image.json"
    return read_image(path, f"run `nox -s image -- --stack {stack}` first", path.relative_to(project.root))


# --------------------------------------------------------------------------- the expected digest


def expected_file(project: Project, stack: str) -> Path:
    return project.pins / f"{stack}.image.json"


UPDATE_COMMAND = "nox -s build -- --stack {stack} && nox -s image -- --stack {stack} --update-expected"


def check_expected(project: Project, stack: str, digest: str, lock_sha256: str) -> ExpectedCheck:
    """Whether this build reproduced the digest committed beside the lock.

    `reproduced`; `different` (same lock, another digest: this machine or this code makes other
    bytes); `stale` (the committed digest is for another lock); `none` (nothing committed).
    """
    path = expected_file(project, stack)
    shown = path.relative_to(project.root).as_posix()
    if not path.exists():
        return ExpectedCheck(shown, "none", None)
    committed = read_expected(path, f"run `{UPDATE_COMMAND.format(stack=stack)}`", shown)
    if committed.lock_sha256 != lock_sha256:
        status = "stale"
    else:
        status = "reproduced" if committed.digest == digest else "different"
    return ExpectedCheck(shown, status, committed.digest)


def write_expected(project: Project, stack: str, result: ImageRecord, image_version: str | None) -> Path:
    """Commit-ready pins/<stack>.image.json; refused when the bytecode was not compiled by the image's exact
    interpreter version (`image_version`, interpreter_version; None: not known), as then no machine that has
    that version makes this digest."""
    path = expected_file(project, stack)
    if image_version is not None and result.compiled_by != image_version:
        raise ServestackError(
            f"{path.relative_to(project.root)} not written: the image's interpreter is Python {image_version}, but this "
            f"build's bytecode was compiled by Python {result.compiled_by} (build/{stack}/image.json: compiled_by), so "
            f"others would not reproduce {result.digest}; put a python{image_version.rsplit('.', 1)[0]} of version "
            f"{image_version} on PATH (Debian's, e.g. /usr/bin) and build again")
    write_expected_record(path, ExpectedImage(stack, result.lock_sha256, result.platform, result.digest,
                                              UPDATE_COMMAND.format(stack=stack)))
    return path
