"""What a GPU image compiles at serving time: Triton's CUDA driver module, built the way Triton builds it.

On a GPU, Triton's NVIDIA backend compiles backends/nvidia/driver.c into its `cuda_utils` CPython
extension the first time a kernel runs (CudaUtils in backends/nvidia/driver.py, through
runtime/build.py's compile_module_from_src). vLLM runs Triton kernels in every GDN layer and
through torch.compile, so an image whose compiler, libc headers or Python.h cannot build that
file serves nothing on a GPU, while every file check and import passes.

This section makes CudaUtils's own call in the image: the whole driver.c, read from the installed
package, through that package's compile_module_from_src, with the driver module's include_dirs,
its libdevice directory and its libraries, in a fresh cache directory so nothing cached answers.
Only libcuda stays out: the GPU node's driver provides it, and Triton's libcuda_dirs() asserts
when it is absent. A shared object may leave symbols undefined, so driver.c's cu* calls link
unresolved; the module is then imported with lazy binding (its init calls no CUDA function) and
every other undefined symbol must resolve in this interpreter, so only libcuda is missing.
It runs when torch is a CUDA build: a CPU build never starts Triton's CUDA driver.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .fast_path import torch_cuda
from .report import FAIL, PASS, check, installed_distributions, normalize, site_packages

# Distributions that carry a Triton (their own top-level package) with an NVIDIA backend.
TRITONS = {"triton": "triton", "tokenspeed-triton": "tokenspeed_triton"}

# The extension name CudaUtils gives driver.c (its PyInit_cuda_utils).
MODULE_NAME = "cuda_utils"

# Every CUDA driver API entry point; libcuda is the one library the image cannot hold.
LIBCUDA_PREFIX = "cu"

REMEDY = ("the image needs a C compiler (Debian: gcc), libc headers (libc6-dev) and the interpreter's headers "
          "(libpython3.X-dev) in the stack's base.debian.packages")


@dataclass(frozen=True)
class DriverBuild:
    """CudaUtils's compile_module_from_src arguments, read from the package's driver module, minus libcuda."""

    source_path: str
    source: str
    include_dirs: list[str]
    library_dirs: list[str]
    libraries: list[str]
    left_out: list[str]


def runtime_builds(config: dict) -> dict[str, str]:
    """Installed Triton distributions whose CUDA driver module the GPU runtime compiles -> version (none for a CPU torch)."""
    site = site_packages(config)
    cuda, _ = torch_cuda(site)
    if not cuda:
        return {}
    installed = installed_distributions(site)
    return {name: installed[normalize(name)][0].version for name in TRITONS if installed.get(normalize(name))}


def driver_build(package: str) -> DriverBuild:
    """What CudaUtils compiles: driver.c beside the driver module, its include_dirs, libdevice_dir and libraries.

    library_dirs() is not called: it is libdevice_dir plus libcuda_dirs(), which asserts without a GPU driver.
    """
    driver = importlib.import_module(f"{package}.backends.nvidia.driver")
    assert driver.__file__ is not None  # a module of the package's files, not a namespace package
    path = os.path.join(os.path.dirname(os.path.realpath(driver.__file__)), "driver.c")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    libraries = list(driver.libraries)
    left_out = [lib for lib in libraries if lib.startswith("libcuda.") or lib == "cuda"]
    return DriverBuild(path, source, list(driver.include_dirs), [driver.libdevice_dir],
                       [lib for lib in libraries if lib not in left_out], left_out)


def undefined_symbols(shared_object: str) -> list[str]:
    """The shared object's strong undefined dynamic symbols, without version suffixes (nm comes with gcc's binutils)."""
    nm = shutil.which("nm")
    if nm is None:
        raise RuntimeError("no nm on PATH to list the built module's undefined symbols (Debian: binutils, which gcc depends on)")
    out = subprocess.run([nm, "-D", "--undefined-only", shared_object], check=True, capture_output=True, text=True).stdout
    return sorted({line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[:1] == ["U"]})


def _build_with(package: str) -> tuple[str, str]:
    """Build and import driver.c the way CudaUtils does, libcuda left out; (status, detail)."""
    build = importlib.import_module(f"{package}.runtime.build")
    spec = driver_build(package)
    # The compiler's own messages (a missing header, a missing linker) go to fd 2: keep them for the detail.
    with tempfile.TemporaryDirectory(prefix="probe-triton-") as tmp, tempfile.TemporaryFile() as errors:
        os.environ["TRITON_CACHE_DIR"] = tmp
        saved, flags = os.dup(2), sys.getdlopenflags()
        os.dup2(errors.fileno(), 2)
        # Lazy binding: the cu* functions stay unbound until called; the init runs none of them.
        sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_LOCAL)
        start = time.monotonic()
        try:
            module = build.compile_module_from_src(src=spec.source, name=MODULE_NAME, include_dirs=spec.include_dirs,
                                                   library_dirs=spec.library_dirs, libraries=spec.libraries)
            elapsed = time.monotonic() - start
            undefined = undefined_symbols(module.__file__)
            problem = None
        except BaseException as e:
            problem = f"{type(e).__name__}: {e}"
        finally:
            sys.setdlopenflags(flags)
            os.dup2(saved, 2)
            os.close(saved)
        errors.seek(0)
        said = errors.read().decode(errors="replace").strip()
    if problem:
        tail = "\n".join(said.splitlines()[-8:])
        return FAIL, f"{problem}{chr(10) + tail if tail else ''}\n{REMEDY}"
    libcuda = [name for name in undefined if name.startswith(LIBCUDA_PREFIX)]
    process = ctypes.CDLL(None)
    unresolved = [name for name in undefined if name not in libcuda and not hasattr(process, name)]
    what = (f"{spec.source_path} ({spec.source.count(chr(10))} lines, sha256 {hashlib.sha256(spec.source.encode()).hexdigest()[:12]}) "
            f"through {build.__name__}.compile_module_from_src as CudaUtils calls it (name {MODULE_NAME}, "
            f"include_dirs {spec.include_dirs}, library_dirs {spec.library_dirs}, libraries {spec.libraries}; "
            f"left out {spec.left_out}, which the GPU node's driver provides)")
    if unresolved:
        return FAIL, (f"built {what}, but {len(unresolved)} undefined symbols are neither libcuda's nor in this "
                      f"interpreter: {', '.join(unresolved[:10])}")
    public = sorted(name for name in vars(module) if not name.startswith("_"))
    return PASS, (f"built {what} in {elapsed:.1f} s and imported it with lazy binding ({len(public)} names: "
                  f"{', '.join(public[:6])}{', ...' if len(public) > 6 else ''}); its {len(libcuda)} undefined "
                  f"cu* symbols stay for libcuda; the other {len(undefined) - len(libcuda)} resolve in this interpreter")


def section_runtime_build(config: dict) -> list[dict]:
    results = []
    for name, version in runtime_builds(config).items():
        package = TRITONS[name]
        try:
            status, detail = _build_with(package)
        except BaseException as e:
            status, detail = FAIL, f"cannot load {package}'s build helper or NVIDIA driver module: {type(e).__name__}: {e}"
        results.append(check(f"runtime-build:{name}", status,
                             f"{name} {version} compiles its CUDA driver module at the first kernel launch on a GPU: {detail}"))
    return results
