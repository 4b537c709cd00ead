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

from fixtures.fake_site import DRIVER_C, probe, site_with_torch, triton

HAS_CC = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="no C compiler on this host")


def _checks(fake_site: dict, tmp: Path, cuda: str | None, wheels: list[Path]) -> dict[str, dict]:
    site = site_with_torch(tmp, cuda, wheels)
    return probe(tmp, {**fake_site["config"], "site_packages": str(site), "modules": [], "wheels": [],
                       "pull_requests": [], "excluded": []})


@HAS_CC
def test_each_installed_triton_builds_its_whole_driver_c_as_cuda_utils_does(fake_site, tmp_path: Path) -> None:
    checks = _checks(fake_site, tmp_path, "13.0", [triton(tmp_path), triton(tmp_path, "tokenspeed-triton")])
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


def test_no_compiler_fails_with_what_the_image_needs(fake_site, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    check = _checks(fake_site, tmp_path, "13.0", [triton(tmp_path)])["runtime-build:triton"]
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
        fake_site, tmp_path: Path, original: str, changed: str, named: str) -> None:
    driver_c = DRIVER_C.replace(original, changed)
    assert driver_c != DRIVER_C
    check = _checks(fake_site, tmp_path, "13.0", [triton(tmp_path, driver_c=driver_c)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "CalledProcessError" in check["detail"] and named in check["detail"]


@HAS_CC
def test_an_undefined_symbol_libcuda_does_not_provide_fails_naming_it(fake_site, tmp_path: Path) -> None:
    """Linking a shared object leaves it undefined and lazy binding imports it; the check lists what stays unresolved."""
    driver_c = DRIVER_C.replace("static PyObject *current_context", "extern int servestack_absent(void);\n"
                                "static PyObject *absent(PyObject *s, PyObject *a) { return PyLong_FromLong(servestack_absent()); }\n"
                                "static PyObject *current_context")
    driver_c = driver_c.replace('{"current_context", current_context',
                                '{"absent", absent, METH_NOARGS, NULL},\n{"current_context", current_context')
    check = _checks(fake_site, tmp_path, "13.0", [triton(tmp_path, driver_c=driver_c)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "1 undefined symbols are neither libcuda's nor in this interpreter: servestack_absent" in check["detail"]


def test_a_cpu_torch_never_starts_tritons_cuda_driver(fake_site, tmp_path: Path) -> None:
    checks = _checks(fake_site, tmp_path, None, [triton(tmp_path)])
    assert not [name for name in checks if name.startswith("runtime-build:")]
