"""What a GPU image compiles at serving time: Triton's CUDA launcher, built the way Triton builds it.

On a GPU, Triton's NVIDIA backend compiles its driver and launcher module (backends/nvidia/driver.c)
the first time a kernel runs: runtime/build.py takes $CC, else gcc, else clang, adds the
interpreter's include directory (sysconfig, for Python.h) and links a CPython extension. vLLM runs
Triton kernels in every GDN layer and through torch.compile, so an image without a C compiler,
libc headers or Python.h serves nothing on a GPU, while every file check and import passes.

This section does that build in the image, through each installed Triton's own helper
(`compile_module_from_src`, in a fresh cache directory so nothing cached answers): a tiny
extension with the headers driver.c itself includes (cuda.h from the wheel, libc's, Python.h) and
the driver's include directories, then imported and called. Only libcuda is left out of the link,
which the GPU node's driver provides. It runs when torch is a CUDA build: a CPU build never
starts Triton's CUDA driver.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time

from .fast_path import torch_cuda
from .report import FAIL, PASS, check, installed_distributions, normalize, site_packages

# Distributions that carry a Triton (their own top-level package) with an NVIDIA backend.
TRITONS = {"triton": "triton", "tokenspeed-triton": "tokenspeed_triton"}

MODULE_NAME = "servestack_probe_launcher"

# Returns sizeof(CUdeviceptr): compiled only if cuda.h was found and parsed.
FUNCTION = r"""
static PyObject *device_pointer_size(PyObject *self, PyObject *args) {
  return PyLong_FromSize_t(sizeof(CUdeviceptr));
}
static PyMethodDef methods[] = {{"device_pointer_size", device_pointer_size, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&module); }
"""

REMEDY = ("the image needs a C compiler (Debian: gcc), libc headers (libc6-dev) and the interpreter's headers "
          "(libpython3.X-dev) in the stack's base.debian.packages")


def runtime_builds(config: dict) -> dict[str, str]:
    """Installed Triton distributions whose CUDA launcher the GPU runtime compiles -> version (none for a CPU torch)."""
    site = site_packages(config)
    cuda, _ = torch_cuda(site)
    if not cuda:
        return {}
    installed = installed_distributions(site)
    return {name: installed[normalize(name)][0].version for name in TRITONS if installed.get(normalize(name))}


def _driver_source(package: str) -> tuple[str, list[str]]:
    """The #include lines of the package's driver.c and the include directories its driver compiles with."""
    import importlib

    driver = importlib.import_module(f"{package}.backends.nvidia.driver")
    path = os.path.join(os.path.dirname(os.path.realpath(driver.__file__)), "driver.c")
    with open(path, encoding="utf-8") as f:
        includes = [line for line in f.read().splitlines() if re.match(r"\s*#\s*include\b", line)]
    return "\n".join(includes) + "\n", list(driver.include_dirs)


def _build_with(package: str) -> tuple[str, str]:
    """Build and import the probe extension with the package's own build helper; (status, detail)."""
    import importlib

    build = importlib.import_module(f"{package}.runtime.build")
    headers, include_dirs = _driver_source(package)
    source = headers + FUNCTION % {"name": MODULE_NAME}
    # The compiler's own messages (a missing header, a missing linker) go to fd 2: keep them for the detail.
    with tempfile.TemporaryDirectory(prefix="probe-triton-") as tmp, tempfile.TemporaryFile() as errors:
        os.environ["TRITON_CACHE_DIR"] = tmp
        saved = os.dup(2)
        os.dup2(errors.fileno(), 2)
        start = time.monotonic()
        try:
            module = build.compile_module_from_src(src=source, name=MODULE_NAME, include_dirs=include_dirs)
            size = module.device_pointer_size()
            problem = None
        except BaseException as e:  # noqa: BLE001 - a failed build is this check's finding
            problem = f"{type(e).__name__}: {e}"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        elapsed = time.monotonic() - start
        errors.seek(0)
        said = errors.read().decode(errors="replace").strip()
    if problem:
        tail = "\n".join(said.splitlines()[-8:])
        return FAIL, f"{problem}{chr(10) + tail if tail else ''}\n{REMEDY}"
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    return PASS, (f"{build.__name__}.compile_module_from_src built and imported a CPython extension with driver.c's "
                  f"headers ({headers.count(chr(10))} #include lines: cuda.h, Python.h, libc) in {elapsed:.1f} s "
                  f"with {compiler}; sizeof(CUdeviceptr) = {size}")


def section_runtime_build(config: dict) -> list[dict]:
    results = []
    for name, version in runtime_builds(config).items():
        package = TRITONS[name]
        try:
            status, detail = _build_with(package)
        except BaseException as e:  # noqa: BLE001 - the package or its driver does not load
            status, detail = FAIL, f"cannot load {package}'s build helper or NVIDIA driver module: {type(e).__name__}: {e}"
        results.append(check(f"runtime-build:{name}", status,
                             f"{name} {version} compiles its CUDA launcher at the first kernel launch on a GPU: {detail}"))
    return results
