"""What the one-node and the multi-node cluster share: the lines of slurm.conf they say the same
way, and the layout `services.slurm` starts a cluster from (its directory, config and slurmds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def common_conf(d: Path) -> list[str]:
    """What every cluster of ours says the same way: who runs what, how jobs are tracked, timeouts."""
    return [
        # Root runs everything: state lives under root's home, and benchmark jobs need root
        # (docker). DisableRootJobs is NO by default; say it so nobody has to look it up.
        "SlurmUser=root",
        "SlurmdUser=root",
        "DisableRootJobs=NO",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # No cgroup v2 delegation in containers/CI: track jobs by process group.
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        # Cores are what a node hands out; memory is not a consumable. With CR_Core_Memory
        # every step of a job (srtctl runs infra, frontend, each worker and short `srun` address
        # lookups as overlapping steps) claims its own share of the job's memory, so a worker
        # step was refused ("Memory required by task is not available") while a lookup step was
        # still ending: 2 of 5 disaggregated jobs. RealMemory still bounds what a job may ask.
        "SelectTypeParameters=CR_Core",
        # A node that was down (e.g. machine rebooted) comes back by itself.
        "ReturnToService=2",
        # A job whose node failed ends NODE_FAIL instead of going back to the queue: the pipeline's
        # retry policy decides, and reruns only the points that did not finish.
        "JobRequeue=0",
    ]


def tail_conf(d: Path) -> list[str]:
    return [
        "InactiveLimit=0",
        "KillWait=10",
        # Tearing down a pyxis/enroot container (vLLM exiting, squashfuse unmounting) can take
        # minutes on a loaded 2-core node; past this Slurm drains the node ("Kill task failed").
        "UnkillableStepTimeout=300",
        "MinJobAge=300",
        f"StateSaveLocation={d / 'state'}",
    ]


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One cluster of ours: its directory and config, its slurmds and how each is started."""

    directory: Path
    conf_text: str
    env: dict[str, str]
    # (node name, pidfile, argv that runs its slurmd in the foreground)
    slurmds: list[tuple[str, Path, list[str]]]
    # Before slurmctld starts (the cluster network made), before a slurmd starts (the node's namespace
    # made), and when the config changes (every node torn down).
    prepare_cluster: Callable[[], None] = lambda: None
    prepare_node: Callable[[str], None] = lambda name: None
    stop_nodes: Callable[[], None] = lambda: None
