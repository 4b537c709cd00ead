"""What a GB200 node needs from the image beyond the wheels: each check of the GPU-node section, and
each failing once its piece is taken out.

The fixtures are small images in miniature, built here with the host's compiler: a libibverbs that
carries rdma-core's compiled-in provider path, a provider linked to it or to another copy, a
libnixl_capi that exports NIXL's C API. enroot's nvidia hook is the vendored one, run for real.
The qwen35-gb200 smoke runs the same checks in the real arm64 image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.lock import load_lock
from servestack.probe.static.gpu_caches import check_caches
from servestack.probe.static.gpu_kernels import check_kernels
from servestack.probe.static.gpu_node import check_cuda_compiler, check_cuda_release, check_verbs_providers, elf_dynamic
from servestack.smoke.nvidia_hook import check_nvidia_hook
from servestack.util.project import Project

GB200 = load_lock(Project(root=ROOT), "qwen35-gb200")
HAS_CC = pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler on this host")
VENDORED = pytest.mark.skipif(not os.environ.get("SERVESTACK_VENDOR"), reason="SERVESTACK_VENDOR is not set")


def image_env(drop: str | None = None) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(GB200.environment.items()) if k != drop]


# --------------------------------------------------------------------------- enroot's nvidia hook

@VENDORED
def test_enroot_nvidia_hook_asks_for_the_gpu_with_compute_and_utility():
    c = check_nvidia_hook(image_env(), GB200.gpu_node)
    assert c.status == "pass", c.detail
    assert "--device=all --compute --utility '--require=cuda>=13.0'" in c.detail


@VENDORED
@pytest.mark.parametrize("drop, missing", [
    ("NVIDIA_VISIBLE_DEVICES", "injected nothing"),
    ("NVIDIA_DRIVER_CAPABILITIES", "without --compute"),
    ("NVIDIA_REQUIRE_CUDA", "without --require=cuda>=13.0"),
])
def test_enroot_nvidia_hook_without_each_variable_fails(drop, missing):
    c = check_nvidia_hook(image_env(drop), GB200.gpu_node)
    assert c.status == "fail" and missing in c.detail, c.detail


def test_enroot_nvidia_hook_is_not_run_where_enroot_is_not_vendored(monkeypatch):
    monkeypatch.delenv("SERVESTACK_VENDOR", raising=False)
    c = check_nvidia_hook(image_env(), GB200.gpu_node)
    assert c.status == "not_run" and "SERVESTACK_VENDOR is not set" in c.detail, c.detail


# --------------------------------------------------------------------------- verbs providers

def _so(out: Path, source: str, *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    c = out.with_suffix(".c")
    c.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c), *flags], check=True)
    c.unlink()
    return out


def verbs_image(root: Path, *, provider_links_to_own: bool = True, driver_file: bool = True, provider: bool = True) -> dict:
    """A system libibverbs (Debian's provider path) and a wheel-bundled one (RHEL's), each with an mlx5 provider."""
    site = root / "site"
    system_dir = "usr/lib/x86_64-linux-gnu"
    copies = [(root / system_dir / "libibverbs.so.1", "libibverbs.so.1", f"/{system_dir}/libibverbs"),
              (site / "nixl_cu13.libs" / "libibverbs-f44649ea.so.1.14.48.0", "libibverbs-f44649ea.so.1.14.48.0",
               "/usr/lib64/libibverbs")]
    for path, soname, provider_dir in copies:
        _so(path, f'const char *where = "{provider_dir}/lib%s-rdmav34.so"; const char *conf = "/etc/libibverbs.d";\n'
                  'int verbs_register_driver_34(void) { return 0; }\n', f"-Wl,-soname,{soname}")
        if provider:
            target = path if provider_links_to_own else copies[0][0]
            _so(root / provider_dir.lstrip("/") / "libmlx5-rdmav34.so", "int verbs_register_driver_34(void);\n"
                "int mlx5_probe(void) { return verbs_register_driver_34(); }\n",
                str(target), f"-Wl,-rpath,{target.parent}")
    if driver_file:
        (root / "etc" / "libibverbs.d").mkdir(parents=True)
        (root / "etc" / "libibverbs.d" / "mlx5.driver").write_text("driver mlx5\n")
    return {"site_packages": str(site), "gpu_node": {"verbs_providers": ["mlx5"]}}


@HAS_CC
def test_every_libibverbs_copy_finds_an_mlx5_provider_that_registers_with_it(tmp_path):
    c = check_verbs_providers(verbs_image(tmp_path), str(tmp_path))
    assert c["status"] == "pass", c["detail"]
    assert "2 libibverbs copies" in c["detail"] and "/usr/lib64/libibverbs/lib{mlx5}-rdmav34.so" in c["detail"]


@HAS_CC
def test_without_the_providers_rdma_would_fall_back_to_tcp(tmp_path):
    c = check_verbs_providers(verbs_image(tmp_path, provider=False), str(tmp_path))
    assert c["status"] == "fail" and "looks for /usr/lib64/libibverbs/libmlx5-rdmav34.so, which is not in the image" in c["detail"]


@HAS_CC
def test_a_provider_linked_to_the_other_copy_is_refused(tmp_path):
    c = check_verbs_providers(verbs_image(tmp_path, provider_links_to_own=False), str(tmp_path))
    assert c["status"] == "fail" and "not with libibverbs-f44649ea.so.1.14.48.0 that loads it" in c["detail"], c["detail"]


@HAS_CC
def test_without_the_driver_file_no_copy_loads_the_provider(tmp_path):
    c = check_verbs_providers(verbs_image(tmp_path, driver_file=False), str(tmp_path))
    assert c["status"] == "fail" and "/etc/libibverbs.d/mlx5.driver is missing" in c["detail"]


@HAS_CC
def test_elf_dynamic_reads_soname_and_needed_like_readelf(tmp_path):
    lib = _so(tmp_path / "libx.so.1", "#include <math.h>\ndouble x(double v) { return cos(v); }\n",
              "-Wl,-soname,libx.so.1", "-Wl,--no-as-needed", "-lm")
    soname, needed = elf_dynamic(str(lib))
    assert soname == "libx.so.1" and "libm.so.6" in needed


# --------------------------------------------------------------------------- Dynamo's libnixl_capi

NIXL_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from servestack.probe.static.gpu_node import check_nixl_capi
print(json.dumps(check_nixl_capi({"site_packages": sys.argv[2]})))
"""


def _nixl_check(site: Path, library_path: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if library_path:
        env["LD_LIBRARY_PATH"] = library_path
    out = subprocess.run([sys.executable, "-c", NIXL_CHILD, str(ROOT / "src"), str(site)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@HAS_CC
def test_dynamo_resolves_libnixl_capi_by_bare_name_only_with_its_directory_on_the_loader_path(tmp_path):
    site = tmp_path / "site"
    (site / "dynamo").mkdir(parents=True)
    (site / "dynamo" / "_core.abi3.so").write_bytes(b"\x7fELF...\x00libnixl_capi.so\x00nixl error: not found\x00")
    libs = site / ".nixl_cu13.mesonpy.libs"
    _so(libs / "libnixl_capi.so", "int nixl_capi_create_configured_agent(void) { return 0; }\n")
    found = _nixl_check(site, str(libs))
    assert found["status"] == "pass" and str(libs / "libnixl_capi.so") in found["detail"], found
    missing = _nixl_check(site, None)
    assert missing["status"] == "fail" and "Dynamo then runs NIXL stubs" in missing["detail"], missing


# --------------------------------------------------------------------------- caches

def test_every_cache_location_must_be_writable_with_a_read_only_root(tmp_path):
    blocked = tmp_path / "ro"
    blocked.mkdir()
    os.chmod(blocked, 0o555)
    ok = (("writable", "", lambda: str(tmp_path / "cache" / "triton")),)
    assert check_caches({}, ok, root_read_only=lambda: True)["status"] == "pass"
    if os.geteuid() != 0:  # root writes anywhere: only the missing-home case below holds for it
        bad = check_caches({}, ok + (("home", "", lambda: str(blocked / "x")),), root_read_only=lambda: True)
        assert bad["status"] == "fail" and "home writes" in bad["detail"]
    unset = check_caches({}, (("flashinfer JIT", "", lambda: "/proc/servestack-no-such-home/.cache/flashinfer"),),
                         root_read_only=lambda: True)
    assert unset["status"] == "fail" and "flashinfer JIT writes /proc/servestack-no-such-home" in unset["detail"]


def test_the_cache_check_refuses_to_pass_on_a_writable_root():
    c = check_caches({}, (), root_read_only=lambda: False)
    assert c["status"] == "fail" and "the root is writable here" in c["detail"]


# --------------------------------------------------------------------------- compiler and kernels

def test_without_a_cuda_compiler_the_first_kernel_needs_the_network(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    c = check_cuda_compiler({"gpu_node": {"cuda_arch": "sm_100a"}})
    assert c["status"] == "fail" and "no nvcc" in c["detail"]


def cuda_home(tmp_path: Path, compiler: str, cudart_version: int) -> Path:
    """A CUDA_HOME in miniature: an nvcc that says its release, and the runtime's header."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "bin" / "nvcc").write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {compiler}, V{compiler}.37'\n")
    os.chmod(home / "bin" / "nvcc", 0o755)
    (home / "include" / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {cudart_version}\n")
    return home


def test_a_compiler_of_another_cuda_release_than_the_runtime_headers_fails_naming_both(tmp_path, monkeypatch):
    # What the H200 canary met: nvidia-cuda-nvcc 13.5 beside torch's nvidia-cuda-runtime 13.0, and
    # FlashInfer's sampler failing to compile at engine start.
    monkeypatch.setenv("CUDA_HOME", str(cuda_home(tmp_path, "13.5", 13000)))
    c = check_cuda_release({"gpu_node": {"cuda_arch": "sm_90a"}})
    assert c["status"] == "fail"
    assert "nvcc is CUDA 13.5 but its runtime headers are CUDA 13.0" in c["detail"] and "cuda-toolkit[nvcc] 13.0.*" in c["detail"]


def test_a_compiler_of_the_runtime_s_release_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(cuda_home(tmp_path, "13.0", 13000)))
    assert check_cuda_release({"gpu_node": {"cuda_arch": "sm_90a"}})["status"] == "pass"


def test_a_compiler_that_writes_no_cuda_binary_fails(tmp_path, monkeypatch):
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvcc").write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\nprintf "not a cubin" > "$2"\n')
    os.chmod(bin_dir / "nvcc", 0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    c = check_cuda_compiler({"gpu_node": {"cuda_arch": "sm_100a"}})
    assert c["status"] == "fail" and "not a CUDA ELF" in c["detail"]


def test_a_kernel_generator_the_stack_names_must_still_answer():
    c = check_kernels({"gpu_node": {"kernels": ["servestack.no_such_module:gen_module"]}})
    assert c["status"] == "fail" and "servestack.no_such_module:gen_module" in c["detail"]
    let_go = [{"package": name, "why": "index 'flashinfer' has no location here", "accepted_because": "JIT instead"}
              for name in ("flashinfer-cubin", "flashinfer-jit-cache")]
    listed = check_kernels({"gpu_node": {"kernels": []}, "unavailable": let_go})
    assert listed["status"] == "pass" and "flashinfer-cubin: not installed (unavailable when locked" in listed["detail"]
    assert "downloaded at first start: fused_moe_trtllm_sm100" in listed["detail"]


def test_prebuilt_kernels_missing_without_the_lock_accepting_it_fail_the_kernel_check():
    """This test's interpreter has neither FlashInfer wheel: as an image built from a lock that did
    not record them unavailable would be."""
    c = check_kernels({"gpu_node": {"kernels": []}, "unavailable": [
        {"package": "flashinfer-jit-cache", "why": "no location", "accepted_because": "JIT instead"}]})
    assert c["status"] == "fail" and c["detail"].startswith("flashinfer-cubin not installed")
    assert "if_unavailable" in c["detail"]
