"""The static probe builds, in the image, what Triton builds at its first GPU kernel launch.

The site holds a stand-in Triton laid out like the real one (runtime/build.py with
compile_module_from_src, backends/nvidia/driver.py with include_dirs, driver.c, include/cuda.h)
whose helper follows Triton's rule ($CC, else gcc, else clang; the interpreter's include
directory; a shared object imported as a module), so the host's real compiler and Python.h do the
build. The qwen35-gb200 smoke runs the same check with the real Triton in the arm64 image.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from test_probe_evidence import _site_with_torch
from test_smoke import _probe, _wheel, fake_site  # noqa: F401 - the module-scoped fixture

BUILD = '''import importlib.util, os, shutil, subprocess, sysconfig
from . import cache_dir


def compile_module_from_src(src, name, library_dirs=None, include_dirs=None, libraries=None, ccflags=None):
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    base = os.path.join(cache_dir(), name)
    with open(base + ".c", "w") as f:
        f.write(src)
    so = base + sysconfig.get_config_var("EXT_SUFFIX")
    includes = [f"-I{d}" for d in [*(include_dirs or []), sysconfig.get_paths()["include"]]]
    subprocess.check_call([cc, base + ".c", "-O0", "-shared", "-fPIC", "-o", so, *includes], stdout=subprocess.DEVNULL)
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
'''

DRIVER = '''import os
include_dirs = [os.path.join(os.path.dirname(os.path.realpath(__file__)), "include")]
'''

DRIVER_C = '#include "cuda.h"\n#include <stdio.h>\n#include <Python.h>\n\nint unrelated(void) { return 0; }\n'


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
        f"{package}/backends/nvidia/include/cuda.h": "typedef unsigned long long CUdeviceptr;\n",
    })


def _checks(fake_site: dict, tmp: Path, cuda: str | None, wheels: list[Path]) -> dict[str, dict]:
    site = _site_with_torch(tmp, cuda, wheels)
    return _probe(tmp, {**fake_site["config"], "site_packages": str(site), "modules": [], "wheels": [],
                        "pull_requests": [], "excluded": []})


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="no C compiler on this host")
def test_each_installed_triton_builds_its_launcher_with_the_image_compiler(fake_site, tmp_path: Path) -> None:  # noqa: F811
    checks = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path), _triton(tmp_path, "tokenspeed-triton")])
    for name, package in (("triton", "triton"), ("tokenspeed-triton", "tokenspeed_triton")):
        check = checks[f"runtime-build:{name}"]
        assert check["status"] == "pass", check
        assert f"{name} 3.7.1 compiles its CUDA launcher at the first kernel launch on a GPU" in check["detail"]
        assert f"{package}.runtime.build.compile_module_from_src built and imported" in check["detail"]
        assert "sizeof(CUdeviceptr) = 8" in check["detail"]  # cuda.h from the driver's include_dirs was used


def test_no_compiler_fails_with_what_the_image_needs(fake_site, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    check = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "no-such-cc" in check["detail"]
    assert "needs a C compiler (Debian: gcc), libc headers (libc6-dev)" in check["detail"]


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="no C compiler on this host")
def test_a_header_the_driver_includes_and_the_image_lacks_fails_with_the_compilers_words(fake_site, tmp_path: Path) -> None:  # noqa: F811
    driver_c = DRIVER_C.replace("#include <stdio.h>", "#include <servestack_absent_header.h>")
    check = _checks(fake_site, tmp_path, "13.0", [_triton(tmp_path, driver_c=driver_c)])["runtime-build:triton"]
    assert check["status"] == "fail"
    assert "CalledProcessError" in check["detail"] and "servestack_absent_header.h" in check["detail"]


def test_a_cpu_torch_never_starts_tritons_cuda_driver(fake_site, tmp_path: Path) -> None:  # noqa: F811
    checks = _checks(fake_site, tmp_path, None, [_triton(tmp_path)])
    assert not [name for name in checks if name.startswith("runtime-build:")]
