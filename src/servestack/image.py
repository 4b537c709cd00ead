"""`servestack image`: plan the layers, then build them with BuildKit and push by digest.

Planning the layers (`plan`, testable without docker) is separate from running buildx. Wheels
are installed on the host into per-wheel trees (pypa/installer, with deterministic bytecode; no
target code executed), then hard-linked into layer directories of the build context; each layer
is one `COPY --link`. Every file lands in exactly one layer. The OCI output is built with
SOURCE_DATE_EPOCH from the lock, layer timestamps rewritten and no provenance, so the same
inputs give the same manifest digest.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from . import build as build_step
from . import proc, services
from .errors import ServestackError
from .fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from .project import Project, cache_home
from .sources import registry

log = logging.getLogger("servestack.image")

VENV = "opt/venv"
# Uncompressed bytes per layer: keeps every compressed layer well under 2 GB, so a cluster can
# pull layers in parallel and no registry's layer-size limit is hit.
LAYER_LIMIT = 1_500_000_000
ARCH = {"linux/amd64": "amd64", "linux/arm64": "arm64"}


@dataclass
class Layer:
    name: str
    files: list[tuple[Path, str]] = field(default_factory=list)  # (source on host, path in image)
    size: int = 0


# --------------------------------------------------------------------------- installing wheels


def site_packages(python: str) -> str:
    return f"{VENV}/lib/python{python}/site-packages"


def installed_tree(wheel: Path, sha256: str, python: str) -> Path:
    """The wheel installed as the image's venv would hold it, with its bytecode, cached by the wheel's hash."""
    tree = cache_home() / "installed" / f"{sha256}-py{python}-pyc{BYTECODE}"
    if tree.exists():
        return tree
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    staging = tree.with_name(tree.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    root = staging / "root"
    scheme = {
        "purelib": str(root / site_packages(python)),
        "platlib": str(root / site_packages(python)),
        "headers": str(root / VENV / "include" / "site" / f"python{python}"),
        "scripts": str(root / VENV / "bin"),
        "data": str(root / VENV),
    }
    destination = SchemeDictionaryDestination(
        scheme, interpreter=f"/{VENV}/bin/python", script_kind="posix", bytecode_optimization_levels=()
    )
    with WheelFile.open(wheel) as source, warnings.catch_warnings():
        # Some wheels ship __pycache__ files; installer skips them (we want no bytecode) and warns.
        warnings.simplefilter("ignore", RuntimeWarning)
        install(source, destination, additional_metadata={"INSTALLER": b"servestack\n"})
    _compile_bytecode(root / site_packages(python), python)
    staging.rename(tree)
    return tree


# Part of the installed trees' cache key: bump when the bytecode recipe changes.
BYTECODE = 1


def _compile_bytecode(site: Path, python: str) -> None:
    """Ship bytecode, so no container compiles torch and vLLM again (read-only images cannot cache it).

    Unchecked-hash pycs carry no timestamps, and a fixed hash seed keeps constant sets in one order,
    so the bytes depend only on the sources and the interpreter's minor version; they are compiled by
    the host's interpreter of the image's Python version (bytecode is the same on every platform).
    """
    interpreter = shutil.which(f"python{python}")
    if interpreter is None or not site.is_dir():
        log.warning("no python%s on this host: the image ships no bytecode for %s", python, site)
        return
    script = (
        "import compileall, py_compile, sys\n"
        "compileall.compile_dir(sys.argv[1], ddir=sys.argv[2], quiet=2, workers=1,\n"
        "                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
    )
    proc.run([interpreter, "-c", script, str(site), "/" + site_packages(python)], env={"PYTHONHASHSEED": "0"}, timeout=3600)


def _files_of(tree: Path) -> list[tuple[Path, str]]:
    root = tree / "root"
    return sorted(
        ((p, p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file() or p.is_symlink()),
        key=lambda item: item[1],
    )


# --------------------------------------------------------------------------- planning


def _pack(prefix: str, groups: list[list[tuple[Path, str]]]) -> list[Layer]:
    """First-fit in a stable order; a group larger than the limit is split by path."""
    layers: list[Layer] = [Layer(f"{prefix}-0")]
    for group in groups:
        for source, target in group:
            size = source.lstat().st_size
            if layers[-1].size + size > LAYER_LIMIT and layers[-1].files:
                layers.append(Layer(f"{prefix}-{len(layers)}"))
            layers[-1].files.append((source, target))
            layers[-1].size += size
    return [layer for layer in layers if layer.files]


def plan(record: dict[str, Any], python: str, context: Path) -> list[Layer]:
    """Layers from the build record: deps, pinned packages, model, then the top layer."""
    deps: list[list[tuple[Path, str]]] = []
    pinned: list[list[tuple[Path, str]]] = []
    top = Layer("top")
    overlay_by_base = {o["base"]["sha256"]: o for o in record["overlays"]}
    overlay_files: dict[str, str] = {}
    for item in sorted(record["inputs"], key=lambda i: i["name"]):
        files = _files_of(installed_tree(Path(item["path"]), item["sha256"], python))
        applied = overlay_by_base.get(item["sha256"])
        if applied:
            # The top layer holds every file the overlay changed; the package layer keeps the rest,
            # so no file is stored twice and a changed PR only changes the top layer.
            new_files = _files_of(installed_tree(Path(applied["path"]), applied["wheel"]["sha256"], python))
            old = {target: source for source, target in files}
            for source, target in new_files:
                unchanged = target in old and ".dist-info/" not in target and sha256_file(old[target]) == sha256_file(source)
                if not unchanged:
                    top.files.append((source, target))
                    top.size += source.lstat().st_size
                    overlay_files[target] = sha256_file(source)
            kept = {t for s, t in new_files} - set(overlay_files)
            files = [(s, t) for s, t in files if t in kept]
        (pinned if item["declared"] else deps).append(files)
    layers = _pack("deps", deps) + _pack("pinned", pinned)
    if record.get("model"):
        model_dir = Path(record["model"]["path"])
        name = record["model"]["name"]
        model_files = [(p, f"opt/servestack/models/{name}/{p.name}") for p in sorted(model_dir.iterdir()) if p.is_file()]
        layers.append(Layer("model", model_files, sum(p.stat().st_size for p, _ in model_files)))
    stack_json = context / "stack.json"
    stack_json.parent.mkdir(parents=True, exist_ok=True)
    stack_json.write_text(canonical_json({
        "lock_sha256": record["lock_sha256"],
        "lock": record["lock"],
        "overlays": {o["package"]: {"version": o["wheel"]["version"], "prs": [f"{p['repo']}#{p['number']}" for p in o["prs"]],
                                    "files": {t[len(site_packages(python)) + 1:] if t.startswith(site_packages(python)) else t: h
                                              for t, h in sorted(overlay_files.items())}}
                     for o in record["overlays"]},
    }))
    top.files.append((stack_json, "opt/servestack/stack.json"))
    top.files.sort(key=lambda f: f[1])
    return [_venv_layer(context, python)] + layers + [top]


def _venv_layer(context: Path, python: str) -> Layer:
    """A venv is a pyvenv.cfg and a link to the interpreter; written here, nothing runs in the image."""
    skeleton = context / "venv-skeleton"
    shutil.rmtree(skeleton, ignore_errors=True)
    (skeleton / "bin").mkdir(parents=True)
    (skeleton / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python}\nexecutable = /usr/bin/python{python}\n"
    )
    for name in ("python", "python3", f"python{python}"):
        (skeleton / "bin" / name).symlink_to(f"/usr/bin/python{python}")
    files = [(p, f"{VENV}/{p.relative_to(skeleton).as_posix()}") for p in sorted(skeleton.rglob("*")) if p.is_file() or p.is_symlink()]
    return Layer("venv", files, 0)


# --------------------------------------------------------------------------- the base


def debian_base(lock_base: dict[str, Any], platform: str) -> Path:
    """A Debian rootfs tarball built with mmdebstrap; bit-identical for the same archive state."""
    spec = lock_base["debian"]
    key = sha256_bytes(canonical_json({**spec, "arch": ARCH[platform]}).encode())[:24]
    out = cache_home() / "bases" / f"{spec['suite']}-{ARCH[platform]}-{key}.tar"
    if out.exists():
        return out
    from .sources import debian

    release = debian.release(spec["suite"])
    if release.sha256 != spec["release_sha256"]:
        raise ServestackError(
            f"the Debian archive has moved since the lock: {spec['suite']} Release is now dated "
            f"{time.strftime('%Y-%m-%d', time.gmtime(release.date))}; re-run `nox -s lock`"
        )
    if platform == "linux/arm64":
        services.ensure_binfmt_aarch64()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}.tar")
    proc.run(
        ["mmdebstrap", "--variant=minbase", f"--architectures={ARCH[platform]}",
         f"--include={','.join(spec['packages'])}", spec["suite"], str(tmp), debian.mirror()],
        env={"SOURCE_DATE_EPOCH": str(spec["release_date"])},
        timeout=1800,
    )
    tmp.rename(out)
    return out


# --------------------------------------------------------------------------- the build context


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
        target.symlink_to(os.readlink(source))
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_context(project: Project, record: dict[str, Any], lock_doc: dict[str, Any], context: Path) -> list[Layer]:
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    python = lock_doc["python"]
    layers = plan({**record, "lock": lock_doc}, python, context)
    lines = []
    for index, layer in enumerate(layers):
        directory = f"layers/{index:02d}-{layer.name}"
        for source, target in layer.files:
            _link(source, context / directory / target)
        lines.append(f"COPY --link {directory}/ /")
    environment = lock_doc.get("environment", {})
    env_line = ("ENV " + " \\\n    ".join(f"{k}={json.dumps(v)}" for k, v in sorted(environment.items()))) if environment else ""
    template = (project.containers / "Dockerfile.in").read_text()
    (context / "Dockerfile").write_text(template.replace("@LAYERS@", "\n".join(lines)).replace("@ENVIRONMENT@", env_line))
    if "debian" in lock_doc["base"]:
        _link(debian_base(lock_doc["base"], record["platform"]), context / "base" / "rootfs.tar")
    return layers


# --------------------------------------------------------------------------- build and push


def _labels(record: dict[str, Any], lock_doc: dict[str, Any]) -> dict[str, str]:
    prs = [f"{p['repo']}#{p['number']}:{p['status']}" for p in lock_doc["pull_requests"]]
    return {
        "org.opencontainers.image.title": f"servestack/{record['stack']}",
        "org.opencontainers.image.description": f"servestack stack {record['stack']} built from its lock",
        "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record["source_date_epoch"])),
        "org.opencontainers.image.version": record["input_hash"][:12],
        "org.opencontainers.image.licenses": "Apache-2.0",
        "io.servestack.stack": record["stack"],
        "io.servestack.lock.sha256": record["lock_sha256"],
        "io.servestack.input-hash": record["input_hash"],
        "io.servestack.prs": ",".join(prs),
    }


def _oci_manifest(archive: Path) -> tuple[str, dict[str, Any], dict[str, int]]:
    """The manifest digest, the manifest and each blob's size, read from an OCI archive."""
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))
        digest = index["manifests"][0]["digest"]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{digest.split(':')[1]}"))
    if manifest.get("mediaType", "").endswith("index.v1+json"):
        raise ServestackError("buildx wrote an image index; expected a single-platform manifest")
    return digest, manifest, {layer["digest"]: layer["size"] for layer in manifest["layers"]}


def _missing_blobs(address: str, repository: str, digests: list[str]) -> list[str]:
    missing = []
    for digest in digests:
        response = requests.head(f"http://{address}/v2/{repository}/blobs/{digest}", timeout=10)
        if response.status_code != 200:
            missing.append(digest)
    return missing


def image_record(reference: str, platform: str, manifest: dict[str, Any], record: dict[str, Any], **extra: Any) -> dict[str, Any]:
    layers = [{"digest": layer["digest"], "size": layer["size"],
               "title": (layer.get("annotations") or {}).get("org.opencontainers.image.title")} for layer in manifest["layers"]]
    return {
        "reference": reference,
        "stack": record["stack"],
        "platforms": [platform],
        "lock_sha256": record["lock_sha256"],
        "input_hash": record["input_hash"],
        "total_size": sum(layer["size"] for layer in layers) + manifest["config"]["size"],
        "layers": layers,
        **extra,
    }


def _fetch_manifest(address: str, repository: str, ref: str) -> dict[str, Any] | None:
    response = requests.get(f"http://{address}/v2/{repository}/manifests/{ref}", timeout=10,
                            headers={"Accept": registry.MANIFEST_TYPES})
    return response.json() if response.status_code == 200 else None


def build_image(project: Project, stack: str, registry_address: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    out = project.artifacts(stack)
    image_json = out / "image.json"
    image_json.unlink(missing_ok=True)
    record = build_step.load_build(project, stack)
    lock_doc = json.loads(project.lock_file(stack).read_text())
    if record["lock_sha256"] != sha256_file(project.lock_file(stack)):
        raise ServestackError(f"build/{stack}/build.json was made from another lock; run `nox -s build` again")
    services.ensure_dockerd()
    address = registry_address or services.ensure_registry()
    repository = f"servestack/{stack}"
    cache_tag = f"in-{record['input_hash'][:32]}"

    existing = _fetch_manifest(address, repository, cache_tag)
    if existing is not None:
        digest = registry.resolve_digest(f"{address}/{repository}:{cache_tag}")
        result = image_record(f"{address}/{repository}@{digest}", record["platform"], existing, record,
                              skipped=True, bytes_pushed=0, layers_pushed=0, seconds=round(time.monotonic() - started, 1))
        atomic_write_json(image_json, result)
        print(f"image {stack}: the registry already holds this build ({cache_tag}); skipped: {result['reference']}")
        return result

    context = out / "context"
    layers = write_context(project, record, lock_doc, context)
    archive = out / "image.oci.tar"
    tmp_archive = out / f".image.oci.tar.tmp{os.getpid()}"
    epoch = str(record["source_date_epoch"])
    # --no-cache: BuildKit 0.13 failed to export zstd layers it had cached from an earlier build
    # ("unsupported diff media type ... tar+zstd"); unchanged builds are skipped before this anyway.
    argv = ["docker", "buildx", "build", "--no-cache", "--pull=false", "--network=none", "--provenance=false", "--sbom=false",
            "--platform", record["platform"], "--build-arg", f"SOURCE_DATE_EPOCH={epoch}",
            "--output", f"type=oci,dest={tmp_archive},rewrite-timestamp=true,compression=zstd,compression-level=3,force-compression=true"]
    if "image" in lock_doc["base"]:
        base = lock_doc["base"]["image"]
        argv += ["--build-arg", f"BASE={registry.Reference.parse(base['reference']).with_digest(base['digest'])}"]
    for key, value in sorted(_labels(record, lock_doc).items()):
        argv += ["--label", f"{key}={value}", "--annotation", f"manifest:{key}={value}"]
    argv.append(str(context))
    uncompressed = sum(layer.size for layer in layers)
    print(f"image {stack}: building {len(layers)} layers ({uncompressed / 1e9:.2f} GB before compression) "
          f"for {record['platform']} with BuildKit, no network", flush=True)
    build_started = time.monotonic()
    try:
        proc.run(argv, env={"SOURCE_DATE_EPOCH": epoch, "BUILDKIT_PROGRESS": "plain"}, timeout=3600)
        os.replace(tmp_archive, archive)
    finally:
        tmp_archive.unlink(missing_ok=True)
    build_seconds = time.monotonic() - build_started

    digest, manifest, sizes = _oci_manifest(archive)
    too_big = {d: s for d, s in sizes.items() if s > 2_000_000_000}
    if too_big:
        raise ServestackError(f"layers over 2 GB: {too_big}")
    missing = _missing_blobs(address, repository, list(sizes))
    for tag in (cache_tag,):
        proc.run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false",
                  f"oci-archive:{archive}", f"docker://{address}/{repository}:{tag}"], timeout=3600)
    served = registry.resolve_digest(f"{address}/{repository}@{digest}")
    result = image_record(
        f"{address}/{repository}@{served}", record["platform"], manifest, record,
        skipped=False, layers_pushed=len(missing), bytes_pushed=sum(sizes[d] for d in missing),
        layer_names=[layer.name for layer in layers],
        build_seconds=round(build_seconds, 1), seconds=round(time.monotonic() - started, 1),
    )
    atomic_write_json(image_json, result)
    archive.unlink(missing_ok=True)
    print(f"image {stack}: {result['reference']} ({result['total_size'] / 1e9:.2f} GB in {len(sizes)} layers, "
          f"{result['layers_pushed']} pushed, {result['bytes_pushed'] / 1e6:.1f} MB)")
    return result


def load_image(project: Project, stack: str) -> dict[str, Any]:
    return project.read_artifact(stack, "image.json", made_by="image")
