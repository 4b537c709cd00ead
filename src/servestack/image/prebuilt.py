"""The prebuilt layer: what the serving path would compile at start (FlashInfer's modules, the CUDA link
layout they need), compiled at build time inside the image made of every layer below it, by its own
nvcc, g++ and FlashInfer (probe/prebuild.py), for the stack's target GPUs (`gpu_node.prebuilt`).

The compile is the only step of the build that runs the image: device code does not depend on the
host, but the host objects and the link need the platform's compiler, headers and libraries, which
the image has. A foreign platform's image runs under qemu-user (services/binfmt.py).
The result is cached by content: the image it ran in (by digest), the targets, the modules and the
script; a build whose layers below did not change compiles nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from docker.models.containers import Container

from servestack import services
from servestack.errors import CommandError, ServestackError
from servestack.image import layers
from servestack.platforms import host_platform
from servestack.probe import prebuild as prebuild_script
from servestack.records.lockfile import Lock
from servestack.services.dockerd import ensure_image
from servestack.util.fsutil import canonical_json, sha256_bytes, sha256_file
from servestack.util.proc import run
from servestack.util.project import cache_home

log = logging.getLogger("servestack.image")

SCRIPT = Path(prebuild_script.__file__)  # run in the image only; imported so the image's code closure holds it
RECORD = "prebuilt.json"
DEADLINE_S = 3600  # a native compile takes minutes; an emulated one that hangs must not hold the build forever
MIN_QEMU = 10


@dataclass(frozen=True, kw_only=True)
class Prebuilt:
    entries: tuple[layers.Entry, ...]  # the layer's files and links, rooted at /
    record: dict[str, Any]  # prebuild.py's account: targets, layout, stub, each module's compile seconds
    cached: bool


def targets(lock: Lock, platform: str) -> tuple[str, list[str]] | None:
    """(FLASHINFER_CUDA_ARCH_LIST, modules) for this platform, or None when the stack prebuilds nothing."""
    prebuilt = (lock.gpu_node or {}).get("prebuilt")
    if not prebuilt:
        return None
    archs = prebuilt["archs"].get(platform)
    if not archs:
        raise ServestackError(f"{lock.file}: gpu_node.prebuilt.archs has no entry for {platform}; "
                              f"expected the target GPUs of every platform of the stack ({', '.join(lock.platforms)})")
    return " ".join(archs), list(prebuilt["modules"])


def cache_key(image_digest: str, archs: str, modules: list[str]) -> str:
    return sha256_bytes(canonical_json({"image": image_digest, "archs": archs, "modules": modules,
                                        "script": sha256_file(SCRIPT)}).encode())


def _entries(tree: Path) -> tuple[layers.Entry, ...]:
    return tuple(e for e in layers.scan_tree(tree) if e.path != RECORD)


def prebuild(reference: str, platform: str, archs: str, modules: list[str], title: str) -> Prebuilt:
    """Run probe/prebuild.py in the image REFERENCE (by digest) for PLATFORM, or take its cached result."""
    digest = reference.split("@", 1)[1]
    key = cache_key(digest, archs, modules)
    done = cache_home() / "prebuilt" / key
    if (done / RECORD).exists():
        print(f"{title}: prebuilt modules for {archs} taken from the cache ({key[:16]})", flush=True)
        return Prebuilt(entries=_entries(done), record=json.loads((done / RECORD).read_text()), cached=True)
    work = done.with_name(f".{key}.{uuid.uuid4().hex[:8]}")
    work.mkdir(parents=True)
    try:
        started = time.monotonic()
        print(f"{title}: compiling {', '.join(m.split(':')[1] for m in modules)} for {archs} inside the image "
              f"({platform}); minutes on two cores ...", flush=True)
        _run(reference, platform, work, archs, modules)
        record = json.loads((work / RECORD).read_text())
        record["seconds"] = round(time.monotonic() - started, 1)
        record["built_in"] = reference  # left in dockerd: the built image shares every layer but this one
        (work / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        work.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{title}: prebuilt {len(record['modules'])} module(s) for {archs} in {record['seconds']:.0f} s", flush=True)
    return Prebuilt(entries=_entries(done), record=record, cached=False)


def _emulator_refusal(platform: str) -> str | None:
    """Why this machine's qemu cannot run the compile for PLATFORM, or None. Measured here: Debian 12's
    qemu-user 7.2 crashes in the image's `import torch` (oneDNN's aarch64 CPU probe, "uncaught target
    signal 11"), and FlashInfer's JIT imports torch; Debian 13's qemu-user 10.0 imports it in 87 s."""
    interpreter = next((line.split(" ", 1)[1] for line in _binfmt_entry().splitlines() if line.startswith("interpreter ")), None)
    if interpreter is None:
        return None
    try:
        # Debian's binfmt entry is a wrapper that runs only under binfmt_misc; its target answers --version.
        shown = run([str(Path(interpreter).resolve()), "--version"], timeout=10).stdout
    except (CommandError, OSError):
        return None
    found = re.search(r"version ((\d+)\.[\d.]+)", shown)
    if found and int(found[2]) < MIN_QEMU:
        return (f"the prebuilt layer for {platform} is compiled inside the {platform} image, here under qemu-user, and "
                f"this machine's {interpreter} is qemu {found[1]}: it crashes in the image's `import torch` "
                f"(FlashInfer's JIT needs it). Register qemu-user {MIN_QEMU} or newer (Debian 13's qemu-user) for "
                f"binfmt_misc, or build {platform} on a {platform} machine")
    return None


def _binfmt_entry() -> str:
    try:
        return Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").read_text()
    except OSError:
        return ""


def preflight(lock: Lock, platform: str) -> None:
    """Before any layer is written: a foreign platform's compile can run here (its emulator works)."""
    if targets(lock, platform) is None or platform == host_platform():
        return
    services.ensure_binfmt_aarch64()
    refusal = _emulator_refusal(platform)
    if refusal:
        raise ServestackError(refusal)


def _run(reference: str, platform: str, out: Path, archs: str, modules: list[str]) -> None:
    client = services.docker_client()
    ensure_image(client, reference, platform)
    # SYS_ADMIN: prebuild.py starts each nvcc in a pid namespace of its own (it says why); no network.
    container = client.containers.run(
        reference, ["python", "/mnt/prebuild.py", "/out", archs, *modules], detach=True, network_mode="none",
        platform=platform, cap_add=["SYS_ADMIN"], name=f"servestack-prebuild-{uuid.uuid4().hex[:8]}",
        volumes={str(SCRIPT): {"bind": "/mnt/prebuild.py", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"}})
    try:
        try:
            status = container.wait(timeout=DEADLINE_S)
        except requests.exceptions.ConnectionError:  # the client's read timeout: the compile outlived its deadline
            raise ServestackError(f"compiling {', '.join(modules)} for {archs} inside {reference} ({platform}) did not end "
                                  f"within {DEADLINE_S} s:\n{_tail(container)}") from None
        if status.get("StatusCode") != 0:
            raise ServestackError(f"compiling {', '.join(modules)} for {archs} inside {reference} ({platform}) failed "
                                  f"(exit {status.get('StatusCode')}):\n{_tail(container)}")
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def _tail(container: Container) -> str:
    try:
        return container.logs(tail=40).decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - a container removed or dead answers no logs; say so, keep the real error
        return f"(no log: {e})"
