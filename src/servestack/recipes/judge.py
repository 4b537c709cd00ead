"""Recipes judged by srt-slurm and by the engine themselves, each role resolved as it will run.

1. srt-slurm's own code (srtslurm_launch.py, the vendored snapshot) builds every worker's command line
   and environment: its precedence (the top-level `environment:` over a role's), its Dynamo install
   default, its per-GPU or per-node launch, its served-model-name handling.
2. Inside the stack's image (engine_driver.py), Dynamo's and vLLM's own parsers and
   `create_engine_config` resolve each distinct role, on the recipe's target device simulated; vLLM's
   `compute_nixl_compatibility_hash` is computed per role and compared across roles.

Answers are cached by content (the image digest, the driver, the device, the stand-in model, the role's
resolved command line and environment), so an unchanged recipe costs nothing the second time.
Without the image (or where it cannot judge), `judge()` returns why and the caller keeps the static rules,
marked as such.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack import settings
from servestack.recipes.hardware import GPUS
from servestack.recipes.srtslurm import SRT_SLURM
from servestack.util.fsutil import atomic_write_text
from servestack.util.project import cache_home

HERE = Path(__file__).parent
LAUNCH = HERE / "srtslurm_launch.py"
DRIVER = HERE / "engine_driver.py"
# srt-slurm's per-process allocation (paths, ports, addresses, ranks, devices): the first worker's value stands
# for every worker's, so one role of a recipe, and the same role in another recipe, are judged once.
_PER_PROCESS_FLAGS = ("--dump-config-to", "--data-parallel-address", "--data-parallel-rpc-port", "--master-addr",
                      "--device-ids", "--data-parallel-rank", "--data-parallel-start-rank", "--node-rank")
_PER_PROCESS_ENV = ("DYN_SYSTEM_PORT", "VLLM_PORT", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST",
                    "DYN_VLLM_KV_EVENT_PORT", "HEAD_NODE_IP", "ETCD_ENDPOINTS", "NATS_SERVER", "CUDA_VISIBLE_DEVICES")
_STANDS_FOR = {"--dump-config-to": "/logs/config.json", "--data-parallel-address": "10.0.0.1",
               "--master-addr": "10.0.0.1", "--data-parallel-rpc-port": "8400"}


@dataclass(frozen=True, kw_only=True)
class Worker:
    mode: str  # prefill | decode | agg
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What srt-slurm starts for one recipe: the first worker of each role, and its Dynamo install."""

    roles: dict[str, Worker]
    installs_dynamo: bool
    dynamo_version: str
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Engine:
    """The stack's image, as the judge runs it."""

    image: str  # a reference docker can run, by digest
    digest: str
    model_config: dict[str, Any]  # the stand-in's config.json: the recipe's architecture, no weights


def srtslurm_source() -> Path:
    """The vendored srt-slurm's `src/`, unpacked once into the cache (the pinned commit's snapshot)."""
    vendor = settings.value("SERVESTACK_VENDOR")
    if not vendor:
        raise FileNotFoundError("SERVESTACK_VENDOR is not set (the directory holding the vendored srt-slurm)")
    archive = Path(vendor) / f"srt-slurm-{SRT_SLURM.short}.tar.gz"
    if not archive.is_file():
        raise FileNotFoundError(f"{archive} is missing: the pinned srt-slurm {SRT_SLURM.tag} is not vendored")
    home = cache_home() / "srt-slurm" / SRT_SLURM.short
    src = home / f"srt-slurm-{SRT_SLURM.short}" / "src"
    if not (home / ".complete").exists():
        home.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(home, filter="tar")
        (home / ".complete").write_text(SRT_SLURM.commit)
    return src


def launches(files: list[Path], model_aliases: list[str],
             container_aliases: Sequence[str] = ()) -> dict[Path, Launch] | str:
    """srt-slurm's own launch of each recipe file (one subprocess for all of them), or why it could not run.
    The aliases are the recipes' local model paths and container files: the cluster's, stood in for here."""
    request = json.dumps({"files": [str(f) for f in files], "model_aliases": list(model_aliases),
                          "container_aliases": list(container_aliases)})
    done = subprocess.run([sys.executable, str(LAUNCH), str(srtslurm_source())], input=request, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        return f"srt-slurm's code could not be run here: {done.stderr.strip()[-600:]}"
    out: dict[Path, Launch] = {}
    for name, result in json.loads(done.stdout).items():
        if "error" in result:
            out[Path(name)] = Launch(roles={}, installs_dynamo=False, dynamo_version="", error=result["error"])
            continue
        roles: dict[str, Worker] = {}
        for w in result["workers"]:
            if w["mode"] not in roles:
                argv = list(w["command"])
                for flag in _PER_PROCESS_FLAGS:
                    if flag in argv:
                        at = argv.index(flag) + 1
                        argv[at] = ",".join(str(i) for i in range(argv[at].count(",") + 1)) if flag == "--device-ids" \
                            else _STANDS_FOR.get(flag, "0")  # a worker's devices: as many, from 0
                unset = set(w.get("unset") or ())
                env = {k: ("0" if k in _PER_PROCESS_ENV else v) for k, v in w["env"].items() if k not in unset}
                if "VLLM_NIXL_SIDE_CHANNEL_HOST" in env:
                    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "10.0.0.1"
                roles[w["mode"]] = Worker(mode=w["mode"], argv=tuple(argv), env=env)
        out[Path(name)] = Launch(roles=roles, installs_dynamo=bool(result["installs_dynamo"]),
                                 dynamo_version=str(result.get("dynamo_version") or ""))
    return out


def device(gpu_type: str) -> dict[str, Any] | None:
    """The target device the engine resolves on: the hardware table's GPU, simulated; a CPU deployment is real;
    None for a GPU the table does not know (nothing to simulate)."""
    gpu = GPUS.get(gpu_type.lower())
    if gpu is None:
        return None
    if gpu.capability is None:
        return {"kind": "cpu"}
    major, minor = gpu.capability
    return {"kind": "cuda", "major": major, "minor": minor, "name": gpu.name, "memory_gb": gpu.memory_gb,
            "count": gpu.gpus_per_node or 1}


def _key(engine: Engine, dev: dict | None, worker: Worker) -> str:
    text = json.dumps({"digest": engine.digest, "driver": DRIVER.read_text(), "device": dev,
                       "model": engine.model_config, "argv": worker.argv, "env": worker.env}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def judge(engine: Engine, work: list[tuple[dict | None, Worker]]) -> list[dict] | str:
    """The engine's answer for each (device, worker): cached ones read back, the rest asked in one container;
    or why this image cannot judge here (not the recipe's fault: the static rules stand in)."""
    store = cache_home() / "recipes-judged"
    answers: dict[str, dict] = {}
    todo: dict[str, dict[str, Any]] = {}
    for dev, worker in work:
        key = _key(engine, dev, worker)
        cached = store / f"{key}.json"
        if cached.is_file():
            answers[key] = json.loads(cached.read_text())
        else:
            todo.setdefault(json.dumps(dev, sort_keys=True), {})[key] = {"argv": list(worker.argv), "env": worker.env}
    for dev_text, roles in todo.items():
        refused = store / f"unavailable-{_key(engine, json.loads(dev_text), Worker(mode='', argv=(), env={}))}.txt"
        if refused.is_file():  # this image, driver, device and model could not judge before: not again
            return refused.read_text()
        asked = _ask(engine, json.loads(dev_text), roles)
        if isinstance(asked, str):
            atomic_write_text(refused, asked)
            return asked
        for key, answer in asked.items():
            answers[key] = answer
            if answer.get("stage") != "crash":  # a role that killed the judge is asked again next time
                atomic_write_text(store / f"{key}.json", json.dumps(answer, sort_keys=True))
    return [answers[_key(engine, dev, worker)] for dev, worker in work]


def _ask(engine: Engine, dev: dict | None, roles: dict[str, dict]) -> dict[str, dict] | str:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="servestack-judge-") as tmp:
        model = Path(tmp) / "standin"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(engine.model_config))
        (Path(tmp) / "engine_driver.py").write_text(DRIVER.read_text())
        request = json.dumps({"device": dev, "model_dir": "/j/standin", "roles": roles})
        # vLLM's own cache of what it learnt of a model class (VLLM_CACHE_ROOT/modelinfos, keyed by the model
        # module's hash) is kept per image: the inspection is the slowest step of a cold judge.
        vllm_cache = cache_home() / "vllm-cache" / engine.digest.removeprefix("sha256:")[:16]
        vllm_cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["docker", "run", "--rm", "-i", "--network", "none", "-e", "HF_HUB_OFFLINE=1",
                               "-e", "VLLM_CACHE_ROOT=/vllm-cache", "-v", f"{vllm_cache}:/vllm-cache",
                               "-v", f"{tmp}:/j:ro", engine.image, "python", "/j/engine_driver.py"],
                              input=request, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not done.stdout.strip():
        return f"the judge failed in {engine.image}: {done.stderr.strip()[-600:]}"
    result = json.loads(done.stdout)
    if result.get("unavailable"):
        return (f"{engine.image} cannot configure even the stand-in model alone ({result['platform']}): "
                f"{str(result['unavailable'])[-400:]}")
    return result["answers"]


def docker_answers() -> bool:
    """Whether a Docker daemon answers here (the judge asks nothing else of the machine)."""
    try:
        done = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def image_present(image: str) -> bool:
    try:
        done = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
