"""How smoke serves the made smoke model on an NVIDIA GPU: production's engine settings, each
engine's share of the GPU, and NIXL moving KV blocks and GDN state between GPU buffers.

A stack whose engine is vLLM's CUDA build and whose smoke model is made (`smoke_model.make`)
serves that model here whenever the host has GPUs; plan.py assembles the commands from these.
"""

from __future__ import annotations

from typing import Any

from servestack.smoke.engine_settings import QWEN35_ENV, QWEN35_FLAGS
from servestack.smoke.gpu import GpuHost

# Production's recipes (recipes/families/qwen35-gb200.yaml) run with CUDA graphs (no
# --enforce-eager) and async scheduling; the tiny model takes the rest of production's Qwen3.5
# settings from engine_settings.QWEN35_FLAGS (language model only, bfloat16 SSM cache, the hybrid KV
# cache manager, no prefix caching). bfloat16 weights: the made model has no NVFP4 checkpoint.
GPU_ENGINE_FLAGS: dict[str, Any] = {
    "max-model-len": 4096,
    "dtype": "bfloat16",
    "async-scheduling": True,
    **QWEN35_FLAGS,
}

# vLLM sizes its KV cache from what it measures free after a profiling run, unless told the bytes
# (`--kv-cache-memory-bytes`: vLLM 0.31 then skips the measurement, gpu_worker.py
# determine_available_memory). Two engines started together on one GPU measured each other: once the
# decode engine counted the prefill engine's allocation as its own and kept 0.7 GiB (0.34 M tokens;
# 11 M in another run). So every engine, aggregated or not, gets the same KV cache, in bytes: 4 GiB
# is about 2 M tokens of the made model, 8 times what the oracle's concurrency 32 at 4,096 tokens
# needs. The memory share stays: vLLM still refuses to start unless that fraction of the GPU is free
# (v1/worker/utils.py request_memory), and a third each fits both engines beside whatever else the GPU holds.
GPU_MEMORY_SHARE = 0.3
GPU_KV_CACHE_BYTES = 4 * 2**30

# The production connector (the recipes' kv-transfer-config) with the KV buffers on the GPU: NIXL
# registers the engines' GPU memory and moves KV blocks and GDN state between them directly.
GPU_KV_TRANSFER_CONFIG: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                          "kv_buffer_device": "cuda", "kv_load_failure_policy": "fail"}

# The CPU shape pins UCX to TCP (UCX_TLS=tcp,self); with GPU buffers UCX must be free to pick its
# CUDA transports (cuda_ipc between engines on one host, cuda_copy), as production leaves it.
CPU_ONLY_ENV = ("UCX_TLS",)

# vLLM's engine core and NCCL keep IPC buffers in /dev/shm; docker's default is 64 MiB.
GPU_SHM_SIZE = "8g"


def gpu_engine_flags() -> dict[str, Any]:
    return {**GPU_ENGINE_FLAGS, "gpu-memory-utilization": GPU_MEMORY_SHARE, "kv-cache-memory-bytes": GPU_KV_CACHE_BYTES}


def gpu_environment(disagg_env: dict[str, str] | None = None) -> dict[str, str]:
    """What a GPU engine's container adds to the image's environment: production's Qwen3.5
    variables, and for the disaggregated shape its loopback planes without the CPU-only ones."""
    extra = {k: v for k, v in (disagg_env or {}).items() if k not in CPU_ONLY_ENV}
    return {**QWEN35_ENV, **extra}


def placement(host: GpuHost) -> str:
    """Where the two engines of the disaggregated shape run, in words for the plan and the record."""
    if host.count > 1:
        return f"prefill on GPU {host.devices[0]}, decode on GPU {host.devices[1]} ({host.via})"
    return (f"prefill and decode share GPU {host.devices[0]} ({host.via}), a {GPU_KV_CACHE_BYTES / 2**30:g} GiB KV cache "
            f"each (vLLM refuses to start unless {GPU_MEMORY_SHARE:.0%} of its memory is free)")
