"""What a GPU node would refuse, named on a CPU: the kernel vLLM picks against the model's shapes,
the native libraries' undefined symbols against what the image carries, and the serving entry
points' module-level imports against what is installed.

The kernels are judged from facts (vLLM's resolver, FlashInfer's guards, the attention backends'
head sizes); here the facts are those recorded from vLLM 0.31.0 and FlashInfer 0.7.0.post1, as
the probe uses them in an image that lacks a module. The ELF fixtures are built with the host's
compiler; the site-packages fixtures are a few files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servestack.probe.static.elfclosure import Closure, Loader, check_native_closure
from servestack.probe.static.import_closure import check_import_closure, unresolved_imports
from servestack.probe.static.kernel_shapes import GDN_GUARDS, Shapes, check_model, read_guard, recorded_facts

HAS_CC = pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler on this host")


def tiny_hybrid(dim: int) -> Shapes:
    config = {"head_dim": dim, "num_attention_heads": 4, "linear_key_head_dim": dim, "linear_value_head_dim": dim}
    return Shapes.from_config(model=f"tiny-{dim}", source="config.json", config=config)


def by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in checks}


# --------------------------------------------------------------------------- kernels against shapes

def test_a_64_dim_gdn_model_fails_on_sm90_naming_the_kernel_the_shape_and_the_flag(tmp_path):
    checks = by_name(check_model(tiny_hybrid(64), recorded_facts(str(tmp_path))))
    hopper = checks["kernels:gdn-prefill:SM90:tiny-64"]
    assert hopper["status"] == "fail"
    assert "FlashInfer's SM90 GDN prefill" in hopper["detail"] and "linear_key_head_dim 64" in hopper["detail"]
    assert "requires 128" in hopper["detail"] and "--gdn-prefill-backend triton" in hopper["detail"]
    # On SM100 vLLM itself steers a 64-dim model to Triton, which has no head-size guard.
    blackwell = checks["kernels:gdn-prefill:SM100:tiny-64"]
    assert blackwell["status"] == "pass" and "picks triton" in blackwell["detail"]


def test_a_128_dim_gdn_model_passes_on_sm90_and_sm100(tmp_path):
    checks = check_model(tiny_hybrid(128), recorded_facts(str(tmp_path)))
    assert [c["status"] for c in checks] == ["pass"] * 4, checks


# Qwen/Qwen3.5-397B-A17B's config.json (text_config), which the NVFP4 quantization keeps. Recorded
# in the production stack (smoke_model.config) with its next relock, which rebuilds its image.
PRODUCTION_SHAPES = {"head_dim": 256, "num_attention_heads": 32, "num_key_value_heads": 2, "linear_key_head_dim": 128,
                     "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 64,
                     "source": "Qwen/Qwen3.5-397B-A17B config.json (text_config)"}


def test_production_s_shapes_reach_flashinfer_on_both_gpus():
    recorded = PRODUCTION_SHAPES
    shapes = Shapes.from_config(model="Qwen3.5-397B-A17B", source=recorded["source"], config=recorded)
    checks = by_name(check_model(shapes, recorded_facts("/nonexistent")))
    assert all(c["status"] == "pass" for c in checks.values()), checks
    assert "FLASHINFER accepts head_dim 256 on SM100" in checks["kernels:attention:SM100:Qwen3.5-397B-A17B"]["detail"]


def test_the_guard_is_read_from_the_installed_kernel_source(tmp_path):
    """An image whose FlashInfer requires 96 is judged by its own source, not by the recorded 128."""
    source = GDN_GUARDS[9]
    kernel = tmp_path / source.path
    kernel.parent.mkdir(parents=True)
    kernel.write_text(f"def {source.function}(o, q):\n    D = q.shape[-1]\n"
                      "    if D != 96:\n        raise RuntimeError(f\"DSL kernel only supports D=96, got {D}\")\n")
    guard = read_guard(source, str(tmp_path))
    assert guard.required == 96 and guard.where.endswith(":3 `if D != 96:`")
    checks = by_name(check_model(tiny_hybrid(128), recorded_facts(str(tmp_path))))
    assert checks["kernels:gdn-prefill:SM90:tiny-128"]["status"] == "fail"


def test_without_the_kernel_module_the_recorded_guard_names_its_release(tmp_path):
    guard = read_guard(GDN_GUARDS[9], str(tmp_path))
    assert guard.required == 128 and "recorded from flashinfer-python 0.7.0.post1" in guard.where


def test_an_attention_head_size_the_preferred_backend_refuses_fails_naming_the_fallback(tmp_path):
    checks = by_name(check_model(tiny_hybrid(72), recorded_facts(str(tmp_path))))
    blackwell = checks["kernels:attention:SM100:tiny-72"]
    assert blackwell["status"] == "fail" and "FLASHINFER" in blackwell["detail"] and "take FLASH_ATTN" in blackwell["detail"]


# --------------------------------------------------------------------------- the native-library closure

def build(out: Path, source: str, *flags: str) -> Path:
    c = out.with_suffix(".c")
    c.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c), *flags], check=True)
    return out


def nccl_image(tmp_path: Path, *, provider_has_suspend: bool) -> Path:
    """A torch that calls ncclCommSuspend, and the NCCL the image carries (with or without it)."""
    site = tmp_path / "site"
    nccl, torch = site / "nvidia" / "nccl" / "lib", site / "torch" / "lib"
    nccl.mkdir(parents=True)
    torch.mkdir(parents=True)
    suspend = "int ncclCommSuspend(void *c) { return 0; }\n" if provider_has_suspend else ""
    build(nccl / "libnccl.so.2", "int ncclCommInitRank(void) { return 0; }\n" + suspend, "-Wl,-soname,libnccl.so.2")
    build(torch / "libtorch_cuda.so",
          "int ncclCommInitRank(void); int ncclCommSuspend(void *);\n"
          "int start(void) { return ncclCommInitRank() + ncclCommSuspend(0); }\n",
          f"-L{nccl}", "-l:libnccl.so.2", "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib", "-Wl,--allow-shlib-undefined")
    return site


@HAS_CC
def test_a_library_whose_provider_lacks_a_symbol_fails_naming_the_symbol_and_both_libraries(tmp_path):
    site = nccl_image(tmp_path, provider_has_suspend=False)
    (result,) = check_native_closure({"site_packages": str(site), "native_closure": {"libraries": {"torch": ["torch/lib/*.so*"]}}})
    assert result["status"] == "fail", result
    assert "torch/lib/libtorch_cuda.so: ncclCommSuspend (expected from libnccl.so.2)" in result["detail"]


@HAS_CC
def test_the_same_library_passes_with_a_provider_that_defines_it(tmp_path):
    site = nccl_image(tmp_path, provider_has_suspend=True)
    (result,) = check_native_closure({"site_packages": str(site), "native_closure": {"libraries": {"torch": ["torch/lib/*.so*"]}}})
    assert result["status"] == "pass", result


@HAS_CC
def test_a_needed_library_the_image_lacks_fails_naming_it(tmp_path):
    site = nccl_image(tmp_path, provider_has_suspend=True)
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").unlink()
    (result,) = check_native_closure({"site_packages": str(site), "native_closure": {"libraries": {"torch": ["torch/lib/*.so*"]}}})
    assert result["status"] == "fail", result
    assert "torch/lib/libtorch_cuda.so: the library libnccl.so.2, " in result["detail"], result
    assert "(expected from nowhere on the loader's path)" in result["detail"], result


@HAS_CC
def test_an_optional_plugin_or_another_python_s_extension_that_cannot_load_is_named_not_failed(tmp_path):
    site = tmp_path / "site" / "nixl"
    site.mkdir(parents=True)
    needs_doca = "int doca_open(void); int go(void) { return doca_open(); }\n"
    build(site / "libplugin_GPUNETIO.so", needs_doca, "-Wl,--allow-shlib-undefined")
    build(site / "_bindings.cpython-314-x86_64-linux-gnu.so", needs_doca, "-Wl,--allow-shlib-undefined")
    build(site / "libplugin_UCX.so", "int ucx(void) { return 0; }\n")
    spec = {"libraries": {"nixl": ["nixl/*.so"]}, "plugins": {"optional": ["libplugin_[!U]*.so", "libplugin_U[!C]*.so"]}}
    (result,) = check_native_closure({"site_packages": str(tmp_path / "site"), "native_closure": spec})
    assert result["status"] == "pass", result
    assert "optional plugins that cannot load here, lacking their own libraries: libplugin_GPUNETIO.so" in result["detail"]
    build(site / "libplugin_UCX.so", needs_doca, "-Wl,--allow-shlib-undefined")  # the plugin serving loads
    (result,) = check_native_closure({"site_packages": str(tmp_path / "site"), "native_closure": spec})
    assert result["status"] == "fail" and "nixl/libplugin_UCX.so: doca_open" in result["detail"], result


@HAS_CC
def test_a_flashinfer_module_resolves_tvm_ffi_s_symbols_in_what_import_tvm_ffi_loaded(tmp_path):
    site = tmp_path / "site"
    (site / "tvm_ffi" / "lib").mkdir(parents=True)
    (site / "flashinfer" / "data" / "aot" / "sampling").mkdir(parents=True)
    module = build(site / "flashinfer" / "data" / "aot" / "sampling" / "sampling.so",
                   "int TVMFFIErrorSetRaised(void *e); int go(void) { return TVMFFIErrorSetRaised(0); }\n",
                   "-Wl,--allow-shlib-undefined")
    config = {"site_packages": str(site), "native_closure": {"libraries": {"flashinfer": ["flashinfer/**/*.so"]}}}
    (result,) = check_native_closure(config)
    assert result["status"] == "fail" and "TVMFFIErrorSetRaised" in result["detail"], result
    build(site / "tvm_ffi" / "lib" / "libtvm_ffi.so", "int TVMFFIErrorSetRaised(void *e) { return 0; }\n")
    (result,) = check_native_closure(config)
    assert result["status"] == "pass" and module.exists(), result


@HAS_CC
def test_the_driver_s_libcuda_is_exempt_and_said_so(tmp_path):
    driver = tmp_path / "driver"
    driver.mkdir()
    build(driver / "libcuda.so.1", "int cuInit(unsigned f) { return 0; }\n", "-Wl,-soname,libcuda.so.1")
    site = tmp_path / "site" / "vllm"
    site.mkdir(parents=True)
    build(site / "_C.so", "int cuInit(unsigned); int go(void) { return cuInit(0); }\n", f"-L{driver}", "-l:libcuda.so.1")
    (result,) = check_native_closure({"site_packages": str(tmp_path / "site"),
                                      "native_closure": {"libraries": {"vllm": ["vllm/*.so"]}}})
    assert result["status"] == "pass" and "libcuda.so.1 brought by the node's NVIDIA driver" in result["detail"], result


@HAS_CC
def test_a_versioned_symbol_must_exist_at_that_version(tmp_path):
    """glibc's memcpy@GLIBC_2.14 resolves in the host's libc; a version no libc defines does not."""
    lib = build(tmp_path / "libuses.so", "#include <string.h>\nvoid *copy(void *d, const void *s) { return memcpy(d, s, 4); }\n")
    closure = Closure(Loader(library_path=(), standard=("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                                                          "/lib/aarch64-linux-gnu", "/lib64", "/usr/lib")))
    missing, _ = closure.missing(str(lib))
    assert missing == []


# --------------------------------------------------------------------------- the import closure

def serving_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "dynamo" / "vllm").mkdir(parents=True)
    (site / "dynamo" / "__init__.py").write_text("")
    (site / "dynamo" / "vllm" / "__init__.py").write_text("from .main import run\n")
    (site / "dynamo" / "vllm" / "main.py").write_text(
        "import json\nimport redis\n\ntry:\n    import planner_only\nexcept ImportError:\n    planner_only = None\n\n"
        "def run():\n    import loaded_later\n")
    return site


def only_site(site: Path):
    return lambda top: (site / top).exists() or (site / f"{top}.py").exists() or top in sys.stdlib_module_names


def test_a_module_level_import_that_is_not_installed_fails_naming_it_and_who_imports_it(tmp_path):
    site = serving_site(tmp_path)
    missing, _ = unresolved_imports(["dynamo.vllm"], str(site), only_site(site))
    # Guarded and function-level imports are the package's own business; `redis` is not.
    assert [(m.module, m.imported_by) for m in missing] == [("redis", "dynamo/vllm/main.py:2")]
    (result,) = check_import_closure({"site_packages": str(site), "import_closure": ["dynamo.vllm"]}, only_site(site))
    assert result["status"] == "fail" and "redis (by dynamo/vllm/main.py:2)" in result["detail"]


def test_installing_it_closes_the_closure(tmp_path):
    site = serving_site(tmp_path)
    (site / "redis").mkdir()
    (site / "redis" / "__init__.py").write_text("from .client import Redis\n")
    (site / "redis" / "client.py").write_text("class Redis: ...\n")
    (result,) = check_import_closure({"site_packages": str(site), "import_closure": ["dynamo.vllm"]}, only_site(site))
    assert result["status"] == "pass", result
