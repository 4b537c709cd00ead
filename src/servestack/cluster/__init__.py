"""The GB200-shaped cluster tooling on one CPU node: enroot, pyxis and srtctl, built on demand.

A GB200 cluster runs a stage as `srtctl apply` -> `sbatch` -> `srun --container-image` (pyxis)
-> `enroot import` of the image by digest. This module makes that chain real on this machine,
the way `services` makes dockerd and Slurm real: each `ensure_*` is idempotent, fast when its
tool is in place, and otherwise builds it from the vendored source snapshot.

Sources: `git archive` snapshots of NVIDIA/enroot, NVIDIA/pyxis and NVIDIA/srt-slurm
(Apache-2.0) are inputs of the test environment, not project code. They are found in the
directory `$SERVESTACK_VENDOR` (configuration: the project knows no machine's layout; `.ci/run`
sets it where CI keeps them); when it is unset or they are missing, `ClusterToolsMissing` says
so (the cluster e2e tests skip on it). Each build lives under `state_home()/cluster/<tool>-<sha256 of the
archive and of this module's build steps>/`, so a new snapshot or new steps rebuild and an
unchanged one is reused in milliseconds.

On a real cluster none of this runs: the admins install srtctl, pyxis and enroot
(>= ENROOT_MIN_VERSION); the project only needs them on PATH and in plugstack.conf.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from servestack.cluster.enroot import Enroot, ensure_enroot
from servestack.cluster.pyxis import Pyxis, ensure_pyxis
from servestack.cluster.srtctl_tool import Srtctl, ensure_srtctl
from servestack.util.fsutil import atomic_write_text


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The one-node GB200-shaped cluster: Slurm with pyxis, enroot, and srtctl."""

    slurm_env: dict[str, str]
    enroot: Enroot
    pyxis: Pyxis
    srtctl: Srtctl

    @property
    def env(self) -> dict[str, str]:
        """For sbatch/srun/srtctl: the job inherits it, and pyxis finds `enroot` on its PATH."""
        path = os.pathsep.join([str(self.enroot.bin_dir), self.srtctl.env["PATH"]])
        return {**self.slurm_env, **self.srtctl.env, "PATH": path}


def ensure_cluster(root: Path | None = None, model_paths: dict[str, str] | None = None, nodes: int = 1) -> Cluster:
    """enroot, pyxis in Slurm's plugstack, Slurm itself (of `nodes` nodes: services.ensure_slurm) and
    srtctl; each reused when in place."""
    from servestack import services

    enroot = ensure_enroot(root)
    pyxis = ensure_pyxis(root, enroot)
    slurm_env = services.ensure_slurm(nodes=nodes)
    conf = Path(slurm_env["SLURM_CONF"]).parent / "plugstack.conf.d" / "pyxis.conf"
    if not conf.exists() or conf.read_text() != pyxis.plugstack_line + "\n":
        # Read by srun and each job step when they start: no daemon restart needed.
        atomic_write_text(conf, pyxis.plugstack_line + "\n")
    return Cluster(slurm_env=slurm_env, enroot=enroot, pyxis=pyxis, srtctl=ensure_srtctl(root, model_paths=model_paths))
