"""srtctl runner: hands a bound srt-slurm recipe to real `srtctl apply` and reads srt-slurm's own results.

srtctl's contract (srt-slurm v1.0.68 src/srtctl/cli/submit.py, docs/cli.md):
  - `srtctl apply -f <recipe.yaml> -o <output base> --json -y` submits with sbatch and prints one
    JSON line per submission: {"status": "submitted", "slurm_job_id": "123", "output_dir":
    "<base>/123", ...} (errors: {"status": "error", "error": "..."} and exit 1).
  - `<output_dir>/` holds config.yaml, sbatch_script.sh, <job_id>.json and logs/; sa-bench writes
    `logs/sa-bench_isl_<ISL>_osl_<OSL>/results_concurrency_<C>_gpus_<G>[...].json` (vLLM
    benchmark_serving keys); the gsm8k benchmark (vLLM backend) saves
    `logs/accuracy/gsm8k_run<N>.json` ({accuracy, num_questions, invalid_rate, latency, ...});
    the dev-cpu recipes' custom benchmark (servestack's oracle) writes `logs/accuracy/agreement.json`.
The job itself is a Slurm job, so state and cancel go through squeue/sacct/scancel.

Binding (a copy of the recipe; the original stays untouched):
  - `model.container`: the image by digest, in enroot's `registry#repository@sha256:...` form,
    on the registry the nodes pull from (`registry_map`, e.g. the loopback registry -> the same
    storage behind token auth);
  - `model.path`: the host model directory when the job has one (srtctl mounts it at /model);
  - throughput: `benchmark.concurrencies` narrowed to the remaining points, so a retry redoes
    only those;
  - accuracy: GSM8K from the project (srt-slurm's gsm8k_eval.py reads train/test.jsonl from its
    temporary directory before it would download them): a per-job copy is mounted and TMPDIR
    points at it, so no job needs the network.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Field, ValidationInfo

from servestack.clients import agreement
from servestack.errors import ServestackError
from servestack.recipes.read import load_recipe
from servestack.runners import srtlogs
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait, check_recipe_before_submit
from servestack.runners.preflight import SCRIPT_NAME, NodePreflight
from servestack.runners.slurm import pull_reference, scancel, slurm_state
from servestack.runners.srtlogs import find_srt_results
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_bytes, atomic_write_text
from servestack.util.proc import run
from servestack.util.yamlfile import RelativePath, UserModel, relative_to_base

GSM8K_IN_CONTAINER = "/srtctl-gsm8k"
# Where a recipe's custom benchmark finds servestack's clients (the oracle: agreement.py), and where
# it writes its answers (srt-slurm mounts the job's log directory at /logs).
CLIENTS_IN_CONTAINER = "/opt/servestack-clients"
AGREEMENT_ANSWERS = "accuracy/agreement.json"


def _command(value: Any, info: ValidationInfo) -> tuple[str, ...]:
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
        raise ValueError("expected a command (string or list of words)")
    # ./bin/srtctl: relative to the project, so the pipeline works from any directory
    return tuple(str(relative_to_base(w, info)) if w.startswith(("./", "../")) else w for w in words)


class SrtctlSettings(UserModel):
    """The pipeline file's `runner.srtctl`."""

    executable: Annotated[tuple[str, ...], BeforeValidator(_command)] = ("srtctl",)
    output_dir: RelativePath | None = None  # srtctl's -o (default: next to each job's results)
    # With runner.slurm.local_cluster: the nodes of the cluster srtctl's jobs run on (1: this host;
    # more: nodes in network namespaces of their own, services.slurm_nodes).
    local_cluster_nodes: Annotated[int, Field(ge=1, le=32)] = 1


def bind_recipe(recipe: dict[str, Any], image: str | None, points: tuple[str, ...], points_field: str | None,
                *, model_dir: Path | None = None, gsm8k: Path | None = None, clients: Path | None = None) -> dict:
    bound = json.loads(json.dumps(recipe))  # deep copy of plain YAML data
    if image:
        bound.setdefault("model", {})["container"] = image
    if model_dir is not None:
        bound.setdefault("model", {})["path"] = str(model_dir)
    if points_field:
        section, _, key = points_field.partition(".")
        target = bound.setdefault(section, {})
        # A throughput point is <concurrency>[-r<repeat>]; one job measures one repeat of each.
        target[key] = [int(c) if c.isdigit() else c for c in dict.fromkeys(p.split("-r")[0] for p in points)]
    if gsm8k is not None:
        bound.setdefault("container_mounts", {})[str(gsm8k)] = GSM8K_IN_CONTAINER
        bound.setdefault("environment", {})["TMPDIR"] = GSM8K_IN_CONTAINER
    if clients is not None:
        bound.setdefault("container_mounts", {})[str(clients)] = CLIENTS_IN_CONTAINER
    return bound


def bind_preflight(bound: dict[str, Any], preflight: NodePreflight, recipe_file: Path) -> None:
    """srt-slurm runs a recipe's setup_script (from its configs/) in every worker's container before the
    worker starts, and a failing one ends the sweep: the preflight goes there, its limits in the workers'
    environment."""
    if bound.get("setup_script") not in (None, SCRIPT_NAME):
        raise ServestackError(f"{recipe_file}: setup_script is {bound['setup_script']!r}; the node preflight runs as "
                              f"srt-slurm's setup_script ({SCRIPT_NAME}): call it from yours, or pass --skip-preflight")
    bound["setup_script"] = SCRIPT_NAME
    backend = bound.setdefault("backend", {})
    disaggregated = (bound.get("resources") or {}).get("prefill_nodes") is not None
    for key in ("prefill_environment", "decode_environment") if disaggregated else ("aggregated_environment",):
        backend[key] = {**(backend.get(key) or {}), **preflight.env()}


def parse_apply_output(stdout: str) -> list[dict[str, Any]]:
    records = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def results_in(output_dir: Path) -> dict[str, Path]:
    """srt-slurm's result files under `<output_dir>/logs`, by point name: the concurrency for
    sa-bench, `repeat-<i>` for gsm8k_run<i+1>.json."""
    logs = output_dir / "logs"
    found: dict[str, Path] = {str(c): path for c, (path, _g) in find_srt_results(logs).items()}
    for path in sorted((logs / "accuracy").glob("gsm8k_run*.json")) if logs.is_dir() else []:
        index = path.stem[len("gsm8k_run"):]
        if index.isdigit():
            found.setdefault(f"repeat-{int(index) - 1}", path)
    if (logs / AGREEMENT_ANSWERS).is_file():
        found[agreement.POINT] = logs / AGREEMENT_ANSWERS
    return found


class SrtctlRunner(PollingWait):
    name = "srtctl"

    def __init__(self, executable: str | list[str] = "srtctl", output_base: Path | None = None,
                 env: dict[str, str] | None = None, poll_seconds: float = 2.0,
                 registry_map: dict[str, str] | None = None):
        self.executable = [executable] if isinstance(executable, str) else list(executable)
        self.output_base = output_base
        self.env = env
        self.poll_seconds = poll_seconds
        self.registry_map = dict(registry_map or {})
        self._unknown_since: dict[str, float] = {}

    def _gsm8k_copy(self, job: JobSpec) -> Path | None:
        data = job.extra.get("gsm8k_dir")
        if not data:
            return None
        # Writable (gsm8k_eval.py may write there; TMPDIR must be writable) and per job.
        copy = job.jobs_dir / "gsm8k"
        if not (copy / "test.jsonl").exists():
            tmp = job.jobs_dir / ".gsm8k.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(Path(str(data)), tmp)
            tmp.rename(copy)
        return copy.resolve()

    def submit(self, job: JobSpec) -> JobHandle:
        if job.recipe_file is None:
            raise ServestackError(f"{job.name}: the srtctl runner needs the job's srt-slurm recipe")
        check_recipe_before_submit(job, "servestack.runners.srtctl")
        recipe = load_recipe(job.recipe_file).data
        job.jobs_dir.mkdir(parents=True, exist_ok=True)
        image = pull_reference(job.image, self.registry_map) if job.image else None
        model_dir = job.extra.get("model_dir")
        bound = bind_recipe(recipe, image, job.points, job.extra.get("points_field"),  # type: ignore[arg-type]
                            model_dir=Path(str(model_dir)).resolve() if model_dir else None,
                            gsm8k=self._gsm8k_copy(job),
                            clients=Path(str(job.extra["clients_dir"])) if job.extra.get("clients_dir") else None)
        if job.preflight is not None and job.preflight.runs:
            bind_preflight(bound, job.preflight, job.recipe_file)
        bound_file = job.jobs_dir / f"{job.name}.{int(time.time() * 1000)}.yaml"
        atomic_write_text(bound_file, yaml.safe_dump(bound, sort_keys=False))
        base = (self.output_base or (job.jobs_dir / "srtctl-outputs")).resolve()
        base.mkdir(parents=True, exist_ok=True)
        proc = run([*self.executable, "apply", "-f", str(bound_file), "-o", str(base), "--json", "-y"],
                   env=self.env, check=False, timeout=600)
        records = parse_apply_output(proc.stdout or "")
        submitted = [r for r in records if r.get("status") == "submitted"]
        if proc.returncode != 0 or not submitted:
            errors = "; ".join(str(r.get("error")) for r in records if r.get("status") == "error")
            raise ServestackError(f"srtctl apply -f {bound_file} failed (exit {proc.returncode})"
                                  + (f": {errors}" if errors else f":\n{(proc.stdout or '')[-2000:]}"))
        rec = submitted[0]
        job_id = str(rec["slurm_job_id"])
        output_dir = Path(rec.get("output_dir") or base / job_id)
        console.detail("servestack.runners.srtctl", f"srtctl submitted {bound_file.name} as Slurm job {job_id} (outputs in {output_dir})")
        return JobHandle(runner=self.name, job_id=job_id, spec=job, output_dir=output_dir)

    def state(self, handle: JobHandle) -> JobState:
        st = slurm_state(handle.job_id, env=self.env)
        if st is JobState.UNKNOWN:
            first = self._unknown_since.setdefault(handle.job_id, time.monotonic())
            if time.monotonic() - first >= 30:
                return JobState.COMPLETED if self._results(handle) else JobState.FAILED
        return st

    def cancel(self, handle: JobHandle) -> None:
        handle.cancelled_by_us = True
        scancel(handle.job_id, env=self.env)

    def _results(self, handle: JobHandle) -> dict[str, Path]:
        return results_in(handle.output_dir) if handle.output_dir is not None else {}

    def placement(self, handle: JobHandle) -> dict[str, Any]:
        return srtlogs.placement(handle.output_dir) if handle.output_dir is not None else {}

    def collect(self, handle: JobHandle) -> Path:
        """Copy srt-slurm's result files to `<out_dir>/<point>.json` (atomically); keep the originals."""
        out = handle.spec.out_dir
        out.mkdir(parents=True, exist_ok=True)
        found = self._results(handle)
        repeated = bool(handle.spec.extra.get("points_field"))  # throughput: "4" is this job's repeat of 4
        for point in handle.spec.points:
            path = found.get(point) or (found.get(point.split("-r")[0]) if repeated else None)
            if path is not None and not (out / f"{point}.json").exists():
                atomic_write_bytes(out / f"{point}.json", path.read_bytes())
                console.detail("servestack.runners.srtctl", f"collected {path} -> {out / f'{point}.json'}")
        # Keep where srt-slurm put its logs, for the report.
        if handle.output_dir is not None:
            marker = handle.spec.jobs_dir / f"srtctl-{handle.job_id}.txt"
            atomic_write_text(marker, f"{handle.output_dir}\n")
        return out

