"""Slurm runner: renders its own batch script, submits with `sbatch --parsable`, polls squeue/sacct.

The container is started by digest in one of two ways (chosen by the pipeline):
  - "docker": `docker run` on the node (plain nodes, like this machine's one-node Slurm);
  - "pyxis":  `srun --container-image=...` (pyxis/enroot, GPU clusters).
Command jobs (no image) run their command directly. Results land on a filesystem the submit host
shares with the nodes (the job's out_dir), so `collect` only checks them.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Literal, get_args

from servestack.cluster.enroot import ENROOT_MIN_VERSION, parse_enroot_version
from servestack.errors import CommandError, ServestackError
from servestack.records.imageref import ImageRef
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait, check_recipe_before_submit
from servestack.runners.preflight import MARKER, SCRIPT_NAME
from servestack.runners.preflight import SCRIPT as PREFLIGHT_SCRIPT
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import run
from servestack.util.yamlfile import UserModel


def pull_reference(image: str, registry_map: dict[str, str] | None = None) -> str:
    """The image by digest as pyxis takes it (`registry#repository@sha256:...`), on the registry
    the nodes pull from."""
    ref = ImageRef.parse(image)
    mapped = (registry_map or {}).get(ref.registry) if ref.registry is not None else None
    if mapped:
        ref = ImageRef.parse(f"{mapped}/{ref.repository}@{ref.digest}")
    return ref.enroot


def format_time_limit(seconds: int) -> str:
    """Slurm's D-HH:MM:SS, never below one minute."""
    seconds = max(60, int(seconds))
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


# pyxis 0.2x needs enroot >= 3.4 (`enroot import` of OCI images by digest, `enroot digest`).
ContainerMode = Literal["auto", "docker", "pyxis"]
CONTAINER_MODES: tuple[ContainerMode, ...] = get_args(ContainerMode)


def choose_container(wanted: str, *, srun_help: str, enroot_version: str | None, docker: bool) -> str:
    """The container mode a job uses: pyxis when srun has `--container-image` (and enroot is new
    enough), else docker; `wanted` pins one. Raises naming what is missing."""
    if wanted not in CONTAINER_MODES:
        raise ServestackError(f"unknown Slurm container mode {wanted!r} ({' | '.join(CONTAINER_MODES)})")
    has_pyxis = "--container-image" in srun_help
    if wanted == "pyxis" or (wanted == "auto" and has_pyxis):
        if not has_pyxis:
            raise ServestackError("container mode pyxis: srun has no --container-image option; pyxis is not in "
                                  "this cluster's plugstack.conf")
        if enroot_version is None:
            raise ServestackError("container mode pyxis: `enroot` is not on PATH (pyxis runs it on the nodes)")
        version = parse_enroot_version(enroot_version)
        if version < ENROOT_MIN_VERSION:
            have, need = ".".join(map(str, version)), ".".join(map(str, ENROOT_MIN_VERSION))
            raise ServestackError(f"container mode pyxis: enroot {have} is older than {need}; upgrade it")
        return "pyxis"
    if not docker:
        raise ServestackError("no container runtime for Slurm jobs: srun has no --container-image (pyxis) and "
                              "`docker` is not on PATH")
    return "docker"


def preflight(cfg: SlurmConfig) -> str:
    """Probe this submit host (srun's options, `enroot version`, docker) and choose the mode."""
    import shutil

    env = cfg.env or {}
    path = env.get("PATH")
    srun_help = run(["srun", "--help"], env=cfg.env, check=False, timeout=30).stdout or ""
    enroot = shutil.which("enroot", path=path)
    version = run([enroot, "version"], check=False, timeout=30).stdout if enroot else None
    return choose_container(cfg.container, srun_help=srun_help, enroot_version=version,
                            docker=shutil.which(cfg.docker, path=path) is not None)


class SlurmSettings(UserModel):
    """The pipeline file's `runner.slurm` (also read by the srtctl runner: `local_cluster`)."""

    partition: str | None = None
    account: str | None = None
    container: ContainerMode = "auto"  # pyxis when the cluster has it, else docker (preflight)
    extra_sbatch: tuple[str, ...] = ()
    local_cluster: bool = False  # start this machine's one-node Slurm (services.ensure_slurm)


class SlurmConfig(SlurmSettings):
    """The runner's configuration: the pipeline's settings, and what the process that runs it adds."""

    docker: str = "docker"
    shm_size: str = "2g"  # docker's 64 MB default is too small for vLLM's shared-memory queues
    poll_seconds: float = 2.0
    env: dict[str, str] | None = None  # environment for sbatch/squeue (e.g. SLURM_CONF)
    registry_map: dict[str, str] | None = None  # registry the nodes pull from, per registry in the ref


def render_batch_script(spec: JobSpec, cfg: SlurmConfig) -> str:
    jobs_dir = spec.jobs_dir
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --output={jobs_dir}/slurm-%j.out",
        f"#SBATCH --time={format_time_limit(spec.time_limit_s)}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
    ]
    if cfg.partition:
        lines.append(f"#SBATCH --partition={cfg.partition}")
    if cfg.account:
        lines.append(f"#SBATCH --account={cfg.account}")
    if spec.gpus:
        lines.append(f"#SBATCH --gres=gpu:{spec.gpus}")
    # Ask Slurm to send TERM to the batch shell before the time limit kills everything.
    lines.append("#SBATCH --signal=B:TERM@60")
    lines += [f"#SBATCH {x}" for x in cfg.extra_sbatch]
    lines += ["", "set -u", f"mkdir -p {shlex.quote(str(spec.out_dir))}", f"cd {shlex.quote(str(jobs_dir))}"]
    for k, v in sorted(spec.env.items()):
        lines.append(f"export {k}={shlex.quote(v)}")
    if spec.preflight is not None and spec.preflight.runs:
        script = jobs_dir / SCRIPT_NAME
        lines += ["# the node preflight, on every node, before any server starts"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.preflight.env().items())]
        lines += [f"srun --ntasks-per-node=1 bash {shlex.quote(str(script))} || "
                  f"{{ echo '{MARKER} failed: the job ends before any server starts' >&2; exit 3; }}"]
    argv = spec.argv()
    if spec.image is None:
        body = shlex.join(argv)
        lines += [
            "# container-free command job",
            f"{body} &",
            "child=$!",
            "trap 'kill -TERM $child 2>/dev/null; wait $child; exit 143' TERM INT",
            "wait $child",
        ]
    elif cfg.container == "docker":
        name = "servestack-${SLURM_JOB_ID}"
        run_argv = [cfg.docker, "run", "--rm", "--name", "__NAME__", "--shm-size", cfg.shm_size]
        if spec.gpus:
            run_argv += ["--gpus", "all"]
        for m in spec.mounts:
            run_argv += ["-v", f"{m.host}:{m.container}" + (":ro" if m.read_only else "")]
        for k in sorted(spec.env):
            run_argv += ["-e", k]
        run_argv += [spec.image, *argv]
        body = shlex.join(run_argv).replace("__NAME__", f'"{name}"')
        lines += [
            "# the image, started by digest with docker on this node",
            f"trap '{cfg.docker} kill \"{name}\" >/dev/null 2>&1; exit 143' TERM INT",
            f"{body} &",
            "wait $!",
        ]
    elif cfg.container == "pyxis":
        mounts = ",".join(f"{m.host}:{m.container}" + (":ro" if m.read_only else "") for m in spec.mounts)
        image = pull_reference(spec.image, cfg.registry_map)
        srun = ["srun", "--ntasks=1", f"--container-image={image}", "--no-container-mount-home"]
        if mounts:
            srun.append(f"--container-mounts={mounts}")
        srun += ["--container-env=" + ",".join(sorted(spec.env))] if spec.env else []
        lines += [
            "# the image, started by digest with pyxis/enroot",
            f"{shlex.join([*srun, *argv])} &",
            "child=$!",
            "trap 'kill -TERM $child 2>/dev/null; wait $child; exit 143' TERM INT",
            "wait $child",
        ]
    else:
        raise ServestackError(f"unknown Slurm container mode {cfg.container!r} (docker | pyxis)")
    return "\n".join(lines) + "\n"


class SlurmRunner(PollingWait):
    name = "slurm"

    def __init__(self, cfg: SlurmConfig | None = None):
        self.cfg = cfg or SlurmConfig()
        self._mode: str | None = None
        self.poll_seconds = self.cfg.poll_seconds
        self.vanish_after_s = 30.0
        self._unknown_since: dict[str, float] = {}

    # -- interface -----------------------------------------------------------------------------
    def submit(self, job: JobSpec) -> JobHandle:
        check_recipe_before_submit(job, "servestack.runners.slurm")
        job.jobs_dir.mkdir(parents=True, exist_ok=True)
        job.out_dir.mkdir(parents=True, exist_ok=True)
        if job.preflight is not None and job.preflight.runs:
            atomic_write_text(job.jobs_dir / SCRIPT_NAME, PREFLIGHT_SCRIPT)
        script = job.jobs_dir / f"{job.name}.{int(time.time() * 1000)}.sbatch"
        cfg = self.cfg
        if job.image is not None and cfg.container == "auto":
            # Once per runner, before the first image job: fail early, naming what is missing.
            self._mode = self._mode or preflight(cfg)
            cfg = cfg.model_copy(update={"container": self._mode})
        atomic_write_text(script, render_batch_script(job, cfg))
        os.chmod(script, 0o755)
        out = run(["sbatch", "--parsable", str(script)], env=self.cfg.env).stdout.strip()
        job_id = out.splitlines()[-1].split(";")[0].strip() if out else ""
        if not job_id.isdigit():
            raise ServestackError(f"sbatch --parsable printed {out!r}, expected a job id")
        return JobHandle(runner=self.name, job_id=job_id, spec=job, output_dir=job.jobs_dir)

    def state(self, handle: JobHandle) -> JobState:
        st = slurm_state(handle.job_id, env=self.cfg.env)
        if st is not JobState.UNKNOWN:
            self._unknown_since.pop(handle.job_id, None)
            return st
        # Gone from squeue, no accounting, past MinJobAge: judge by what it left on disk.
        first = self._unknown_since.setdefault(handle.job_id, time.monotonic())
        if time.monotonic() - first >= self.vanish_after_s:
            return JobState.COMPLETED if not handle.spec.remaining() else JobState.FAILED
        return st

    def cancel(self, handle: JobHandle) -> None:
        scancel(handle.job_id, env=self.cfg.env)

    def collect(self, handle: JobHandle) -> Path:
        return handle.spec.out_dir


def scancel(job_id: str, env: dict[str, str] | None = None) -> None:
    run(["scancel", job_id], env=env, check=False)


def slurm_state(job_id: str, env: dict[str, str] | None = None) -> JobState:
    """squeue while the job is known to the controller, then sacct, then scontrol."""
    q = run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, check=False)
    text = (q.stdout or "").strip()
    if q.returncode == 0 and text:
        return JobState.parse(text.splitlines()[0])
    try:
        a = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], env=env, check=False)
        text = (a.stdout or "").strip()
        if a.returncode == 0 and text:
            return JobState.parse(text.splitlines()[0])
    except (FileNotFoundError, CommandError):
        pass
    s = run(["scontrol", "-o", "show", "job", job_id], env=env, check=False)
    for word in (s.stdout or "").split():
        if word.startswith("JobState="):
            return JobState.parse(word.split("=", 1)[1])
    return JobState.UNKNOWN
