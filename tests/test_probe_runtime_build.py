"""The static probe builds, in the image, what Triton builds at its first GPU kernel launch.

The site holds a stand-in Triton laid out like the real one (runtime/build.py with
compile_module_from_src, backends/nvidia/driver.py with include_dirs, libdevice_dir and libraries,
driver.c, include/cuda.h) whose helper follows Triton's _build ($CC, else gcc, else clang; -shared
-fPIC; -l/-L/-I flags; the interpreter's include directory; the shared object imported as a
module), so the host's real compiler and Python.h build the stand-in driver.c, which calls a
libcuda function like the real one. The qwen35-gb200 smoke runs the same check with the real
Tritons in the arm64 image.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_probe_evidence import _site_with_torch
from test_smoke import _probe, _wheel, fake_site  # noqa: F401 - the module-scoped fixture

BUILD = '''import importlib.util, os, re, shutil, subprocess, sysconfig
from . import cache_dir


def compile_module_from_src(src, name, library_dirs=None, include_dirs=None, libraries=None, ccflags=None):
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    base = os.path.join(cache_dir(), name)
    with open(base + ".c", "w") as f:
        f.write(src)
    so = base + sysconfig.get_config_var("EXT_SUFFIX")
    cmd = [cc, base + ".c", "-O0", "-shared", "-fPIC", "-o", so]
    cmd += [f"-l:{lib}" if re.search(r"\\.so(\\.\\d+)*$", lib) else f"-l{lib}" for lib in libraries or []]
    cmd += [f"-L{d}" for d in library_dirs or []]
    cmd += [f"-I{d}" for d in [*(include_dirs or []), sysconfig.get_paths()["include"]]]
    subprocess.check_call(cmd, stdout=subprocess.DEVNULL)
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
'''

DRIVER = '''import os
dirname = os.path.dirname(os.path.realpath(__file__))
include_dirs = [os.path.join(dirname, "include")]
libdevice_dir = os.path.join(dirname, "lib")
libraries = ["libcuda.so.1"]
'''

CUDA_H = "typedef unsigned long long CUdeviceptr;\ntypedef struct CUctx_st *CUcontext;\nint cuCtxGetCurrent(CUcontext *pctx);\n"

# Like the real driver.c: a conditional include, code calling libcuda, PyInit_cuda_utils.
DRIVER_C = r'''#include "cuda.h"
#include <stdio.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifdef SERVESTACK_NEVER_DEFINED
#include <servestack_never_included.h>
#endif

static PyObject *current_context(PyObject *self, PyObject *args) {
  CUcontext ctx;
  if (cuCtxGetCurrent(&ctx) != 0)
    return NULL;
  return PyLong_FromVoidPtr(ctx);
}
static PyObject *device_pointer_size(PyObject *self, PyObject *args) {
  return PyLong_FromSize_t(sizeof(CUdeviceptr));
}
static PyMethodDef methods[] = {{"current_context", current_context, METH_NOARGS, NULL},
                                {"device_pointer_size", device_pointer_size, METH_NOARGS, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cuda_utils", NULL, -1, methods};
PyMODINIT_FUNC PyInit_cuda_utils(void) { return PyModule_Create(&module); }
'''

HAS_CC = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="no C compiler on this host")


def _triton(tmp: Path, name: str = "triton", driver_c: str = DRIVER_C) -> Path:
    package = name.replace("-", "_")
    return _wheel(tmp, package, "3.7.1", {
        f"{package}/__init__.py": "",
        # Like Triton's knobs: the cache directory is read from the environment when used.
        f"{package}/runtime/__init__.py": "import os\n\ndef cache_dir():\n    return os.environ['TRITON_CACHE_DIR']\n",
        f"{package}/runtime/build.py": BUILD,
        f"{package}/backends/__init__.py": "",
        f"{package}/backends/nvidia/__init__.py": "",
        f"{package}/backends/nvidia/driver.py": DRIVER,
        f"{package}/backends/nvidia/driver.c": driver_c,
        f"{package}/backends/nvidia/include/cuda.h": CUDA_H,
    })


def _checks(fake_site: dict, tmp: Path, cuda: str | None, wheels: list[Path]) -> dict[str, dict]:
    site = _site_with_torch(tmp, cuda, wheels)
    return _probe(tmp, {**fake_site["config"], "site_packages": str(site), "modules": [], "wheels": [],
                        "pull_requests": [], "excluded": []})


@HAS_CC
def test_each_installed_triton_builds_its_whole_driver_c_as_cuda_utils_does(fake_site, tmp_path: Path) -> None:  # noqa: F811
    checks = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path), _triton(tmp_path, "tokenspeed-triton")])
    for name, package in (("triton", "triton"), ("tokenspeed-triton", "tokenspeed_triton")):
        detail = checks[f"runtime-build:{name}"]["detail"]
        assert checks[f"runtime-build:{name}"]["status"] == "pass", detail
        assert f"{name} 3.7.1 compiles its CUDA driver module at the first kernel launch on a GPU" in detail
        assert f"{package}/backends/nvidia/driver.c ({DRIVER_C.count(chr(10))} lines" in detail
        assert f"through {package}.runtime.build.compile_module_from_src as CudaUtils calls it" in detail
        assert "libraries []; left out ['libcuda.so.1']" in detail
        # Its code was compiled and the module imported: its methods, and the one cu* call left for libcuda.
        assert "current_context, device_pointer_size" in detail
        assert re.search(r"its 1 undefined cu\* symbols stay for libcuda; the other [1-9]\d* resolve in this interpreter", detail)


def test_no_compiler_fails_with_what_the_image_needs(fake_site, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    check = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "no-such-cc" in check["detail"]
    assert "needs a C compiler (Debian: gcc), libc headers (libc6-dev)" in check["detail"]


@HAS_CC
@pytest.mark.parametrize(("original", "changed", "named"), [
    # A header the driver includes and the image lacks.
    ("#include <stdio.h>", "#include <servestack_absent_header.h>", "servestack_absent_header.h"),
    # Every header is there, but the code uses a type the image's cuda.h lacks: a headers-only build would pass.
    ("CUcontext ctx;", "CUcontext ctx; CUtensorMap servestack_map;", "CUtensorMap"),
])
def test_driver_c_the_image_cannot_compile_fails_with_the_compilers_words(
        fake_site, tmp_path: Path, original: str, changed: str, named: str) -> None:  # noqa: F811
    driver_c = DRIVER_C.replace(original, changed)
    assert driver_c != DRIVER_C
    check = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path, driver_c=driver_c)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "CalledProcessError" in check["detail"] and named in check["detail"]


@HAS_CC
def test_an_undefined_symbol_libcuda_does_not_provide_fails_naming_it(fake_site, tmp_path: Path) -> None:  # noqa: F811
    """Linking a shared object leaves it undefined and lazy binding imports it; the check lists what stays unresolved."""
    driver_c = DRIVER_C.replace("static PyObject *current_context", "extern int servestack_absent(void);\n"
                                "static PyObject *absent(PyObject *s, PyObject *a) { return PyLong_FromLong(servestack_absent()); }\n"
                                "static PyObject *current_context")
    driver_c = driver_c.replace('{"current_context", current_context', '{"absent", absent, METH_NOARGS, NULL},\n{"current_context", current_context')
    check = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path, driver_c=driver_c)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "1 undefined symbols are neither libcuda's nor in this interpreter: servestack_absent" in check["detail"]


def test_a_cpu_torch_never_starts_tritons_cuda_driver(fake_site, tmp_path: Path) -> None:  # noqa: F811
    checks = _checks(fake_site, tmp_path, None, [_triton(tmp_path)])
    assert not [name for name in checks if name.startswith("runtime-build:")]
