"""Where the serving stack writes its compile caches, asked of each library, and whether it can.

srt-slurm starts containers with --no-container-mount-home and enroot's root is read-only, so the
home directory the libraries default to does not exist. The smoke runs this probe the same way
(read-only root, HOME a directory that does not exist, a tmpfs on /tmp as enroot mounts): each
location a library computes for itself must then be creatable and writable.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable

from .report import FAIL, PASS, check


def _attr(module: str, *names: str) -> Callable[[], str]:
    def ask() -> str:
        value = importlib.import_module(module)
        for name in names:
            value = getattr(value, name)
        return str(value() if callable(value) else value)
    return ask


def _triton(package: str) -> Callable[[], str]:
    def ask() -> str:
        knobs = importlib.import_module(f"{package}.knobs")
        return str(knobs.cache.dir)
    return ask


def _cuda_jit_cache() -> str:
    # The driver's PTX JIT cache (libcuda, so documented rather than asked): CUDA_CACHE_PATH, else ~/.nv/ComputeCache.
    return os.environ.get("CUDA_CACHE_PATH") or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache")


# What writes where at a GPU node's first start: (who, how to ask it). A library that is not
# installed is skipped by name; one that is installed and cannot say is a failure.
LOCATIONS: tuple[tuple[str, str, Callable[[], str]], ...] = (
    ("triton", "triton", _triton("triton")),
    ("tokenspeed-triton", "tokenspeed_triton", _triton("tokenspeed_triton")),
    ("torch inductor", "torch", _attr("torch._inductor.runtime.cache_dir_utils", "cache_dir")),
    ("flashinfer JIT", "flashinfer", _attr("flashinfer.jit.env", "FLASHINFER_WORKSPACE_DIR")),
    ("flashinfer cubins", "flashinfer", _attr("flashinfer.jit.env", "FLASHINFER_CUBIN_DIR")),
    ("vllm cache", "vllm", _attr("vllm.envs", "VLLM_CACHE_ROOT")),
    ("vllm config", "vllm", _attr("vllm.envs", "VLLM_CONFIG_ROOT")),
    ("huggingface", "huggingface_hub", _attr("huggingface_hub.constants", "HF_HOME")),
    ("CUDA JIT cache", "", _cuda_jit_cache),
    ("temporary files", "", tempfile.gettempdir),
)


def _writable(path: str) -> str | None:
    """None when a file can be made in `path` (created if need be), else why not."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".servestack-probe-")
        os.close(fd)
        os.unlink(probe)
        return None
    except OSError as e:
        return f"{e.strerror or e}"


def _root_read_only() -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir="/", prefix=".servestack-probe-")
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


def check_caches(config: dict, locations: tuple[tuple[str, str, Callable[[], str]], ...] = LOCATIONS,
                 root_read_only: Callable[[], bool] = _root_read_only) -> dict:
    if not root_read_only():
        return check("gpu-node:caches", FAIL, "the root is writable here, so this cannot show what a read-only root "
                     "does (the smoke runs the probe with --read-only, as enroot does)")
    import importlib.util

    home = os.path.expanduser("~")
    found, problems, skipped = [], [], []
    for who, module, ask in locations:
        if module and importlib.util.find_spec(module) is None:
            skipped.append(who)
            continue
        try:
            path = ask()
        except Exception as e:
            problems.append(f"{who}: cannot say where it caches ({type(e).__name__}: {e})")
            continue
        why = _writable(path)
        if why:
            problems.append(f"{who} writes {path}: {why}")
        else:
            found.append(f"{who} {path}")
    detail = f"HOME={home} ({'absent' if not os.path.exists(home) else 'present'}); "
    if problems:
        return check("gpu-node:caches", FAIL, detail + "; ".join(problems)
                     + ". Set the library's cache variable to a directory under /tmp in the stack's environment")
    return check("gpu-node:caches", PASS, detail + "writable: " + "; ".join(found)
                 + (f" (not installed: {', '.join(skipped)})" if skipped else ""))
