"""The build: from build/<stack>/build.json to a manifest in the registry, skipped when the registry
already holds this input hash."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servestack import inputs, services
from servestack.errors import ServestackError
from servestack.image import layers, oci, prebuilt, prune
from servestack.image.base_image import Base, base_layers, debian_base, interpreter_version
from servestack.image.expected import check_expected
from servestack.image.layer_plan import Layer, plan
from servestack.image.trees import children_cpu_seconds, compiler, install_all
from servestack.image.uploads import EarlyLayers, Uploads
from servestack.lock import load_lock
from servestack.records.lockfile import DebianBase, Lock
from servestack.records.steps import BuildRecord, ImageLayer, ImageRecord, read_image, write_image
from servestack.sources import registry
from servestack.util.console import console
from servestack.util.fsutil import canonical_json, sha256_bytes, sha256_file
from servestack.util.progress import Progress, phase
from servestack.util.project import Project

if TYPE_CHECKING:
    from servestack.image.spec import ImagePlan


def _labels(record: BuildRecord, lock: Lock) -> dict[str, str]:
    # Facts about the content only: no input hash (it covers servestack's own code), so a change to a
    # comment in image/build.py does not change the digest; the registry cache tag carries the input hash.
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
    layer_list = tuple(ImageLayer(digest=layer["digest"], size=layer["size"], title=name)
                       for layer, name in zip(manifest["layers"], names, strict=True))
    return ImageRecord(
        reference=reference,
        stack=record.stack,
        platforms=(platform,),
        lock_sha256=record.lock_sha256,
        input_hash=image_input_hash(record, compiled_by),
        compiled_by=compiled_by,
        total_size=sum(layer.size for layer in layer_list) + manifest["config"]["size"],
        layers=layer_list,
        layer_names=tuple(names),
        **extra,
    )


def _write_layers(stack: str, planned: list[Layer], epoch: int, lock: Lock, platform: str, address: str,
                  uploads: Uploads, early: dict[str, int]) -> tuple[Base, list[oci.LayerRef], dict[str, Any]]:
    """Write every layer whose key is new, pushing each blob the registry lacks as soon as it is ready.
    `early`: the layers this build already wrote while making trees (key -> bytes tarred); `uploads`
    may already be pushing them."""
    members = [layers.with_parents(layer.entries) for layer in planned]  # once: keyed, sized and written
    keys = [layers.layer_key(m, epoch) for m in members]
    todo = [m for m, key in zip(members, keys, strict=True) if layers.cached(key) is None]
    early = {key: early[key] for key in keys if key in early}
    stats = {"layers_built": len(todo) + len(early), "bytes_tarred": 0, "layers_pushed": 0, "bytes_pushed": 0}
    title = f"image {stack}"
    # The tar streams' bytes (headers and padding too), not the files': "tarred" counts the streams.
    progress = Progress(title, ("tarred", "compressed", "pushed"), total=sum(layers.tar_size(m) for m in todo),
                        paced_by="tarred")
    with progress:
        uploads.on_bytes = lambda n: progress.add("pushed", n)
        progress.set_step("base")
        base = base_layers(lock, platform, address, progress)
        for ref in base.layers:
            uploads.send(ref.digest, base.paths.get(ref.digest), ref.size, base)
        refs: list[oci.LayerRef] = []
        for index, (layer, layer_members, key) in enumerate(zip(planned, members, keys, strict=True), 1):
            progress.set_step(f"layer {index} of {len(planned)}: {layer.name}")
            blob = layers.write_layer(layer_members, epoch, key,
                                      lambda n: progress.add("tarred", n), lambda n: progress.add("compressed", n))
            refs.append(oci.LayerRef(name=layer.name, digest=blob.digest, diff_id=blob.diff_id, size=blob.size))
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
    record = inputs.load_build(project, stack)
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
                              expected=check_expected(project, stack, platform, digest, record.lock_sha256),
                              manifest_size=len(existing[0]))
        write_image(image_json, result)
        console.progress(f"{title}: the registry already holds this build ({cache_tag}); nothing built or pushed: {result.reference}")
        return result

    from servestack.image.spec import load_plan

    spec = load_plan(project.containers / "image.yaml")
    with Uploads(address, repository) as uploads:
        return _build_and_push(project, stack, record, lock, spec, address, repository, cache_tag, compiled_by, uploads,
                               started)


def _push_manifest(address: str, repository: str, tag: str, platform: str, refs: list[oci.LayerRef],
                   environment: dict[str, str], labels: dict[str, str], epoch: int,
                   base_config: dict[str, Any] | None) -> oci.Document:
    """The config and manifest over REFS, pushed under TAG; the manifest as pushed."""
    config_doc = oci.config(platform, refs, environment, labels, epoch, base_config)
    if not registry.blob_exists(address, repository, config_doc.digest):
        registry.push_bytes(address, repository, config_doc.digest, config_doc.data)
    manifest_doc = oci.manifest(config_doc, refs)
    served = registry.put_manifest(address, repository, tag, manifest_doc.data, manifest_doc.media_type)
    if served != manifest_doc.digest:
        raise ServestackError(f"registry {address} stored the manifest as {served}, expected {manifest_doc.digest}")
    return manifest_doc


def _build_and_push(project: Project, stack: str, record: BuildRecord, lock: Lock, spec: ImagePlan, address: str,
                    repository: str, cache_tag: str, compiled_by: str, uploads: Uploads, started: float) -> ImageRecord:
    """The trees, the layers (the large packages' written and pushed while the other trees are made), the
    config and manifest."""
    title, platform, python, epoch = f"image {stack}", record.platform, lock.python, record.source_date_epoch
    prebuilt.preflight(lock, platform)
    wheels = {item.sha256: Path(item.path) for item in record.inputs}
    wheels.update({o.wheel.sha256: Path(o.path) for o in record.overlays})
    out = project.artifacts(stack)
    early = EarlyLayers(record, spec, epoch, debian_base(lock.base, platform) if isinstance(lock.base, DebianBase) else None,
                        uploads)
    children, trees_started = children_cpu_seconds(), time.monotonic()
    try:
        with phase(title, f"{len(wheels)} wheels installed into per-wheel trees, bytecode compiled module by module on all cores; "
                          "the large packages' layers written and pushed as their trees are ready"):
            trees_made = install_all(list((path, sha) for sha, path in wheels.items()), python,
                                     interpreter_version(lock, platform), on_tree=early.offer)
    finally:
        written_early = early.finish()
    bytecode_cpu, trees_seconds = children_cpu_seconds() - children, time.monotonic() - trees_started
    trees = dict(zip(wheels, trees_made, strict=True))
    work = out / "generated"
    planned = plan(record, lock, trees, spec, work)
    too_big = [layer.name for layer in planned if layer.size > spec.max_layer_bytes]
    if too_big:
        raise ServestackError(f"layers over {spec.max_layer_bytes} bytes: {too_big}")
    console.progress(f"{title}: {len(planned) + 1} layers ({sum(layer.size for layer in planned) / 1e9:.2f} GB above the base) "
                    f"for {platform}")
    base, refs, stats = _write_layers(stack, planned, epoch, lock, platform, address, uploads, written_early)
    all_refs = base.layers + refs
    environment = {**spec.environment, **lock.environment}
    labels = _labels(record, lock)
    wanted = prebuilt.targets(lock, platform)
    made = None
    if wanted:
        below = _push_manifest(address, repository, f"below-{cache_tag}", platform, all_refs, environment, labels, epoch,
                               base.config)
        made = prebuilt.prebuild(f"{address}/{repository}@{below.digest}", platform, *wanted, title)
        members = layers.with_parents(made.entries)
        blob = layers.write_layer(members, epoch, layers.layer_key(members, epoch), lambda n: None, lambda n: None)
        all_refs.append(oci.LayerRef(name="prebuilt", digest=blob.digest, diff_id=blob.diff_id, size=blob.size))
        uploads.send(blob.digest, blob.path, blob.size)
        uploads.wait([blob.digest])
    manifest_doc = _push_manifest(address, repository, cache_tag, platform, all_refs, environment, labels, epoch, base.config)
    served = manifest_doc.digest
    made_trees = [t for t in trees_made if t.made]
    result = image_record(
        f"{address}/{repository}@{served}", platform, json.loads(manifest_doc.data), [r.name for r in all_refs], record,
        compiled_by, skipped=False, seconds=round(time.monotonic() - started, 2), **stats,
        trees={"made": len(made_trees), "cached": len(trees_made) - len(made_trees), "seconds": round(trees_seconds, 1),
               "install_seconds": round(sum(t.install_seconds for t in made_trees), 1),
               "bytecode_seconds": round(sum(t.bytecode_seconds for t in made_trees), 1),
               "install_cpu_seconds": round(sum(t.install_cpu_seconds for t in made_trees), 1),
               "bytecode_cpu_seconds": round(bytecode_cpu, 1),
               "bytecode_bytes": sum(e.size for t in trees_made for e in t.entries if e.path.endswith(".pyc"))},
        prebuilt=made.record if made else None,
        expected=check_expected(project, stack, platform, served, record.lock_sha256),
        manifest_size=len(manifest_doc.data),
    )
    write_image(out / "image.json", result)
    _prune_caches(title, stack, [t.path for t in trees_made], [r.digest for r in all_refs])
    console.progress(f"{title}: {result.reference} ({result.total_size / 1e9:.2f} GB in {len(all_refs)} layers; "
                    f"{stats['layers_built']} written, {stats['layers_pushed']} pushed, {stats['bytes_pushed'] / 1e6:.1f} MB; "
                    f"{result.seconds:.1f} s)")
    return result


def _prune_caches(title: str, stack: str, trees: list[Path], digests: list[str]) -> None:
    """Keep the layer and tree caches bounded (prune.py); a failure to prune never fails the build."""
    try:
        prune.record_use(stack, trees, digests)
        pruned = prune.prune()
    except OSError as exc:
        console.warning("servestack.image", f"{title}: the caches were not pruned: {exc}")
        return
    if pruned.removed:
        console.progress(f"{title}: cache pruned: {pruned.removed} layer blobs, keys and trees no recent build used, "
                        "and sha256 records of changed or removed files "
                        f"({pruned.freed_bytes / 1e9:.2f} GB freed)")


def load_image(project: Project, stack: str) -> ImageRecord:
    path = project.artifacts(stack) / "image.json"
    return read_image(path, f"run `nox -s image -- --stack {stack}` first", path.relative_to(project.root))
