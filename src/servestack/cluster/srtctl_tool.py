"""srtctl (NVIDIA/srt-slurm) on this machine: its venv, its cluster config and the setup scripts its jobs run."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from servestack import resources, settings
from servestack.cluster.vendored import (
    PYTHON312_ENV,
    built,
    cache_key,
    executable,
    link,
    unpack,
    vendor_archive,
)
from servestack.errors import ClusterToolsMissing
from servestack.recipes.srtslurm import SRT_SLURM
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import run


def find_python312() -> Path:
    """A working Python 3.12 for srt-slurm's jobs (`uv sync --python 3.12` in its batch script).

    $SERVESTACK_PYTHON312, else the first of `python3.12` on PATH, a pyenv version, or one that
    uv manages, that really runs (a pyenv shim for an inactive version does not).
    """
    candidates: list[str] = []
    configured = settings.value(PYTHON312_ENV)
    if configured:
        candidates.append(configured)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        candidates.append(os.path.join(d, "python3.12"))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv_root.glob("versions/3.12*/bin/python3.12"), reverse=True)]
    uv = shutil.which("uv")
    if uv:
        found = run([uv, "python", "find", "--managed-python", "3.12"], check=False, timeout=30)
        if found.returncode == 0 and found.stdout.strip():
            candidates.append(found.stdout.strip().splitlines()[-1])
    for c in candidates:
        if not os.access(c, os.X_OK):
            continue
        probe = run([c, "-c", "import sys; print(sys.executable, sys.version_info[:2] == (3, 12))"],
                    check=False, timeout=30)
        words = probe.stdout.split()
        if probe.returncode == 0 and words[-1:] == ["True"]:
            return Path(words[0])
    raise ClusterToolsMissing(
        f"no working Python 3.12 (srt-slurm's jobs run `uv sync --python 3.12`); install one and put "
        f"it on PATH or set {PYTHON312_ENV}"
    )



@dataclass(frozen=True, kw_only=True)
class Srtctl:
    """An installed srtctl: the command, its source tree (the job runs from it) and the
    environment every call needs (SRTSLURM_CONFIG, PATH with its uv)."""

    executable: Path
    source: Path
    config: Path
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [str(self.executable), *args]


def _build_srtctl(archive: Path, python312: Path) -> Callable[[Path], None]:
    def build(home: Path) -> None:
        tree = unpack(archive, home / "src")
        venv = home / "venv"
        uv = shutil.which("uv") or sys.executable + " -m uv"
        run([*uv.split(), "venv", "--quiet", "--python", sys.executable, str(venv)], timeout=300)
        # uv from PyPI goes into the venv too: srt-slurm's job puts <tree>/bin first on PATH and
        # needs a real uv there (a shim or a login node's uv may not run on the compute node).
        run([*uv.split(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(tree), "uv"],
            timeout=900)
        # What srt-slurm's `make setup` downloads from GitHub, from this machine instead:
        # NATS and etcd from Debian (run inside the job's container from /configs), uv from PyPI.
        for name, tool in (("nats-server", "nats-server"), ("etcd", "etcd")):
            found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin")
            if not found:
                raise ClusterToolsMissing(f"`{tool}` is not installed (srt-slurm's jobs start it); run .ci/bootstrap")
            shutil.copy2(found, tree / "configs" / name)
        link(venv / "bin" / "uv", tree / "bin" / "uv")
        link(python312, tree / "bin" / "python3.12")
        # Tachometer (GPU telemetry) is off unless a recipe asks for it; apply only checks the file.
        executable(tree / "bin" / "tachometer-scraper",
                    "#!/bin/sh\necho 'tachometer-scraper is not installed on this cluster' >&2\nexit 1\n")
        # The job's environment (`uv sync --python 3.12`), made once here rather than by the
        # first job (it needs the package index; a job should not).
        run([str(tree / "bin" / "uv"), "sync", "--quiet", "--python", str(python312), "--no-dev"], cwd=tree,
            env={"UV_PROJECT_ENVIRONMENT": str(tree / ".venv-compute")}, timeout=900)

    return build


# srt-slurm's per-recipe hook (`setup_script: <name>`, a file in the tree's configs/) that this
# cluster adds, as a site adds its own scripts to its srt-slurm checkout. srtctl runs it inside
# each worker's container, with that worker's environment (prefill_environment, ...), as a child
# of the shell that then starts the worker. srt-slurm has no per-worker CPU setting (its
# srun_options are the same for every step of a job), so the pinning is done here, with the same
# affinity mask `srun --cpu-bind` or `taskset` would give; vLLM's CPU backend then runs on the
# CPUs the mask allows (get_allowed_cpu_list reads sched_getaffinity).
# The variable is a slice of the CPUs the step may use, not a CPU list: the step's cpuset (Slurm's,
# the container's) need not hold any particular host CPU, and taskset fails with EINVAL on one it lacks.
PIN_WORKER_CPUS_SCRIPT = resources.PIN_WORKER_CPUS
PIN_WORKER_CPUS_ENV = "PIN_WORKER_CPUS"


# srt-slurm runs `setup_script` (a file in its configs/) in every worker's container; the preflight
# (runners/preflight.py reads what it prints) is one, the CPU pinning another.
SETUP_SCRIPTS = (resources.PIN_WORKER_CPUS, resources.PREFLIGHT)


def _install_setup_scripts(tree: Path) -> None:
    for name in SETUP_SCRIPTS:
        text = resources.script(name)
        target = tree / "configs" / name
        if not target.is_file() or target.read_text() != text:
            executable(target, text)


def srtslurm_config(source: Path, *, partition: str, account: str,
                    model_paths: dict[str, str] | None = None) -> str:
    """srt-slurm's cluster config for this one-node cluster.

    Slurm 22.05 (Debian 12) knows neither --segment nor, without GRES, --gpus-per-node: both
    directives are off. srtctl_root is the unpacked tree the job `cd`s into.
    """
    import yaml

    return yaml.safe_dump(
        {
            "default_account": account,
            "default_partition": partition,
            "default_time_limit": "01:00:00",
            "use_gpus_per_node_directive": False,
            "use_segment_sbatch_directive": False,
            "use_exclusive_sbatch_directive": True,  # one server per node: never two on 2 cores
            "srtctl_root": str(source),
            "model_paths": dict(model_paths or {}),
        },
        sort_keys=False,
    )


def ensure_srtctl(root: Path | None = None, *, partition: str = "main", account: str = "servestack",
                  model_paths: dict[str, str] | None = None) -> Srtctl:
    """Real srtctl installed from the vendored srt-slurm tree (about 90 s the first time).

    Also writes its cluster config (srtslurm.yaml) for this machine's Slurm; returns the command
    and the environment to call it with.
    """
    archive = vendor_archive("srt-slurm")
    SRT_SLURM.check_snapshot(archive)
    python312 = find_python312()
    home = built("srtctl", cache_key(archive, str(python312)), _build_srtctl(archive, python312))
    [tree] = [p for p in (home / "src").iterdir() if p.is_dir()]
    # Outside the cached build: a new script reaches existing installs without rebuilding them.
    _install_setup_scripts(tree)
    wanted = srtslurm_config(tree, partition=partition, account=account, model_paths=model_paths)
    # One file per content: callers with other settings (parallel tests) never rewrite it under us.
    config = home / f"srtslurm-{hashlib.sha256(wanted.encode()).hexdigest()[:12]}.yaml"
    if not config.exists():
        atomic_write_text(config, wanted)
    env = {
        "SRTSLURM_CONFIG": str(config),
        "PATH": os.pathsep.join([str(home / "venv" / "bin"), os.environ.get("PATH", "")]),
    }
    return Srtctl(executable=home / "venv" / "bin" / "srtctl", source=tree, config=config, env=env)
