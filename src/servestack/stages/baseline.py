"""The throughput stage held to another image: `gate.baseline`, measured alongside or stored.

Alongside (`gate.alongside: true`, the baseline an image by digest): the stage is one interleaved
session of both images (interleave.py), and each point's verdict is paired. Stored (a run id, a run
directory, a pulled publication): this run's points against the baseline's, apart, and every verdict
says "not measured alongside". Either way the comparison goes where comparisons.place puts it, and
each gated point's regression (and undecided, when `undecided_fails`) is a failure of the stage.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from servestack import compare
from servestack.compare import comparisons, verdicts
from servestack.errors import InputError
from servestack.records.imageref import names_a_digest
from servestack.records.stageresults import Check, Failure, StageResult, Verdict
from servestack.stages.gates import evaluate_throughput
from servestack.stages.pipeline import Pipeline, ThroughputStage
from servestack.util.project import Project


def _judged(comparison: compare.Comparison, verdict: Verdict, gate_baseline: str) -> None:
    failing = {(ch.recipe, ch.concurrency, ch.metric): msg for ch, msg in compare.gate_failures(comparison)}
    for ch in comparison.gated():
        where = f"c={ch.concurrency}"
        msg = failing.get((ch.recipe, ch.concurrency, ch.metric))
        measured = 0.0 if ch.change is None else ch.change
        verdict.checks.append(Check(gate="regression", recipe=ch.recipe, point=where, measured=measured,
                                    required=-comparison.policy.threshold,
                                    passed=msg is None))
        if msg is not None:
            verdict.failures.append(
                Failure(
                    gate=ch.verdict if ch.verdict == verdicts.UNDECIDED else "regression",
                    recipe=ch.recipe,
                    point=where,
                    message=msg,
                    measured=measured,
                    required=-comparison.policy.threshold,
                )
            )
    if not comparison.gated():
        verdict.failures.append(Failure(gate="regression", recipe="-", point=None, message=f"nothing to hold to {gate_baseline}: "
                                        + ("; ".join(comparison.not_compared) or "no point in common")))


def _baseline(pipeline: Pipeline, stage: ThroughputStage) -> str:
    if stage.gate.baseline is None:
        raise InputError(pipeline.file, "stages.throughput.gate.baseline", "not set: no image to hold the stage to")
    return stage.gate.baseline


def hold_to_baseline(project: Project, pipeline: Pipeline, stage: ThroughputStage, result: StageResult,
                     run_id: str) -> StageResult:
    """This run's measured points against a stored baseline's: the result with their verdicts and the comparison."""
    gate, baseline = stage.gate, _baseline(pipeline, stage)
    key = None if gate.baseline_key is None else (project.root / gate.baseline_key)
    base_run = compare.slug(baseline)
    out = comparisons.place(project, pipeline.stack, baseline, base_run, result.image, run_id)
    if out.exists():
        import shutil

        shutil.rmtree(out / "pulled", ignore_errors=True)  # judged afresh: the publication is pulled again
    try:
        base, invalid = compare.load_side(baseline, runs=project.artifacts(pipeline.stack) / "runs",
                                          pulled=out / "pulled", key=key, label=f"baseline {base_run}")
    except InputError as exc:
        raise InputError(pipeline.file, "stages.throughput.gate.baseline", str(exc)) from exc
    here, _ = compare.side_from_stages([result], f"this run {run_id}")
    comparison = compare.compare(base, here, gate.policy(), invalid=invalid)
    report = comparisons.write(comparison, out)
    verdict = result.verdict or Verdict(stage=result.stage)
    _judged(comparison, verdict, baseline)
    return replace(result, verdict=verdict, comparison=str(report))


def measure_alongside_baseline(project: Project, pipeline: Pipeline, stage: ThroughputStage, image_ref: str, run_id: str,
                               stage_dir: Path, recipes: tuple[str, ...] | None) -> StageResult:
    """The stage as one interleaved session of the baseline image (A) and this one (B)."""
    from servestack.stages import interleave

    gate, baseline = stage.gate, _baseline(pipeline, stage)
    if not names_a_digest(baseline):
        raise InputError(pipeline.file, "stages.throughput.gate.baseline",
                         f"{baseline!r}: measured alongside (gate.alongside) needs an image by digest to run")
    session, comparison, report = interleave.measure_and_compare(
        project, pipeline.stack, interleave.pair(baseline, image_ref, pipeline.name), run_id,
        ("baseline", "this run"), gate.policy(), recipes=recipes)
    verdict = evaluate_throughput(session.points["b"], {}, gate.config())
    _judged(comparison, verdict, baseline)
    return StageResult(stack=pipeline.stack, pipeline=pipeline.name, stage="throughput", image=image_ref,
                       runner="local", out_dir=stage_dir, throughput=session.points["b"],
                       conditions=session.conditions["b"],
                       timing={"measured_points": [f"{p.recipe}/{p.concurrency}-r{p.repeat}"
                                                   for p in session.points["b"]],
                               "client_seconds": sum(d.seconds for d in session.decided),
                               "server_startup_seconds": 0.0, "benchmark_seconds": 0.0},
                       verdict=verdict, comparison=str(report))
