"""What smoke will check and how it will serve, decided from the lock and the recipes: data only, nothing runs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.inputs.tinymodel import TinyModelSpec
from servestack.recipes.read import engine_settings, load_recipe
from servestack.recipes.validate import recipe_files
from servestack.records.lockfile import Lock
from servestack.records.stack import normalize
from servestack.smoke.containers import host_docker_platform
from servestack.smoke.engine_settings import QWEN35_FLAGS, VLLM_CPU_ENV
from servestack.smoke.gpu import GpuHost, GpuRole, gpu_container_kwargs, no_gpu
from servestack.smoke.gpuplan import GPU_KV_TRANSFER_CONFIG, GPU_SHM_SIZE, gpu_engine_flags, gpu_environment, placement
from servestack.util.project import Project
from servestack.util.vllm_command import DYNAMO_FRONTEND_MODULE, DYNAMO_WORKER_MODULE, module_argv, server_argv

VENV_PYTHON = "/opt/venv/bin/python"
STACK_JSON = "/opt/servestack/stack.json"
MODELS_DIR = "/opt/servestack/models"
SERVER_PORT = 8000

# Module -> the locked distribution that provides it; only modules whose package is locked are checked.
STACK_MODULES: list[tuple[str, tuple[str, ...]]] = [
    ("vllm", ("vllm", "vllm-cpu")),
    ("vllm.entrypoints.openai.api_server", ("vllm", "vllm-cpu")),
    # `python -m dynamo.vllm` / `-m dynamo.frontend` run these; the packages' __init__ import nothing.
    ("dynamo.vllm.main", ("ai-dynamo",)),
    ("dynamo.frontend.main", ("ai-dynamo",)),
    ("nixl", ("nixl", "nixl-cu12", "nixl-cu13")),
    ("flashinfer", ("flashinfer-python",)),
    ("flashinfer.gdn_prefill", ("flashinfer-python",)),
    # What srt-slurm's benchmark clients import (sa-bench, gsm8k_eval.py): a job never installs them.
    *((m, (d,)) for m, d in (("pandas", "pandas"), ("datasets", "datasets"), ("jinja2", "jinja2"),
                             ("aiohttp", "aiohttp"), ("numpy", "numpy"), ("PIL", "pillow"), ("tqdm", "tqdm"),
                             ("transformers", "transformers"), ("huggingface_hub", "huggingface-hub"),
                             ("requests", "requests"))),
    # The CUTLASS DSL (its .pth puts `cutlass` on the path) loads the newest CUDA flavor installed.
    ("cutlass", ("nvidia-cutlass-dsl",)),
]

# `python -m` entry points the stack's serving runs, checked with `--help` (start-up path and parser).
STACK_ENTRY_POINTS: list[tuple[str, tuple[str, ...]]] = [
    ("dynamo.vllm", ("ai-dynamo",)),
    ("dynamo.frontend", ("ai-dynamo",)),
]

# Container environment for serving: no telemetry, no hub.
SERVE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def engine_usage(project: Project, stack: str, lock: Lock) -> dict[str, dict[str, dict[str, Any]]]:
    """Every engine flag and VLLM_* variable the stack uses: recipes, the stack's environment, the
    flags the smoke server itself is started with. The recipes are the one owner of which flags a
    stack uses: the stack file holds no second list of them."""
    tables: dict[str, dict[str, dict[str, Any]]] = {"flag": {}, "env": {}}

    def add(kind: str, key: str, value: Any, source: str) -> None:
        entry = tables[kind].setdefault(key, {"value": None, "sources": []})
        if value is not None and entry["value"] is None:
            entry["value"] = value
        if source not in entry["sources"]:
            entry["sources"].append(source)

    recipe_dir = project.recipes / stack
    for path in recipe_files([recipe_dir]) if recipe_dir.is_dir() else []:
        rel = path.relative_to(project.root).as_posix()
        for setting in engine_settings(load_recipe(path).data):
            add(setting.kind, setting.name, setting.value, f"{rel}:{setting.where}")
    lock_rel = project.lock_file(stack).relative_to(project.root).as_posix()
    for name, value in lock.environment.items():
        if name.startswith("VLLM_"):
            add("env", name, value, f"{lock_rel}:environment")
    for flag, value in _serve_flags(lock).items():
        add("flag", flag, value, "the smoke server")
    return {"flags": tables["flag"], "env": tables["env"]}


def _engine(lock: Lock) -> str | None:
    names = {normalize(n) for n in lock.packages}
    return "vllm" if names & {"vllm", "vllm-cpu"} else None


def _cuda_engine(lock: Lock) -> bool:
    """The stack's vLLM is the CUDA build (`vllm`), not the CPU one (`vllm-cpu`)."""
    names = {normalize(n) for n in lock.packages}
    return "vllm" in names and "vllm-cpu" not in names


def _modules(lock: Lock, platform: str, table: list[tuple[str, tuple[str, ...]]] = STACK_MODULES) -> list[str]:
    """The table's modules whose distribution the lock has."""
    locked = {normalize(w.name) for w in lock.wheels(platform)}
    locked |= {normalize(n) for n in lock.packages}
    return [module for module, dists in table if locked & set(dists)]


def _served_name(lock: Lock) -> str:
    return lock.smoke_model.name or "smoke"


def _serve_flags(lock: Lock) -> dict[str, Any]:
    model = lock.smoke_model
    path = f"{MODELS_DIR}/{model.name}" if model.make is not None else model.path
    flags: dict[str, Any] = {
        "model": path,
        "served-model-name": _served_name(lock),
        "host": "0.0.0.0",
        "port": SERVER_PORT,
    }
    if model.make is not None and _cuda_engine(lock):
        flags.update(gpu_engine_flags())  # production's settings on a GPU (gpuplan.py)
    elif model.make is not None:
        # As the stack's CPU recipes serve: eager mode (no torch.compile of the model, so no C++
        # compiler needed in the image, and ~30 s less start-up on 2 cores). vLLM's sampler compiles
        # regardless; the stack's TORCHDYNAMO_DISABLE turns that off.
        # The tiny model is the production's Qwen3.5 class: production's settings for it, as far as
        # the CPU build takes them (engine_settings.QWEN35_FLAGS). GDN on CPU runs only in bfloat16.
        flags.update({"max-model-len": 4096, "dtype": "bfloat16", "enforce-eager": True, **QWEN35_FLAGS})
    return flags


def serve_command(lock: Lock, extra: dict[str, Any] | None = None) -> list[str]:
    return server_argv(VENV_PYTHON, {**_serve_flags(lock), **(extra or {})})


def probe_config(project: Project, stack: str, lock: Lock, platform: str, lock_sha256: str) -> dict[str, Any]:
    engine = _engine(lock)
    usage = engine_usage(project, stack, lock) if engine else None
    return {
        "stack": stack,
        "platform": platform,
        "expected_lock_sha256": lock_sha256,
        "stack_json": STACK_JSON,
        "site_packages": None,
        "wheels": [{"name": w.name, "version": w.version} for w in lock.wheels(platform)],
        "pull_requests": [pr.to_json() for pr in lock.pull_requests],
        "local_patches": [patch.to_json() for patch in lock.local_patches],
        "excluded": [{"name": e.name, "reason": e.reason} for e in lock.excluded],
        "fast_path": lock.fast_path,
        "modules": _modules(lock, platform),
        "entry_points": _modules(lock, platform, STACK_ENTRY_POINTS),
        "engine": {"name": engine, **usage} if engine and usage else None,
        "model_dir": _serve_flags(lock)["model"] if lock.smoke_model.make is not None else None,
        # The stack keeps vLLM's CPU attention off AMX (its environment, by a local patch): proven here.
        "cpu_attention_without_amx": "SERVESTACK_CPU_ATTN_NO_AMX" in lock.environment,
        "gpu_node": lock.gpu_node,
        "unavailable": [u.to_json() for u in lock.unavailable],
        **(gpu_stack_checks(lock) if lock.gpu_node else {}),
    }


# The serving libraries whose shared objects must link inside the image (globs under site-packages).
NATIVE_LIBRARIES = {
    "torch": ["torch/lib/*.so*", "torch/*.so"],
    "vllm": ["vllm/**/*.so"],
    "flashinfer": ["flashinfer/**/*.so", "flashinfer_jit_cache/**/*.so"],
    "nixl": ["nixl*/**/*.so*", ".nixl*.libs/*.so*"],
}
# FlashInfer 0.7 ships no shared library of its own: its modules are compiled at first use, or come
# with flashinfer-jit-cache where the lock has it.
NATIVE_OPTIONAL = ["flashinfer"]
# What NIXL and its UCX load only when asked for: NIXL's backends (GPUNETIO needs DOCA) and telemetry
# exporters, UCX's transports for other hardware (mlx5 GPU-direct needs FlexIO) and its perftest
# modules. Serving asks for NIXL's UCX backend and UCX's CUDA transports, which must load.
NATIVE_PLUGINS = {"optional": ["libplugin_[!U]*.so", "libplugin_U[!C]*.so", "libtelemetry_exporter_*.so",
                               "libuct_ib*.so*", "libuct_rdmacm*.so*", "libucx_perftest*.so*"]}
# What a GPU worker imports when it starts: Dynamo's workers, vLLM's server, and the model's module.
SERVING_ENTRY_MODULES = ["dynamo.vllm", "dynamo.frontend", "vllm.entrypoints.openai.api_server",
                         "vllm.model_executor.models.qwen3_5"]


def gpu_stack_checks(lock: Lock) -> dict[str, Any]:
    """A GPU stack's probe also reads its native closure, its import closure and its kernels' shapes."""
    recorded, checkpoint = lock.smoke_model.config, lock.smoke_model.path
    # The recorded shapes are the checkpoint's (smoke_model.path), whatever model smoke itself serves.
    label = Path(checkpoint).name if checkpoint else lock.smoke_model.name
    models = [{"name": label, "source": recorded["source"], "config": recorded}] if recorded else []
    return {"native_closure": {"libraries": NATIVE_LIBRARIES, "optional": NATIVE_OPTIONAL, "plugins": NATIVE_PLUGINS},
            "import_closure": SERVING_ENTRY_MODULES,
            "kernel_shapes": {"models": models}}


@dataclass(kw_only=True)
class ServePlan:
    command: list[str] | None  # None: cannot run here
    reason: str = ""  # why not, when command is None
    model: str = "smoke"
    environment: dict[str, str] = field(default_factory=dict)
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    gpus: int = 0
    shm_size: str = "2g"
    oracle_vocab: int | None = None  # the agreement oracle's prompt ids are below it (a made model only)
    gdn_layers: int = 0
    container: dict[str, Any] = field(default_factory=dict)  # docker SDK arguments beyond the probe's (GPUs)

    @property
    def runnable(self) -> bool:
        return self.command is not None


def serve_plan(lock: Lock, platform: str, gpus: GpuHost | None = None) -> ServePlan:
    """`gpus`: what this host's docker can give containers (gpu.host_gpus); None: not looked for."""
    model = lock.smoke_model
    name = _served_name(lock)
    if _engine(lock) is None:
        return ServePlan(command=None, reason="the stack locks no serving engine (vllm) to start", model=name)
    host = host_docker_platform()
    if platform != host:
        return ServePlan(
            command=None,
            reason=f"the image is {platform} and this host is {host}: vLLM's server is not started under qemu-user "
            "emulation (start-up would take hours and would not exercise the target's kernels); run smoke on a "
            f"{platform} host",
            model=name,
        )
    if model.make is not None and not _cuda_engine(lock):
        return ServePlan(command=serve_command(lock), model=name, oracle_vocab=oracle_vocab(lock),
                         gdn_layers=gdn_layers(lock), environment=_added(lock, VLLM_CPU_ENV))
    gpus = gpus or no_gpu("GPUs were not looked for")
    if not gpus.count:
        return ServePlan(command=None, reason=f"serving {name} needs NVIDIA GPUs and {gpus.evidence}", model=name)
    if model.make is not None:
        return ServePlan(command=serve_command(lock), model=name, oracle_vocab=oracle_vocab(lock), gdn_layers=gdn_layers(lock),
                         environment=_added(lock, gpu_environment()), gpus=1, shm_size=GPU_SHM_SIZE,
                         container=gpu_container_kwargs(gpus, "server"))
    path = model.path
    if not path or not Path(path).exists():
        return ServePlan(command=None, reason=f"{gpus.count} GPU(s) found, but the smoke model path {path!r} does not exist on this host",
                         model=name)
    return ServePlan(
        command=serve_command(lock, {"tensor-parallel-size": gpus.count}),
        model=name,
        environment=dict(SERVE_ENV),
        volumes={path: {"bind": path, "mode": "ro"}},
        gpus=gpus.count,
        shm_size="32g",  # NCCL and the engine's IPC buffers across tensor-parallel ranks
        container=gpu_container_kwargs(gpus, "all"),
    )


def _added(lock: Lock, extra: dict[str, str]) -> dict[str, str]:
    """The image's own environment (the stack's) is what is tested: add only what it lacks."""
    return {k: v for k, v in {**SERVE_ENV, **extra}.items() if k not in lock.environment}


# --------------------------------------------------------------------------- the disaggregated shape

# Where the containers share Dynamo's file discovery (a host directory bind-mounted into each).
DISCOVERY_DIR = "/run/servestack/discovery"
# kv_lease_duration (vLLM 0.31 NixlConnector, nixl/base_scheduler.py and base_worker.py): the prefill
# worker keeps a finished prefill's KV blocks this many seconds for the decode worker's pull; the
# decode worker's scheduler sends a heartbeat every duration/6 s while the request waits, each
# extending the hold to duration*2/3 s from then. vLLM's 30 s gives 20 s: at concurrency 4 under
# load ~24 the decode engine stalled 20-30 s (no steps, so no heartbeats), prefill released two
# requests' blocks, and decode then pulled them anyway (prefill logged "Potentially invalid KV
# blocks": blocks that may already hold another request's KV, so wrong output). 90 s holds through
# a 60 s stall, twice the longest seen. It costs only when decode never pulls (a failed handshake,
# an aborted request, a decode worker gone): prefill then holds those blocks (a few MB of a tiny
# model's cache) and keeps stepping on its one core (PREFILL_CPUS; the recipes' pin) for 90 s
# instead of 30. The dev-cpu disaggregated recipes set the same (tests/recipes/test_recipes.py); the GB200
# recipes keep vLLM's default.
# kv_load_failure_policy "fail" as production's recipes: a KV (or SSM state) load that fails ends the
# request with an error instead of recomputing it silently, so a broken transfer cannot pass as a slow one.
KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu",
                      "kv_load_failure_policy": "fail", "kv_connector_extra_config": {"kv_lease_duration": 90}}

# How long Dynamo's frontend waits for a worker's answer over the TCP request plane before it
# answers HTTP 504 "Request deadline exceeded" (Dynamo's default is 10 s). On 2 shared cores a
# disaggregated request has waited 18-64 s for its first token behind the prefill worker's
# busy-polling (the fresh-clone CI run of a2edfda lost one oracle prompt of 15 to the default); the
# dev-cpu recipes set the same.
FRONTEND_REQUEST_TIMEOUT_S = 300

# Dynamo and UCX pick an interface address unless told: every plane stays on loopback, and
# discovery is a shared directory (no etcd, no NATS).
DISAGG_ENV = {
    "DYN_TCP_REQUEST_TIMEOUT": str(FRONTEND_REQUEST_TIMEOUT_S),
    "DYN_DISCOVERY_BACKEND": "file",
    "DYN_FILE_KV": DISCOVERY_DIR,
    "DYN_REQUEST_PLANE": "tcp",
    "DYN_EVENT_PLANE": "zmq",
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_SYSTEM_HOST": "127.0.0.1",
    "UCX_TLS": "tcp,self",
    # What vLLM's NIXL setup asks for, set before NIXL is imported (vLLM can only warn by then).
    "UCX_RCACHE_MAX_UNRELEASED": "1024",
    # A worker killed by a signal (a native crash in a transfer) leaves its Python stack in the log.
    "PYTHONFAULTHANDLER": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
}


# While its KV blocks wait for the decode worker's NIXL pull the prefill worker busy-polls (EngineCore
# steps every 1 ms; its model runner spins in sched_yield on the shared-memory queue), and so does the
# decode worker between steps. Each engine's compute runs in OpenMP threads bound by
# VLLM_CPU_OMP_THREADS_BIND; "auto" binds every engine to the same first CPUs (it reserves the last
# one for other processes), so the two engines' compute shared one core while the other ran the
# spinners. Measured with the hybrid model on 2 cores (a 16-token stream through the frontend):
# both "auto" with the prefill container under a one-core CFS quota: 24 s for a 5-token prefill
# (its OpenMP threads spin at barriers while one of them waits out the throttled period); each
# engine's OpenMP threads bound to CPUs of their own, nothing capped: 14 chunks in 1.2 s, first
# token 0.34 s. But vLLM's NIXL worker then moved each model runner (OpenMP's first thread) onto
# the host's last core (the patch vllm-cpu-nixl-kv-core-in-affinity.diff says why), so both engines
# computed on core 1: requests of 45-98 s, load 30-77. Each worker's container therefore gets its
# engine's CPUs as its cpuset too, which the patched worker keeps to, and its spinners with it. The
# prefill worker takes the last PREFILL_CPUS CPUs this process may use, the decode worker the others.
PREFILL_CPUS = 1


@dataclass(frozen=True, kw_only=True)
class Role:
    """One process of the disaggregated shape, in its own container."""

    name: str  # "frontend", "prefill", "decode"
    command: tuple[str, ...]
    environment: dict[str, str]
    cpus: str | None = None  # the container's cpuset ("1", "0,2"); None: every CPU
    container: dict[str, Any] = field(default_factory=dict)  # docker SDK arguments beyond the probe's (GPUs)


@dataclass(frozen=True, kw_only=True)
class DisaggPlan:
    roles: tuple[Role, ...]  # frontend first: the workers join its network namespace
    reason: str = ""  # why not, when there are no roles
    model: str = "smoke"
    port: int = SERVER_PORT  # the frontend's HTTP port inside the shared namespace
    shm_size: str = "2g"
    oracle_vocab: int | None = None
    gdn_layers: int = 0
    gpus: int = 0  # GPUs the engines run on (0: on CPU)
    placement: str = ""  # where the engines run, in words

    @property
    def runnable(self) -> bool:
        return bool(self.roles)


def _disagg_roles(lock: Lock, gpus: GpuHost | None = None) -> tuple[Role, ...]:
    """The three roles; on `gpus` the engines run on GPUs with NIXL over GPU buffers, else each on CPUs of its own."""
    serve = _serve_flags(lock)
    engine = {k: v for k, v in serve.items() if k not in ("host", "port")}
    base = _added(lock, gpu_environment(DISAGG_ENV) if gpus else {**VLLM_CPU_ENV, **DISAGG_ENV})
    frontend = Role(name="frontend", command=tuple(module_argv(VENV_PYTHON, DYNAMO_FRONTEND_MODULE, {
        # Inside the containers' own network namespace; the host publishes it on 127.0.0.1 only.
        "http-host": "0.0.0.0", "http-port": SERVER_PORT,
    })), environment=base)
    workers = []
    # Each worker: its own NIXL side channel and metrics port, and its own core for the CPU engine.
    modes: tuple[GpuRole, GpuRole] = ("prefill", "decode")
    for index, mode in enumerate(modes):
        cpus = None if gpus else engine_cpus(mode)
        workers.append(Role(name=mode, command=tuple(module_argv(VENV_PYTHON, DYNAMO_WORKER_MODULE, {
            **engine, "disaggregation-mode": mode, "kv-transfer-config": GPU_KV_TRANSFER_CONFIG if gpus else KV_TRANSFER_CONFIG,
        })), environment={**base, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(20097 + index), "DYN_SYSTEM_PORT": str(18091 + index),
              **({"VLLM_CPU_OMP_THREADS_BIND": cpus} if cpus else {})}, cpus=cpus,
            container=gpu_container_kwargs(gpus, mode) if gpus else {}))
    return (frontend, *workers)


def engine_cpus(mode: str) -> str:
    """The CPUs an engine's OpenMP threads are bound to (VLLM_CPU_OMP_THREADS_BIND): the prefill
    worker the last PREFILL_CPUS of those this process may use, the decode worker the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    mine = cpus[-PREFILL_CPUS:] if mode == "prefill" else cpus[:-PREFILL_CPUS] or cpus
    return ",".join(str(c) for c in mine)


def disagg_plan(lock: Lock, platform: str, gpus: GpuHost | None = None) -> DisaggPlan:
    """Dynamo's frontend with one prefill and one decode worker, KV over NIXL, when the image has
    them and the smoke model is made: on CPU for vLLM's CPU build, on `gpus` for its CUDA build."""
    name = _served_name(lock)
    locked = {normalize(w.name) for w in lock.wheels(platform)}
    missing = [d for d in ("ai-dynamo", "nixl") if d not in locked]
    if _engine(lock) is None or missing:
        return DisaggPlan(roles=(), reason=f"the stack locks no {' or '.join(missing) or 'vllm'}: no disaggregated shape to serve",
                          model=name)
    host = host_docker_platform()
    if platform != host:
        return DisaggPlan(roles=(), reason=f"the image is {platform} and this host is {host}: not started under emulation", model=name)
    if lock.smoke_model.make is None:
        return DisaggPlan(roles=(), reason="the disaggregated shape is served with a made smoke model; this stack's smoke model "
                              "is a checkpoint on the cluster (its recipes run the shape there)", model=name)
    if not _cuda_engine(lock):
        return DisaggPlan(roles=_disagg_roles(lock), model=name, oracle_vocab=oracle_vocab(lock), gdn_layers=gdn_layers(lock))
    gpus = gpus or no_gpu("GPUs were not looked for")
    if not gpus.count:
        return DisaggPlan(roles=(), reason=f"the disaggregated shape of {name} runs on NVIDIA GPUs and {gpus.evidence}", model=name)
    return DisaggPlan(roles=_disagg_roles(lock, gpus), shm_size=GPU_SHM_SIZE, gpus=min(gpus.count, 2),
                      placement=placement(gpus), model=name, oracle_vocab=oracle_vocab(lock), gdn_layers=gdn_layers(lock))


def _made_model(lock: Lock) -> TinyModelSpec | None:
    make = lock.smoke_model.make
    if make is None:
        return None
    # The lock's copy of the stack file's fields: a problem is named where it was written.
    return TinyModelSpec.from_dict({"name": lock.smoke_model.name.rsplit("/", 1)[-1], **make},
                                   stack_file=Path(lock.stack.file))


def oracle_vocab(lock: Lock) -> int | None:
    """The made smoke model's ordinary token ids (below its special tokens): the oracle's prompts."""
    spec = _made_model(lock)
    return None if spec is None else spec.ordinary_tokens


def gdn_layers(lock: Lock) -> int:
    spec = _made_model(lock)
    return 0 if spec is None else spec.layer_types.count("linear_attention")
