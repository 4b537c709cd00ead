"""Each worker of a recipe as srt-slurm will start it: its command line and environment, built by srt-slurm's
own code (the vendored snapshot the pin names), not a re-implementation.

Run as a program (`python srtslurm_launch.py SRC_DIR < request.json > roles.json`) by a Python that has
srt-slurm's dependencies (marshmallow, marshmallow-dataclass, ruamel.yaml, pyyaml, pydantic); it imports
nothing of servestack. For each recipe file of the request it calls srt-slurm's `load_config` (its
cluster defaults, aliases and schema), `RuntimeContext.from_config`, its backend's `allocate_endpoints`
and `endpoints_to_processes`, and `WorkerStageMixin.start_all_workers`, whose `srun` is caught before it
runs: what srt-slurm would hand srun (command, environment, the bash preamble with the Dynamo install)
is what comes back. Only what needs a real cluster is stood in for: the node list (as many names as the
recipe asks for), each node's IP, an output directory, and the cluster config's model and container
aliases (a local model path or container file of the cluster, which srt-slurm checks exists).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def _fake_ip(node: str, interface: str | None = None) -> str:
    return f"10.0.0.{int(node.rsplit('-', 1)[1]) + 1}"


def _patch(srtctl_modules: dict, nodes: list[str], captured: list[dict]) -> None:
    runtime, slurm, worker_stage = srtctl_modules["runtime"], srtctl_modules["slurm"], srtctl_modules["worker_stage"]
    runtime.get_slurm_nodelist = lambda: list(nodes)
    runtime.get_slurm_het_nodelists = lambda: None
    runtime.get_hostname_ip = _fake_ip
    slurm.get_hostname_ip = _fake_ip
    if hasattr(worker_stage, "get_hostname_ip"):
        worker_stage.get_hostname_ip = _fake_ip

    def start_srun_process(**kw: Any) -> _Popen:
        captured.append({"command": [str(a) for a in kw.get("command") or []],
                         "env": {str(k): str(v) for k, v in (kw.get("env_to_set") or {}).items()},
                         "unset": list(kw.get("env_to_unset") or []), "node": (kw.get("nodelist") or [""])[0],
                         "preamble": kw.get("bash_preamble") or ""})
        return _Popen()

    worker_stage.start_srun_process = start_srun_process


class _Popen:
    pid = 0
    returncode = None

    def poll(self) -> None:
        return None


def _resolve(path: str, modules: dict, out_dir: Path) -> dict:
    from srtctl.core.config import load_config
    from srtctl.core.runtime import RuntimeContext
    from srtctl.core.schema import installs_dynamo
    from srtctl.core.topology import NodePortAllocator

    config = load_config(path)
    total = int(config.total_nodes)
    # srtctl/cli/submit.py adds a node per dedicated role (one, when they colocate) to what sbatch asks for.
    dedicated = sum((config.infra.etcd_nats_dedicated_node, config.frontend.dedicated_node,
                     config.benchmark.client_dedicated_node))
    if dedicated:
        total += 1 if config.benchmark.colocate_with_frontend else dedicated
    nodes = [f"node-{i}" for i in range(max(1, total))]
    captured: list[dict] = []
    _patch(modules, nodes, captured)
    runtime = RuntimeContext.from_config(config, "0", log_dir_base=out_dir)
    backend = config.backend
    r = config.resources

    class Orchestrator(modules["worker_stage"].WorkerStageMixin):  # type: ignore[misc]  # srt-slurm's, by module
        pass

    orchestrator = Orchestrator()
    orchestrator.config, orchestrator.runtime = config, runtime
    endpoints = backend.allocate_endpoints(
        num_prefill=r.num_prefill, num_decode=r.num_decode, num_agg=r.num_agg, gpus_per_prefill=r.gpus_per_prefill,
        gpus_per_decode=r.gpus_per_decode, gpus_per_agg=r.gpus_per_agg, gpus_per_node=r.gpus_per_node,
        available_nodes=runtime.nodes.worker, spread_workers=r.spread_workers)
    processes = backend.endpoints_to_processes(endpoints, port_allocator=NodePortAllocator(),
                                               frontend_type=config.frontend.type)
    type(orchestrator).endpoints = property(lambda self: endpoints)
    type(orchestrator).backend_processes = property(lambda self: processes)
    orchestrator.start_all_workers()
    workers = []
    for process, launch in zip(processes, captured, strict=False):
        workers.append({"mode": process.endpoint_mode, "index": process.endpoint_index, "rank": process.node_rank,
                        "gpus": len(process.gpu_indices), **launch})
    return {"workers": workers, "installs_dynamo": bool(installs_dynamo(config)),
            "dynamo_version": getattr(config.dynamo, "version", None), "frontend": config.frontend.type,
            "gpus_per_node": r.gpus_per_node, "nodes": len(nodes)}


def main() -> int:
    source = sys.argv[1]
    request = json.load(sys.stdin)
    sys.path.insert(0, source)
    logging.disable(logging.CRITICAL)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Path(tmp) / "srtslurm.yaml"
        models = {}
        for alias in request.get("model_aliases", []):
            d = Path(tmp) / "models" / alias.replace("/", "_")
            d.mkdir(parents=True, exist_ok=True)
            models[alias] = str(d)
        containers = {}
        for i, alias in enumerate(request.get("container_aliases", [])):
            f = Path(tmp) / "containers" / f"{i}.sqsh"  # srt-slurm checks that a container file exists
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
            containers[alias] = str(f)
        cluster.write_text(json.dumps({"model_paths": models, "containers": containers}))
        os.environ["SRTSLURM_CONFIG"] = str(cluster)
        os.environ.pop("SRTCTL_OUTPUT_DIR", None)
        import importlib

        modules = {name: importlib.import_module(f"srtctl.{where}") for name, where in
                   (("runtime", "core.runtime"), ("slurm", "core.slurm"), ("worker_stage", "cli.mixins.worker_stage"))}
        for path in request["files"]:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    results[path] = _resolve(path, modules, Path(tmp) / "out")
            except Exception as e:
                results[path] = {"error": f"{type(e).__name__}: {e}", "trace": __import__("traceback").format_exc()[-1500:]}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
