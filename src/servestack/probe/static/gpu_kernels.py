"""Which kernels a GPU node still compiles (or downloads) at its first start, from the image itself.

FlashInfer ships its kernels three ways: AOT-built modules (the flashinfer-jit-cache wheel),
trtllm-gen cubins (the flashinfer-cubin wheel, else downloaded from NVIDIA's artifact server at first
use), and JIT modules compiled with nvcc at first use. The stack names the FlashInfer modules its
recipes reach (`gpu_node.kernels`, "module:generator"); each generator is asked for its JitSpec and
the spec whether it is prebuilt. Triton kernels, CuTe DSL kernels and torch.compile graphs are always
compiled at first start; they are listed so the first job's start-up is not a surprise.
"""

from __future__ import annotations

import importlib
import importlib.util

from .report import FAIL, PASS, check

# vLLM 0.31 on SM100 with the recipes' flags (DP with expert parallelism, NVFP4): FlashInfer 0.7's
# trtllm-gen modules, whose generators download from FlashInfer's artifact server when called.
TRTLLM_GEN = ("fused_moe_trtllm_sm100 (the NVFP4 MoE experts, flashinfer.jit.fused_moe:"
              "gen_trtllm_gen_fused_moe_sm100_module) and fmha_gen (full-attention prefill and decode, "
              "flashinfer.jit.attention.modules:gen_trtllm_gen_fmha_module)")
ALWAYS_COMPILED = ("Triton kernels (vLLM's GDN, causal_conv1d and fused ops; cached in TRITON_CACHE_DIR)",
                   "CuTe DSL kernels (FlashInfer's Blackwell GDN prefill and its NVFP4 GEMM, mm_fp4 cute-dsl; "
                   "compiled by the CUTLASS DSL at first call)",
                   "torch.compile graphs (vLLM's compilation; cached in VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR)")


def _prebuilt(spec: object) -> bool | None:
    for name in ("is_aot", "is_compiled"):
        value = getattr(spec, name, None)
        if isinstance(value, bool):
            return value
    return None


def check_flashinfer_path(config: dict) -> dict:
    """vLLM takes FlashInfer's kernels (the TRT-LLM NVFP4 MoE, the CuTe DSL NVFP4 GEMM) only where it
    counts FlashInfer as present: flashinfer-cubin installed, or nvcc on PATH to JIT-compile with.
    Otherwise it takes its own CUTLASS kernels, without a word: not the path the recipes were measured on."""
    import shutil

    try:
        from vllm.utils.flashinfer import has_flashinfer, has_flashinfer_cubin
    except Exception as e:
        return check("gpu-node:flashinfer-path", FAIL, f"cannot ask vLLM whether it uses FlashInfer: {type(e).__name__}: {e}")
    if not has_flashinfer():
        return check("gpu-node:flashinfer-path", FAIL,
                     "vLLM counts FlashInfer as absent (no flashinfer-cubin and no nvcc on PATH): it would serve the "
                     "NVFP4 MoE experts and linear layers with its own CUTLASS kernels, not FlashInfer's")
    how = "flashinfer-cubin installed" if has_flashinfer_cubin() else f"nvcc on PATH ({shutil.which('nvcc')})"
    return check("gpu-node:flashinfer-path", PASS, f"vLLM takes FlashInfer's kernels: {how}")


def check_kernels(config: dict) -> dict:
    named = (config.get("gpu_node") or {}).get("kernels") or []
    wheels = {name: importlib.util.find_spec(module) is not None
              for name, module in (("flashinfer-cubin", "flashinfer_cubin"), ("flashinfer-jit-cache", "flashinfer_jit_cache"))}
    compiled: list[str] = []
    prebuilt: list[str] = []
    problems: list[str] = []
    for entry in named:
        module, _, function = entry.partition(":")
        try:
            spec = getattr(importlib.import_module(module), function)()
        except Exception as e:
            problems.append(f"{entry}: {type(e).__name__}: {e}")
            continue
        label = f"{getattr(spec, 'name', entry)} ({entry})"
        (prebuilt if _prebuilt(spec) else compiled).append(label)
    if problems:
        return check("gpu-node:kernels", FAIL, "the stack's gpu_node.kernels no longer answer: " + "; ".join(problems))
    let_go = {u["package"]: u for u in config.get("unavailable") or []}
    missing = [name for name, present in wheels.items() if not present and name not in let_go]
    if missing:
        return check("gpu-node:kernels", FAIL, f"{' and '.join(missing)} not installed, and the lock does not record "
                                                "them as unavailable with the stack's reason (pins/<stack>.yaml "
                                                "packages[].if_unavailable): FlashInfer's pre-built kernels are missing")
    lines = [f"{name}: installed" if present else
             f"{name}: not installed (unavailable when locked: {let_go[name]['why'][:120]})"
             for name, present in wheels.items()]
    if not wheels["flashinfer-cubin"]:
        lines.append(f"downloaded at first start: {TRTLLM_GEN} fetch their headers and cubins from FlashInfer's "
                     "artifact server (FLASHINFER_CUBINS_REPOSITORY) into FLASHINFER_CUBIN_DIR; offline, the MoE "
                     "fails at warm-up and attention falls back to FlashInfer's FA2 modules, compiled with nvcc; "
                     "an offline node needs flashinfer-cubin or a pre-filled FLASHINFER_CUBIN_DIR")
    lines += [f"prebuilt: {p}" for p in prebuilt]
    lines += [f"compiled with nvcc at first start: {c}" for c in compiled]
    lines += [f"compiled at first start: {a}" for a in ALWAYS_COMPILED]
    return check("gpu-node:kernels", PASS, "\n".join(lines))
