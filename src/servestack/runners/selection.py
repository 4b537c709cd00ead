"""The runners, by the name a pipeline file and the CLI's --runner give them: the one list.

Adding a runner is one module (a class with the `base.Runner` interface) and one entry here. The
pipeline file's `runner.kind` accepts exactly these names and gets a `runner.<name>` section for
an entry with `settings`; the CLI's --runner choices are these names; the stages plan each job
as the entry says (`submits_recipes`).

A factory gets the loaded pipeline (`stages.pipeline.Pipeline`; not imported here: the stages
import the runners) and returns a ready runner.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from servestack import settings
from servestack.runners.interface import Runner
from servestack.runners.local import LocalRunner
from servestack.runners.slurm import SlurmConfig, SlurmRunner, SlurmSettings
from servestack.runners.srtctl import SrtctlRunner, SrtctlSettings


@dataclass(frozen=True, kw_only=True)
class RunnerKind:
    make: Callable[[Any], Runner]  # the pipeline -> a runner
    # The runner's own section of the pipeline file, `runner.<name>` (None: it has none).
    settings: type[BaseModel] | None = None
    # True: a job is the stage's srt-slurm recipe itself, bound to the image and the points left
    # (the runner reads the recipe). False: a job is servestack's run_points command in the image.
    submits_recipes: bool = False
    # The deployment shapes (recipes.schema.deployment_shape) it can start: one vLLM server per job
    # ("aggregated"), or also Dynamo's frontend with prefill and decode workers ("disaggregated").
    shapes: tuple[str, ...] = ("aggregated",)
    # It places jobs on allocated cluster nodes, so it runs the node preflight (runners.preflight) there.
    allocates_nodes: bool = False


SRTCTL_ENV = "SERVESTACK_SRTCTL"  # the srtctl command (shell words), over runner.srtctl.executable


def _this_machine(pipeline: Any, nodes: int = 1) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """This machine as a GB200-shaped cluster: real srtctl, pyxis and enroot, built on demand, on
    Slurm of `nodes` nodes (more than one: network namespaces, services.slurm_nodes); the nodes pull
    the image by digest with token auth, as from a production registry, at an address they reach.
    Returns the environment for Slurm/srtctl, the registry map for image references and the srtctl
    command."""
    from servestack import cluster, services
    from servestack.services import netns
    from servestack.services import pull_registry as pullregistry
    from servestack.util.project import Project

    node = cluster.ensure_cluster(Project.find(Path(pipeline.file).parent).root, nodes=nodes)
    local = services.ensure_registry()
    host = pullregistry.LOOPBACK if nodes == 1 else netns.HOST_ADDRESS
    return node.env, {local: pullregistry.ensure_pull_registry(local, host=host)}, node.srtctl.argv()


def _local(pipeline: Any) -> Runner:
    return LocalRunner(poll_seconds=pipeline.retry.poll_seconds)


def _slurm(pipeline: Any) -> Runner:
    s = pipeline.runner.slurm
    env: dict[str, str] | None = None
    registry_map: dict[str, str] = {}
    if s.local_cluster:
        from servestack import services

        env = services.ensure_slurm()
        if s.container != "docker":
            env, registry_map, _ = _this_machine(pipeline)
    return SlurmRunner(SlurmConfig(**s.model_dump(), poll_seconds=pipeline.retry.poll_seconds, env=env,
                                   registry_map=registry_map))


def _srtctl(pipeline: Any) -> Runner:
    executable: list[str] = list(pipeline.runner.srtctl.executable)
    env: dict[str, str] | None = None
    registry_map: dict[str, str] = {}
    if pipeline.runner.slurm.local_cluster:
        env, registry_map, executable = _this_machine(pipeline, pipeline.runner.srtctl.local_cluster_nodes)
    override = settings.value(SRTCTL_ENV).strip()
    if override:
        executable = shlex.split(override)
    return SrtctlRunner(executable=executable, output_base=pipeline.runner.srtctl.output_dir, env=env,
                        poll_seconds=pipeline.retry.poll_seconds, registry_map=registry_map)


RUNNERS: dict[str, RunnerKind] = {
    "local": RunnerKind(make=_local),  # docker on this host
    "slurm": RunnerKind(make=_slurm, settings=SlurmSettings, allocates_nodes=True),  # sbatch, the image by docker or pyxis
    "srtctl": RunnerKind(make=_srtctl, settings=SrtctlSettings, submits_recipes=True, allocates_nodes=True,  # srt-slurm's `srtctl apply`
                         shapes=("aggregated", "disaggregated")),  # srt-slurm starts etcd, NATS, Dynamo
}


def starting(shape: str) -> tuple[str, ...]:
    """The runners that can start a recipe of `shape`."""
    return tuple(name for name, kind in RUNNERS.items() if shape in kind.shapes)


def make_runner(pipeline: Any, kind: str | None = None) -> Runner:
    """The runner of KIND (default: the pipeline's runner.kind), configured from the pipeline."""
    return RUNNERS[kind or pipeline.runner.kind].make(pipeline)
