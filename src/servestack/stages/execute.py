"""Run the accuracy and throughput stages of a pipeline against an image, gate and report.

Layout: `build/<stack>/runs/<run id>/<stage>/` with one directory per recipe holding the point
files (`<concurrency>.json`: vLLM's result JSON; `repeat-<i>.json`: the gsm8k client's), plus
`results.json` (normalized results and the verdict), `report.md` and plots. The run id is derived
from the image digest and the pipeline file, so rerunning the same thing resumes it: points with
a file on disk are not redone (the command line's --fresh measures again under a new id).
Planning the jobs is stages/jobs.py's; holding the throughput stage to a baseline, stages/baseline.py's.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from servestack.errors import InputError, StageFailed
from servestack.records.imageref import ImageRef
from servestack.records.stageresults import Failure, StageResult
from servestack.runners.driver import run_job
from servestack.runners.interface import Runner
from servestack.runners.selection import RUNNERS, make_runner
from servestack.stages.baseline import hold_to_baseline, measure_alongside_baseline
from servestack.stages.gates import Verdict, format_verdict, placement_failures
from servestack.stages.jobs import (  # noqa: F401  (re-exported: where callers have always found the planner)
    PYCACHE,
    PYCACHE_ENV,
    RESULTS,
    _Planned,
    _recipe,
    _selected,
    plan_stage,
    pycache_dir,
    write_job_files,
)
from servestack.stages.kinds import Reading, kind_of
from servestack.stages.pipeline import STAGES, Pipeline, Stage, ThroughputStage, load_pipeline
from servestack.util.console import console
from servestack.util.progress import phase
from servestack.util.project import Project


def run_id_for(pipeline: Pipeline, image_ref: str) -> str:
    h = hashlib.sha256()
    h.update(image_ref.encode())
    h.update(Path(pipeline.file).read_bytes())
    return h.hexdigest()[:12]

def _read_timing(planned: list[_Planned], since: float) -> tuple[float | None, float, dict[str, float]]:
    """Client and server start-up seconds that run_points recorded since `since` (this invocation)."""
    client: float | None = None
    server = 0.0
    per_point: dict[str, float] = {}
    for p in planned:
        f = p.spec.out_dir / ".timing.jsonl"
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line)
                if float(ev.get("started") or 0) < since:
                    continue
                secs = float(ev["seconds"])
            except (ValueError, KeyError, TypeError):
                continue
            if ev.get("event") == "point":
                client = (client or 0.0) + secs
                per_point[f"{p.key}/{ev.get('point')}"] = per_point.get(f"{p.key}/{ev.get('point')}", 0.0) + secs
            elif ev.get("event") == "server":
                server += secs
    return client, server, per_point


# The client's own wall time, as each kind of result file names it: servestack's clients
# (client_seconds), vLLM's serving benchmark as srt-slurm's sa-bench runs it (duration) and
# srt-slurm's gsm8k_eval.py (latency).
CLIENT_SECONDS_KEYS = ("client_seconds", "duration", "latency")


def _reported_client_seconds(f: Path) -> float | None:
    """The wall time of the client that wrote a result file, when the file records it."""
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    for key in CLIENT_SECONDS_KEYS:
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def collect_stage(pipeline: Pipeline, stage: Stage, planned: list[_Planned], image_ref: str,
                  runner_name: str, stage_dir: Path, jobs: list[dict], since: float = 0.0) -> StageResult:
    kind = kind_of(stage)
    bench = 0.0
    measured_now: list[str] = []
    reported_client: dict[str, float] = {}
    problems: list[str] = []
    missing: list[str] = []
    readings: list[tuple[str, Reading]] = []
    for p in planned:
        for point in p.points:
            f = p.spec.point_file(point)
            if not f.exists():
                missing.append(f"{p.recipe.name}/{point}")
                continue
            fresh = f.stat().st_mtime >= since
            try:
                reading = kind.read(f, point, p)
                readings.append((p.key, reading))
                if fresh:
                    bench += reading.seconds
                    measured_now.append(f"{p.key}/{point}")
                    reported = _reported_client_seconds(f)
                    if reported is not None:  # e.g. from the srtctl runner's result files
                        reported_client[f"{p.key}/{point}"] = reported
            except InputError as exc:
                problems.append(str(exc))
                missing.append(f"{p.key}/{point}")
    client, server, per_point = _read_timing(planned, since)
    if client is None and reported_client and len(reported_client) == len(measured_now):
        client, per_point = sum(reported_client.values()), reported_client
    timing = {
        "started": round(since, 3),
        "measured_points": measured_now,  # points this invocation ran (the rest were on disk)
        "client_seconds": None if client is None else round(client, 3),  # client processes, per run_points
        "client_seconds_per_point": {k: round(v, 3) for k, v in per_point.items()},
        "server_startup_seconds": round(server, 3),
        "benchmark_seconds": round(bench, 3),  # the benchmarks' own durations (vLLM duration, gsm8k seconds)
    }
    judged = kind.judge(stage, planned, readings)
    verdict = judged.verdict
    verdict.failures.extend(Failure(gate="unreadable", recipe="-", point=None, message=msg) for msg in problems)
    verdict.failures.extend(placement_failures(jobs))
    return StageResult(stack=pipeline.stack, pipeline=pipeline.name, stage=stage.name, image=image_ref,
                       runner=runner_name, out_dir=stage_dir, jobs=jobs, throughput=judged.throughput,
                       accuracy=judged.accuracy, agreement=judged.agreement, missing=missing, verdict=verdict,
                       timing=timing, conditions=judged.conditions)


def run_stage(project: Project, pipeline_name: str, stage: str, image_ref: str,
              runner: Runner | None = None, *, run_id: str | None = None,
              recipes: tuple[str, ...] | None = None, skip_preflight: bool = False,
              min_repeats: int = 1) -> StageResult:
    """Run one stage (accuracy | throughput) of pipelines/<pipeline_name>.yaml against image_ref.

    `min_repeats` raises the throughput stage's repeats to at least that many (bump: enough for a
    regression verdict).

    `runner` (default: the pipeline's) runs the recipes it can start; disaggregated ones it cannot
    go to the pipeline's runner.disaggregated. `recipes` narrows the stage to those names.

    Writes results.json, report.md and plots under build/<stack>/runs/<run id>/<stage>/ and
    returns the StageResult; `result.passed` tells whether the gates held (callers exit non-zero
    when it is False; `raise_for_verdict` does that as an exception).
    """
    from servestack.stages import stage_report as report

    if stage not in STAGES:
        raise InputError(pipeline_name, "stage", f"{stage!r} is not one of {', '.join(STAGES)}")
    ImageRef.parse(image_ref)
    pipeline = load_pipeline(project.pipelines / f"{pipeline_name}.yaml", project.root)
    if stage not in pipeline.stages.defined():
        raise InputError(pipeline.file, f"stages.{stage}", "this pipeline does not define the stage")
    settings = _selected(pipeline, recipes).get(stage)
    if settings is None:
        raise InputError(pipeline.file, f"stages.{stage}.recipes", f"runs none of {', '.join(recipes or ())}")
    if isinstance(settings, ThroughputStage) and settings.repeats < min_repeats:
        settings = settings.model_copy(update={"repeats": min_repeats})
    rid = run_id or run_id_for(pipeline, image_ref)
    stage_dir = project.artifacts(pipeline.stack) / "runs" / rid / stage
    stage_dir.mkdir(parents=True, exist_ok=True)
    started, t0 = time.time(), time.monotonic()
    if isinstance(settings, ThroughputStage) and settings.gate.baseline and settings.gate.alongside:
        result = measure_alongside_baseline(project, pipeline, settings, image_ref, rid, stage_dir, recipes)
        _finish_timing(result.timing, time.monotonic() - t0)
        report.write_stage(result)
        console.detail("servestack.stages", format_verdict(result.verdict))
        return result
    runner = runner or make_runner(pipeline)
    # Plan for the runner that runs the jobs (the CLI's --runner may differ from the pipeline's).
    kind = runner.name if runner.name in RUNNERS else pipeline.runner.kind
    planned = plan_stage(project, pipeline, settings, image_ref, stage_dir, kind, skip_preflight=skip_preflight)
    write_job_files(planned)
    policy = pipeline.retry.policy()
    runners = {kind: runner}
    jobs = []
    for p in planned:
        if p.runner_kind not in runners:
            runners[p.runner_kind] = make_runner(pipeline, p.runner_kind)
        job_runner = runners[p.runner_kind]
        outcome = run_job(job_runner, p.spec, policy, timeout_s=settings.time_limit + 600)
        jobs.append({**outcome.to_dict(), "runner": job_runner.name})
    used = "+".join(dict.fromkeys(j["runner"] for j in jobs)) or runner.name
    result = collect_stage(pipeline, settings, planned, image_ref, used, stage_dir, jobs, since=started)
    if isinstance(settings, ThroughputStage) and settings.gate.baseline:
        result = hold_to_baseline(project, pipeline, settings, result, rid)
    _finish_timing(result.timing, time.monotonic() - t0)
    report.write_stage(result)
    console.detail("servestack.stages", format_verdict(result.verdict))
    return result


def run_pipeline(project: Project, pipeline_name: str, image_ref: str, runner: Runner | None = None,
                 stages: tuple[str, ...] | None = None, *, run_id: str | None = None,
                 recipes: tuple[str, ...] | None = None, skip_preflight: bool = False,
                 min_repeats: int = 1) -> list[StageResult]:
    """Every stage the pipeline defines (accuracy, then throughput), then the run-level report;
    `recipes` narrows the run to those recipes (stages that run none of them are skipped)."""
    from servestack.stages import stage_report as report

    t0 = time.monotonic()
    pipeline = load_pipeline(project.pipelines / f"{pipeline_name}.yaml", project.root)
    wanted = [s for s in _selected(pipeline, recipes) if stages is None or s in stages]
    results = []
    for stage in wanted:
        with phase(f"pipeline {pipeline_name}", f"stage {stage} ({wanted.index(stage) + 1} of {len(wanted)})"):
            results.append(run_stage(project, pipeline_name, stage, image_ref, runner, run_id=run_id,
                                     recipes=recipes, skip_preflight=skip_preflight, min_repeats=min_repeats))
    if results:
        timing = {"runner": results[0].runner, **_sum_timing([r.timing for r in results])}
        _finish_timing(timing, time.monotonic() - t0)
        report.write_run(results[0].out_dir.parent, results, timing)
    return results


def _sum_timing(parts: list[dict]) -> dict:
    out: dict = {"client_seconds": None, "server_startup_seconds": 0.0, "benchmark_seconds": 0.0}
    for t in parts:
        if t.get("client_seconds") is not None:
            out["client_seconds"] = round((out["client_seconds"] or 0.0) + t["client_seconds"], 3)
        out["server_startup_seconds"] = round(out["server_startup_seconds"] + t.get("server_startup_seconds", 0.0), 3)
        out["benchmark_seconds"] = round(out["benchmark_seconds"] + t.get("benchmark_seconds", 0.0), 3)
    return out


def _finish_timing(timing: dict, wall: float) -> None:
    """Wall time, and the overhead: wall time not spent inside the benchmark clients."""
    timing["wall_seconds"] = round(wall, 3)
    inside = timing.get("client_seconds")
    timing["overhead_basis"] = "client_seconds" if inside is not None else "benchmark_seconds"
    if inside is None:
        inside = timing.get("benchmark_seconds", 0.0)
    timing["overhead_seconds"] = round(wall - inside, 3)
    timing["overhead_fraction"] = round((wall - inside) / wall, 4) if wall > 0 else None


def stage_failed(result: StageResult) -> StageFailed:
    """The error a failed stage ends the command with: its verdict, and a baseline verdict's exit code."""
    failures = result.verdict.failures if result.verdict else ()
    return StageFailed(format_verdict(result.verdict), failed_gates={f.gate for f in failures}, result=result)


def raise_for_verdict(result: StageResult) -> StageResult:
    if not result.passed:
        raise stage_failed(result)
    return result


__all__ = ["Verdict", "plan_stage", "raise_for_verdict", "run_id_for", "run_pipeline", "run_stage", "stage_failed",
           "write_job_files"]
