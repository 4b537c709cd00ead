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

ALWAYS_COMPILED = ("Triton kernels (vLLM's GDN, causal_conv1d and fused ops; cached in TRITON_CACHE_DIR)",
                   "CuTe DSL kernels (FlashInfer's Blackwell GDN prefill; compiled by the CUTLASS DSL at first call)",
                   "torch.compile graphs (vLLM's compilation; cached in VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR)")


def _prebuilt(spec) -> bool | None:
    for name in ("is_aot", "is_compiled"):
        value = getattr(spec, name, None)
        if isinstance(value, bool):
            return value
    return None


def check_kernels(config: dict) -> dict:
    named = (config.get("gpu_node") or {}).get("kernels") or []
    wheels = {name: importlib.util.find_spec(module) is not None
              for name, module in (("flashinfer-cubin", "flashinfer_cubin"), ("flashinfer-jit-cache", "flashinfer_jit_cache"))}
    compiled, prebuilt, problems = [], [], []
    for entry in named:
        module, _, function = entry.partition(":")
        try:
            spec = getattr(importlib.import_module(module), function)()
        except Exception as e:  # noqa: BLE001 - a generator the stack names must still exist and answer
            problems.append(f"{entry}: {type(e).__name__}: {e}")
            continue
        label = f"{getattr(spec, 'name', entry)} ({entry})"
        (prebuilt if _prebuilt(spec) else compiled).append(label)
    if problems:
        return check("gpu-node:kernels", FAIL, "the stack's gpu_node.kernels no longer answer: " + "; ".join(problems))
    lines = [f"{name}: {'installed' if present else 'not installed'}" for name, present in wheels.items()]
    if not wheels["flashinfer-cubin"]:
        lines.append("trtllm-gen cubins (NVFP4 MoE, trtllm attention) are downloaded from FlashInfer's artifact "
                     "server at first use: an offline node needs flashinfer-cubin or a pre-filled FLASHINFER_CUBIN_DIR")
    lines += [f"prebuilt: {p}" for p in prebuilt]
    lines += [f"compiled with nvcc at first start: {c}" for c in compiled]
    lines += [f"compiled at first start: {a}" for a in ALWAYS_COMPILED]
    return check("gpu-node:kernels", PASS, "\n".join(lines))
