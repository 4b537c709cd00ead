"""srtctl runner: hands a bound srt-slurm recipe to `srtctl apply` and reads srt-slurm's own results.

srtctl's contract (srt-slurm src/srtctl/cli/submit.py, docs/cli.md, docs/monitoring.md):
  - `srtctl apply -f <recipe.yaml> -o <output base> --json -y` submits with sbatch and, with
    --json, prints one JSON line per submission on stdout:
      {"status": "submitted", "slurm_job_id": "123", "job_name": ..., "output_dir": "<base>/123",
       "metadata_path": "<base>/123/123.json", "config_path": ..., "tags": ...}
    (errors: {"status": "error", "error": "..."} and exit 1). Without --json it prints
    "Job <id> submitted!" and "Logs: <base>/<id>/logs".
  - `<output_dir>/` holds config.yaml, sbatch_script.sh, <job_id>.json and logs/; sa-bench writes
    `logs/sa-bench_isl_<ISL>_osl_<OSL>/results_concurrency_<C>_gpus_<G>[_ctx_<P>_gen_<D>].json`
    (vLLM benchmark_serving keys); the gsm8k benchmark saves {accuracy, num_questions, ...}.
The job itself is a Slurm job, so state/cancel go through squeue/sacct/scancel.

Binding: the recipe is copied with `model.container` set to the image digest and, for throughput,
`benchmark.concurrencies` narrowed to the remaining points (so a retry redoes only those).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from ..errors import ServestackError
from ..fsutil import atomic_write_bytes, atomic_write_text
from ..proc import run
from ..stages.results import find_srt_results
from .base import JobHandle, JobSpec, JobState, PollingWait
from .slurm import scancel, slurm_state

log = logging.getLogger("servestack.runners.srtctl")


def bind_recipe(recipe: dict[str, Any], image: str | None, points: tuple[str, ...], points_field: str | None) -> dict:
    bound = json.loads(json.dumps(recipe))  # deep copy of plain YAML data
    if image:
        bound.setdefault("model", {})["container"] = image
    if points_field:
        section, _, key = points_field.partition(".")
        target = bound.setdefault(section, {})
        target[key] = [int(p) if p.isdigit() else p for p in points]
    return bound


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


class SrtctlRunner(PollingWait):
    name = "srtctl"

    def __init__(self, executable: str | list[str] = "srtctl", output_base: Path | None = None,
                 env: dict[str, str] | None = None, poll_seconds: float = 2.0):
        self.executable = [executable] if isinstance(executable, str) else list(executable)
        self.output_base = output_base
        self.env = env
        self.poll_seconds = poll_seconds
        self._unknown_since: dict[str, float] = {}

    def submit(self, job: JobSpec) -> JobHandle:
        if job.recipe_file is None:
            raise ServestackError(f"{job.name}: the srtctl runner needs the job's srt-slurm recipe")
        recipe = yaml.safe_load(Path(job.recipe_file).read_text()) or {}
        bound = bind_recipe(recipe, job.image, job.points, job.extra.get("points_field"))  # type: ignore[arg-type]
        job.jobs_dir.mkdir(parents=True, exist_ok=True)
        bound_file = job.jobs_dir / f"{job.name}.{int(time.time() * 1000)}.yaml"
        atomic_write_text(bound_file, yaml.safe_dump(bound, sort_keys=False))
        base = self.output_base or (job.jobs_dir / "srtctl-outputs")
        base.mkdir(parents=True, exist_ok=True)
        proc = run([*self.executable, "apply", "-f", str(bound_file), "-o", str(base), "--json", "-y"],
                   env=self.env, check=False)
        records = parse_apply_output(proc.stdout or "")
        submitted = [r for r in records if r.get("status") == "submitted"]
        if proc.returncode != 0 or not submitted:
            errors = "; ".join(str(r.get("error")) for r in records if r.get("status") == "error")
            raise ServestackError(f"srtctl apply -f {bound_file} failed (exit {proc.returncode})"
                                  + (f": {errors}" if errors else f":\n{(proc.stdout or '')[-2000:]}"))
        rec = submitted[0]
        return JobHandle(self.name, str(rec["slurm_job_id"]), job, output_dir=Path(rec["output_dir"]))

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
        """srt-slurm result files of this job, by point name."""
        if handle.output_dir is None:
            return {}
        logs = handle.output_dir / "logs"
        found: dict[str, Path] = {str(c): path for c, (path, _g) in find_srt_results(logs).items()}
        for path in sorted(logs.glob("**/*.json")) if logs.is_dir() else []:
            if path.name.startswith("results_concurrency_"):
                continue
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(data, dict) and "accuracy" in data and "num_questions" in data:
                found.setdefault("repeat-0", path)
        return found

    def collect(self, handle: JobHandle) -> Path:
        """Copy srt-slurm's result files to `<out_dir>/<point>.json` (atomically); keep the originals."""
        out = handle.spec.out_dir
        out.mkdir(parents=True, exist_ok=True)
        for point, path in self._results(handle).items():
            if point in handle.spec.points and not (out / f"{point}.json").exists():
                atomic_write_bytes(out / f"{point}.json", path.read_bytes())
                log.info("collected %s -> %s", path, out / f"{point}.json")
        # Keep where srt-slurm put its logs, for the report.
        if handle.output_dir is not None:
            marker = handle.spec.jobs_dir / f"srtctl-{handle.job_id}.txt"
            atomic_write_text(marker, f"{handle.output_dir}\n")
        return out

