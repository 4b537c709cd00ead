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


@dataclass(frozen=True)
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
            out.append(Failure("completed", p.recipe, where,
                               f"completed {p.completed} of {p.requested} requests", p.completed, p.requested))
        if p.failed != 0:
            out.append(Failure("failed", p.recipe, where, f"{p.failed} failed requests", p.failed, 0))
        if p.output_tokens <= 0:
            out.append(Failure("output_tokens", p.recipe, where, "no output tokens", p.output_tokens, 1))


def evaluate_throughput(points: list[ThroughputPoint], expected: dict[str, list[int]], gate: GateConfig,
                        stage: str = "throughput", repeats: int = 1) -> Verdict:
    """`expected`: {recipe: [concurrency, ...]} that should each have `repeats` points."""
    v = Verdict(stage)
    have = {(p.recipe, p.concurrency, p.repeat) for p in points}
    for recipe, concs in expected.items():
        for c in concs:
            for k in range(repeats):
                if (recipe, c, k) not in have:
                    v.failures.append(Failure("missing", recipe, f"c={c}" + (f" repeat {k}" if k else ""),
                                              "no result for this point"))
    _structural(points, v.failures)
    for p in points:
        base = gate.baselines.get(p.recipe, {}).get(p.concurrency)
        if base is None:
            continue
        floor = base * (1.0 - gate.tolerance)
        ok = p.tokens_per_s_per_gpu >= floor
        v.checks.append(Check("throughput", p.recipe, _where(p), p.tokens_per_s_per_gpu, floor, ok))
        if not ok:
            v.failures.append(Failure(
                "throughput", p.recipe, _where(p),
                f"{p.tokens_per_s_per_gpu:.1f} tok/s/GPU < {floor:.1f} "
                f"(baseline {base:.1f} - {gate.tolerance:.0%})", p.tokens_per_s_per_gpu, floor))
    return v


def evaluate_accuracy(runs: list[AccuracyRun], expected: dict[str, int], gate: GateConfig,
                      stage: str = "accuracy") -> Verdict:
    """`expected`: {recipe: number of repeats}."""
    v = Verdict(stage)
    by_recipe: dict[str, list[AccuracyRun]] = {}
    for r in runs:
        by_recipe.setdefault(r.recipe, []).append(r)
    for recipe, repeats in expected.items():
        got = {r.repeat for r in by_recipe.get(recipe, [])}
        for i in range(repeats):
            if i not in got:
                v.failures.append(Failure("missing", recipe, f"repeat {i}", "no result for this repeat"))
    for recipe, rs in by_recipe.items():
        for r in rs:
            if r.n <= 0:
                v.failures.append(Failure("completed", recipe, f"repeat {r.repeat}", "no questions asked", r.n, 1))
            elif r.errors >= r.n:
                v.failures.append(Failure("errors", recipe, f"repeat {r.repeat}",
                                          f"all {r.n} requests failed", r.errors, 0))
        if gate.accuracy_threshold is None:
            continue
        mean = sum(r.accuracy for r in rs) / len(rs)
        ok = mean >= gate.accuracy_threshold
        v.checks.append(Check("accuracy", recipe, None, mean, gate.accuracy_threshold, ok))
        if not ok:
            v.failures.append(Failure(
                "accuracy", recipe, None,
                f"GSM8K strict accuracy {mean:.4f} (mean of {len(rs)} repeat(s): "
                f"{', '.join(f'{r.accuracy:.4f}' for r in sorted(rs, key=lambda r: r.repeat))}) "
                f"< threshold {gate.accuracy_threshold:.4f}", mean, gate.accuracy_threshold))
    return v


def evaluate_agreement(comparisons: list[dict], reference: str, recipes: list[str], answered: set[str],
                       stage: str = "accuracy") -> Verdict:
    """Every recipe answered, and each one held to `reference` agrees on every prompt; a failure
    names the prompts that did not, and why."""
    v = Verdict(stage)
    for recipe in recipes:
        if recipe not in answered:
            v.failures.append(Failure("missing", recipe, "answers", "no oracle answers from this recipe"
                                      + (" (the reference: nothing can be compared)" if recipe == reference else "")))
    for c in comparisons:
        agreed = c["prompts"] - len(c["failed"])
        v.checks.append(Check("agreement", c["recipe"], f"vs {reference}", agreed, c["prompts"], c["passed"]))
        if not c["passed"]:
            v.failures.append(Failure("agreement", c["recipe"], f"vs {reference}",
                                      f"{len(c['failed'])} of {c['prompts']} prompts disagree with {reference}: "
                                      + describe_failures(c), agreed, c["prompts"]))
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
                out.append(Failure("addresses", job["recipe"], f"job {attempt['job_id']}", problem))
            kv = where.get("kv_transfers")
            if kv and kv["failed"]:
                out.append(Failure("kv_transfers", job["recipe"], f"job {attempt['job_id']}",
                                   f"{kv['failed']} failed NIXL transfers {','.join(kv['from'])} -> {','.join(kv['to'])}",
                                   kv["failed"], 0))
            if kv is not None and attempt["state"] == "COMPLETED" and not kv["successful"]:
                out.append(Failure("kv_transfers", job["recipe"], f"job {attempt['job_id']}",
                                   "the decode workers counted no KV transfer from prefill", 0, 1))
    return out


def format_verdict(v: Verdict) -> str:
    """One readable line per failure (and a one-line summary when all passed)."""
    if v.passed:
        n = len(v.checks)
        return f"{v.stage}: PASS ({n} numeric check{'s' if n != 1 else ''}, structural gates met)"
    lines = [f"{v.stage}: FAIL ({len(v.failures)} failure{'s' if len(v.failures) != 1 else ''})"]
    for f in v.failures:
        where = f"{f.recipe}" + (f" {f.point}" if f.point else "")
        lines.append(f"  FAIL {f.gate:<13} {where}: {f.message}")
    return "\n".join(lines)
