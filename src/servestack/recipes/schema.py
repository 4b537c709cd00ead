"""The keys an srt-slurm recipe may have, and their types.

Written from srt-slurm's own recipe classes (srtctl.core.schema, srtctl.backends.*; NVIDIA/srt-slurm
at c88ef73) for the v1 layout, and from its published schema reference for the 2.0 (`schema: 2`)
layout. A value is either a leaf type name or a dict of sub-keys. Leaf types:

  str, int, bool, num (int or float), strmap (mapping of names to scalars: environments),
  map (any mapping), list, strlist, any, scalar, str|int, bool|map, str|map, concurrencies,
  nodes (int or "colocate").
"""

from __future__ import annotations

from typing import Any

MODEL = {"path": "str", "container": "str", "precision": "str", "stage_dir": "str"}

RESOURCES_V1 = {
    "gpu_type": "str",
    "gpus_per_node": "int",
    "prefill_nodes": "int",
    "decode_nodes": "int",
    "prefill_workers": "int",
    "decode_workers": "int",
    "agg_nodes": "int",
    "agg_workers": "int",
    "spread_workers": "bool",
    "het_jobs": "bool",
    "gpus_per_prefill": "int",
    "gpus_per_decode": "int",
    "gpus_per_agg": "int",
}

# A v1 recipe is disaggregated (separate prefill and decode workers behind Dynamo's frontend) when
# its resources name prefill or decode nodes, as srt-slurm decides it; else aggregated.
DISAGGREGATED_KEYS = ("prefill_nodes", "decode_nodes")


def deployment_shape(resources: Any) -> str:
    """'disaggregated' or 'aggregated' for a v1 recipe's resources block (a mapping of any values)."""
    if isinstance(resources, dict) and any(resources.get(k) is not None for k in DISAGGREGATED_KEYS):
        return "disaggregated"
    return "aggregated"


SLURM = {"account": "str", "partition": "str", "time_limit": "str"}

SWEEP = {"mode": "str", "parameters": "map"}

BENCHMARK = {
    "type": "str",
    "isl": "int",
    "osl": "int",
    "concurrencies": "concurrencies",
    "req_rate": "str|int",
    "client_placement": "str",
    "client_dedicated_node": "bool",
    "colocate_with_frontend": "bool",
    "sweep": SWEEP,
    "num_examples": "int",
    "max_tokens": "int",
    "repeat": "int",
    "num_threads": "int",
    "max_context_length": "int",
    "categories": "strlist",
    "num_shots": "int",
    "temperature": "num",
    "top_p": "num",
    "top_k": "int",
    "num_requests": "int",
    "concurrency": "int",
    "prefix_ratios": "any",
    "mooncake_workload": "str",
    "ttft_threshold_ms": "int",
    "itl_threshold_ms": "int",
    "random_range_ratio": "num",
    "num_prompts_mult": "int",
    "num_warmup_mult": "int",
    "dataset_name": "str",
    "dataset_path": "str",
    "trace_file": "str",
    "custom_tokenizer": "str",
    "use_chat_template": "bool",
    "reuse_http_connections": "bool",
    "command": "str",
    "container_image": "str",
    "env": "strmap",
    "aiperf_package": "str",
    "aiperf_args": "map",
    "export_node_metrics": "bool",
    "slow_down_sleep_time": "num",
    "slow_down_wait_time": "num",
}

_PHASE = {"start_step": "int", "stop_step": "int"}
PROFILING = {
    "type": "str",
    "extra_nsys_args": "strlist",
    "prefill": _PHASE,
    "decode": _PHASE,
    "aggregated": _PHASE,
    "delay_secs": "int",
    "duration_secs": "int",
    "benchmark_duration_secs": "int",
}

_EXPORTER = {"container_image": "str", "port": "int", "command": "str"}
OBSERVABILITY = {
    "enabled": "bool",
    "enable_otel": "bool",
    "otel_endpoint": "str",
    "scrape_metrics": "bool",
    "scrape_interval_seconds": "num",
    "scrape_output": "str",
    "build_dashboard": "bool",
    "tachometer": {
        "enabled": "bool",
        "binary_path": "str",
        "default_frequency": "num",
        "sync_interval_secs": "int",
        "compaction_threads": "int",
        "storage_subdir": "str",
        "extra_metadata": "strmap",
        "dcgm_exporter": _EXPORTER,
        "node_exporter": _EXPORTER,
    },
}
TELEMETRY = {
    "enabled": "bool",
    "dcgm_exporter": _EXPORTER,
    "default_frequency": "num",
    "storage_subdir": "str",
    "required": "bool",
    "startup_timeout_seconds": "num",
    "request_timeout_seconds": "num",
    "collector_join_timeout_seconds": "num",
}

DYNAMO_V1 = {
    "install": "bool",
    "version": "str",
    "hash": "str",
    "top_of_tree": "bool",
    "wheel": "str",
    "request_plane": "str",
    "event_plane": "str",
    "cargo_patches": "strlist",
}

FRONTEND_V1 = {
    "type": "str",
    "enable_multiple_frontends": "bool",
    "num_additional_frontends": "int",
    "nginx_container": "str",
    "nginx_raise_ulimit": "bool",
    "nginx_session_affinity": "bool",
    "nginx_session_affinity_header": "str",
    "nginx_keepalive_timeout": "str",
    "args": "map",
    "env": "strmap",
    "ctx_router": "map",
    "gen_router": "map",
    "server_config_extra": "map",
    "orchestrator_placement": "str",
    "dedicated_node": "bool",
}

IDENTITY = {
    "model": {"repo": "str", "revision": "str"},
    "container": {"image": "str"},
    "frameworks": "strmap",
}

REPORTING = "map"

_ENVS = {"prefill_environment": "strmap", "decode_environment": "strmap", "aggregated_environment": "strmap"}
_MODES = {"prefill": "map", "decode": "map", "aggregated": "map"}

BACKENDS_V1: dict[str, dict] = {
    "vllm": {
        "type": "str",
        **_ENVS,
        "vllm_config": _MODES,
        "set_cuda_visible_devices": "bool",
        "connector": "str",
        "mooncake_kv_store": {"container": "str", "env": "strmap", "master_extra_args": "strlist", "store_config": "map"},
        "kv_events_config": "bool|map",
        "allow_prefill_decode_colocation": "bool",
        "allow_prefill_decode_colocation_across_nodes": "bool",
        "dp_launch_mode": "str",
    },
    "sglang": {
        "type": "str",
        "gpu_type": "str",
        **_ENVS,
        "sglang_config": _MODES,
        "kv_events_config": "bool|map",
        "mooncake_kv_store": {"container": "str", "env": "strmap", "master_extra_args": "strlist"},
    },
    "trtllm": {
        "type": "str",
        **_ENVS,
        "trtllm_config": _MODES,
        "publish_events_and_metrics": "bool",
        "sequential_node_start": "int",
        "numa_memory_bind": "bool",
    },
    "mocker": {
        "type": "str",
        "engine_type": "str",
        "speedup_ratio": "num",
        "decode_speedup_ratio": "num",
        "num_gpu_blocks_override": "int",
        "max_num_seqs": "int",
        "max_num_batched_tokens": "int",
        "block_size": "int",
        "data_parallel_size": "int",
        "num_workers": "int",
        "startup_time": "num",
        "kv_transfer_bandwidth": "num",
        "kv_cache_dtype": "str",
        "enable_prefix_caching": "bool",
        "enable_chunked_prefill": "bool",
        "preemption_mode": "str",
        **_ENVS,
        "mocker_config": _MODES,
    },
}
ENGINE_CONFIG_KEY = {"vllm": "vllm_config", "sglang": "sglang_config", "trtllm": "trtllm_config", "mocker": "mocker_config"}

_COMMON_TOP = {
    "name": "str",
    "model": MODEL,
    "slurm": SLURM,
    "benchmark": BENCHMARK,
    "profiling": PROFILING,
    "output": {"log_dir": "str"},
    "health_check": {"max_attempts": "int", "interval_seconds": "int"},
    "observability": OBSERVABILITY,
    "telemetry": TELEMETRY,
    "environment": "strmap",
    "container_mounts": "map",
    "extra_mount": "strlist",
    "srun_options": "map",
    "sbatch_directives": "map",
    "enable_config_dump": "bool",
    "setup_script": "str",
    "identity": IDENTITY,
    "reporting": REPORTING,
    "sweep": "map",  # parameter sweep: {placeholder: [values]}
    "lock": "map",  # srtctl lockfiles are recipes with a lock: section
}

TOP_V1 = {
    **_COMMON_TOP,
    "resources": RESOURCES_V1,
    "backend": "backend",  # checked against BACKENDS_V1 by its type
    "frontend": FRONTEND_V1,
    "dynamo": DYNAMO_V1,
    "infra": {"etcd_nats_dedicated_node": "bool", "nats_max_payload_mb": "int"},
}
REQUIRED_V1 = {(): ("name", "model", "resources"), ("model",): ("path", "container", "precision"), ("resources",): ("gpu_type",)}

# --- 2.0 layout (schema: 2) ---------------------------------------------------------------
ROLE_NAMES = ("prefill", "decode", "agg")
ROLE_V2 = {
    "nodes": "nodes",
    "workers": "int",
    "gpus": "int",
    "env": "strmap",
    "args": "map",
    "engine": "str|map",
    "container": "str",
    "placement": "map",
}
TOP_V2 = {
    **_COMMON_TOP,
    "schema": "int",
    "resources": {"gpu_type": "str", "gpus_per_node": "int", "het_jobs": "bool", "spread_workers": "bool"},
    "engine": "str|map",
    "roles": "roles",
    "placement": "map",
    "services": "list",
    "frontend": {**FRONTEND_V1, "placement": "map"},
    "dynamo": {**DYNAMO_V1, "source": "any"},
}
REQUIRED_V2 = {(): ("name", "model", "resources", "roles"), ("model",): ("path", "container", "precision"), ("resources",): ("gpu_type",)}
