"""Gates: the numbers a stage must reach, and a verdict that names what failed and by how much.

Always (structural): every expected point has a result; per point completed == requested,
failed == 0 and output tokens > 0; every accuracy repeat answered at least one request.
Accuracy: mean strict-match accuracy over repeats >= threshold, per recipe; or, with the oracle,
every prompt of every recipe agrees with the reference recipe's answers (clients/agreement.py).
Throughput: total tokens/s per GPU >= baseline x (1 - tolerance), per point that has a baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servestack.clients.agreement import describe_failures
from servestack.stages.results import AccuracyRun, Check, Failure, ThroughputPoint, Verdict


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    accuracy_threshold: float | None = None
    # {recipe: {concurrency: tokens/s per GPU}}
    baselines: dict[str, dict[int, float]] = field(default_factory=dict)
    tolerance: float = 0.0


def _where(p: ThroughputPoint) -> str:
    return f"c={p.concurrency}" + (f" repeat {p.repeat}" if p.repeat else "")


def _structural(points: list[ThroughputPoint], out: list[Failure]) -> None:
    for p in points:
        where = _where(p)
        if p.completed != p.requested:
            out.append(Failure(gate="completed", recipe=p.recipe, point=where,
                               message=f"completed {p.completed} of {p.requested} requests", measured=p.completed, required=p.requested))
        if p.failed != 0:
            out.append(Failure(gate="failed", recipe=p.recipe, point=where, message=f"{p.failed} failed requests", measured=p.failed,
                               required=0))
        if p.output_tokens <= 0:
            out.append(Failure(gate="output_tokens", recipe=p.recipe, point=where, message="no output tokens", measured=p.output_tokens,
                               required=1))


def evaluate_throughput(points: list[ThroughputPoint], expected: dict[str, list[int]], gate: GateConfig,
                        stage: str = "throughput", repeats: int = 1) -> Verdict:
    """`expected`: {recipe: [concurrency, ...]} that should each have `repeats` points."""
    v = Verdict(stage=stage)
    have = {(p.recipe, p.concurrency, p.repeat) for p in points}
    for recipe, concs in expected.items():
        for c in concs:
            for k in range(repeats):
                if (recipe, c, k) not in have:
                    v.failures.append(Failure(gate="missing", recipe=recipe, point=f"c={c}" + (f" repeat {k}" if k else ""),
                                              message="no result for this point"))
    _structural(points, v.failures)
    for p in points:
        base = gate.baselines.get(p.recipe, {}).get(p.concurrency)
        if base is None:
            continue
        floor = base * (1.0 - gate.tolerance)
        ok = p.tokens_per_s_per_gpu >= floor
        v.checks.append(Check(gate="throughput", recipe=p.recipe, point=_where(p), measured=p.tokens_per_s_per_gpu, required=floor,
                              passed=ok))
        if not ok:
            v.failures.append(Failure(
                gate="throughput", recipe=p.recipe, point=_where(p),
                message=f"{p.tokens_per_s_per_gpu:.1f} tok/s/GPU < {floor:.1f} "
                f"(baseline {base:.1f} - {gate.tolerance:.0%})", measured=p.tokens_per_s_per_gpu, required=floor))
    return v


def evaluate_accuracy(runs: list[AccuracyRun], expected: dict[str, int], gate: GateConfig,
                      stage: str = "accuracy") -> Verdict:
    """`expected`: {recipe: number of repeats}."""
    v = Verdict(stage=stage)
    by_recipe: dict[str, list[AccuracyRun]] = {}
    for r in runs:
        by_recipe.setdefault(r.recipe, []).append(r)
    for recipe, repeats in expected.items():
        got = {r.repeat for r in by_recipe.get(recipe, [])}
        for i in range(repeats):
            if i not in got:
                v.failures.append(Failure(gate="missing", recipe=recipe, point=f"repeat {i}", message="no result for this repeat"))
    for recipe, rs in by_recipe.items():
        for r in rs:
            if r.n <= 0:
                v.failures.append(Failure(gate="completed", recipe=recipe, point=f"repeat {r.repeat}", message="no questions asked",
                                          measured=r.n, required=1))
            elif r.errors >= r.n:
                v.failures.append(Failure(gate="errors", recipe=recipe, point=f"repeat {r.repeat}",
                                          message=f"all {r.n} requests failed", measured=r.errors, required=0))
        if gate.accuracy_threshold is None:
            continue
        mean = sum(r.accuracy for r in rs) / len(rs)
        ok = mean >= gate.accuracy_threshold
        v.checks.append(Check(gate="accuracy", recipe=recipe, point=None, measured=mean, required=gate.accuracy_threshold, passed=ok))
        if not ok:
            v.failures.append(Failure(
                gate="accuracy", recipe=recipe, point=None,
                message=f"GSM8K strict accuracy {mean:.4f} (mean of {len(rs)} repeat(s): "
                f"{', '.join(f'{r.accuracy:.4f}' for r in sorted(rs, key=lambda r: r.repeat))}) "
                f"< threshold {gate.accuracy_threshold:.4f}", measured=mean, required=gate.accuracy_threshold))
    return v


def evaluate_agreement(comparisons: list[dict], reference: str, recipes: list[str], answered: set[str],
                       stage: str = "accuracy") -> Verdict:
    """Every recipe answered, and each one held to `reference` agrees on every prompt; a failure
    names the prompts that did not, and why."""
    v = Verdict(stage=stage)
    for recipe in recipes:
        if recipe not in answered:
            v.failures.append(Failure(gate="missing", recipe=recipe, point="answers", message="no oracle answers from this recipe"
                                      + (" (the reference: nothing can be compared)" if recipe == reference else "")))
    for c in comparisons:
        agreed, asked = c["requests"] - c["disagreeing"], c["requests"]  # one at a time and under load
        v.checks.append(Check(gate="agreement", recipe=c["recipe"], point=f"vs {reference}", measured=agreed, required=asked,
                              passed=c["passed"]))
        if not c["passed"]:
            v.failures.append(Failure(gate="agreement", recipe=c["recipe"], point=f"vs {reference}",
                                      message=f"{c['disagreeing']} of {asked} requests disagree with {reference}: "
                                      + describe_failures(c), measured=agreed, required=asked))
    return v


def placement_failures(jobs: list[dict]) -> list[Failure]:
    """Where a job ran, as srt-slurm's logs say (runners.srtlogs): every address a process was given
    to advertise is one the job's other nodes reach (not loopback, not outside the job), and a
    disaggregated job that completed moved its KV cache over NIXL, without a failed transfer."""
    from servestack.runners.srtlogs import address_problems

    out = []
    for job in jobs:
        for attempt in job.get("attempts", []):
            where = attempt.get("placement") or {}
            for problem in address_problems(where):
                out.append(Failure(gate="addresses", recipe=job["recipe"], point=f"job {attempt['job_id']}", message=problem))
            kv = where.get("kv_transfers")
            if kv and kv["failed"]:
                out.append(Failure(gate="kv_transfers", recipe=job["recipe"], point=f"job {attempt['job_id']}",
                                   message=f"{kv['failed']} failed NIXL transfers {','.join(kv['from'])} -> {','.join(kv['to'])}",
                                   measured=kv["failed"], required=0))
            if kv is not None and attempt["state"] == "COMPLETED" and not kv["successful"]:
                out.append(Failure(gate="kv_transfers", recipe=job["recipe"], point=f"job {attempt['job_id']}",
                                   message="the decode workers counted no KV transfer from prefill", measured=0, required=1))
    return out


def format_verdict(v: Verdict | None) -> str:
    """One readable line per failure (and a one-line summary when all passed)."""
    if v is None:  # a stage that failed before it was gated
        return "no verdict: the stage was not gated"
    if v.passed:
        n = len(v.checks)
        return f"{v.stage}: PASS ({n} numeric check{'s' if n != 1 else ''}, structural gates met)"
    lines = [f"{v.stage}: FAIL ({len(v.failures)} failure{'s' if len(v.failures) != 1 else ''})"]
    for f in v.failures:
        where = f"{f.recipe}" + (f" {f.point}" if f.point else "")
        lines.append(f"  FAIL {f.gate:<13} {where}: {f.message}")
    return "\n".join(lines)
