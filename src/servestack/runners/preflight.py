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

SCRIPT_NAME = "servestack-preflight.sh"
MARKER = "servestack preflight"

SCRIPT = r"""#!/bin/bash
# servestack preflight: the node has what the job needs, or the job ends here, naming what is missing.
min_driver=${SERVESTACK_PREFLIGHT_MIN_DRIVER:?}
gpus_wanted=${SERVESTACK_PREFLIGHT_GPUS:?}
nodes=${SERVESTACK_PREFLIGHT_NODES:-1}
node=$(hostname)
missing=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
    missing+=("no NVIDIA driver: nvidia-smi is not on PATH (driver >= $min_driver needed)")
    missing+=("no GPUs: 0 of the $gpus_wanted per node the recipe places")
else
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
    if [[ -z $driver ]]; then
        missing+=("no NVIDIA driver answers nvidia-smi (driver >= $min_driver needed)")
    elif (( ${driver%%.*} < min_driver )); then
        missing+=("NVIDIA driver $driver is older than $min_driver (CUDA 13)")
    fi
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if (( gpus < gpus_wanted )); then
        missing+=("no GPUs: $gpus of the $gpus_wanted per node the recipe places")
    fi
fi
if (( nodes > 1 )) && ! ls /dev/nvidia-caps-imex-channels/channel* >/dev/null 2>&1; then
    missing+=("no IMEX channel (/dev/nvidia-caps-imex-channels/channel*): multi-node NVLink needs the IMEX daemon")
fi
# UCX's InfiniBand transports need an active verbs port; its cuda_ipc transport needs GPUs.
active=$(cat /sys/class/infiniband/*/ports/*/state 2>/dev/null | grep -c ACTIVE)
if (( active == 0 )) && ! command -v nvidia-smi >/dev/null 2>&1; then
    missing+=("no UCX transport for KV transfer: no active InfiniBand port (/sys/class/infiniband) and no GPUs for cuda_ipc")
fi
if (( ${#missing[@]} )); then
    for m in "${missing[@]}"; do echo "servestack preflight: $node: $m" >&2; done
    exit 3
fi
echo "servestack preflight: $node: driver $driver, $gpus GPU(s), $active active InfiniBand port(s)" >&2
"""


@dataclass(frozen=True)
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
