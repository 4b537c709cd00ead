"""The node preflight: on every allocated node, before any server starts, is this a node the job can use?

A two-hour GB200 job that lands on a node with an old driver, fewer GPUs than the recipe places,
no IMEX channel for multi-node NVLink or no RDMA device otherwise fails late (or, for RDMA, runs
on TCP). The preflight checks each in seconds and ends the job naming what is missing. The slurm
runner runs it as the batch script's first step (`srun --ntasks-per-node=1`); the srtctl runner
as srt-slurm's own `setup_script`, which srt-slurm runs in every worker's container before the
worker starts (and a failing one ends the sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

from servestack.resources import PREFLIGHT, script

SCRIPT_NAME = PREFLIGHT
MARKER = "servestack preflight"

SCRIPT = script(SCRIPT_NAME)


@dataclass(frozen=True, kw_only=True)
class NodePreflight:
    min_driver: int
    gpus_per_node: int
    nodes: int = 1
    skipped: bool = False  # --skip-preflight: named in the job record, never run

    def env(self) -> dict[str, str]:
        return {"SERVESTACK_PREFLIGHT_MIN_DRIVER": str(self.min_driver), "SERVESTACK_PREFLIGHT_GPUS": str(self.gpus_per_node),
                "SERVESTACK_PREFLIGHT_NODES": str(self.nodes)}

    def to_json(self) -> dict[str, object]:
        return {"min_driver": self.min_driver, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
                **({"skipped": "--skip-preflight"} if self.skipped else {})}

    @property
    def runs(self) -> bool:
        return not self.skipped
