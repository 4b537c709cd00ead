"""Two images side by side by their results, and three verdicts per point and metric.

A side is a run (`build/<stack>/runs/<id>`, its results.json), a publication pulled by digest
(the verified bundle's `runs/<id>/results.json`), or one half of an interleaved session
(interleave.py). For every recipe and concurrency both sides measured, each metric's change B / A
is judged by verdicts.py: "no regression", "regression" or "undecided" (with the rounds that would
decide it). Measured alongside, round k of A is paired with round k of B; a stored baseline is
judged unpaired, and every such verdict is labelled "not measured alongside".

A point that is not valid (a failed request, no output tokens, fewer completed than requested)
is never compared: it is named, with the reason. So is a recipe whose conditions differ between
the two sides (stages.jobs.conditions: the workload and the hardware; serving flags may differ,
as images do, since that is what is being compared). The report itself is comparisons.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.compare import verdicts
from servestack.errors import InputError
from servestack.records.codec import Record
from servestack.records.fields import Fields
from servestack.records.imageref import names_a_digest
from servestack.records.stageresults import SCHEMA as STAGE_SCHEMA
from servestack.records.stageresults import StageResult, ThroughputPoint
from servestack.util.console import console

SCHEMA = "servestack.comparison/1"
MIN_REPEATS = verdicts.Policy().min_rounds  # the fewest repeats a verdict reads
DEFAULT_THRESHOLD = verdicts.Policy().threshold
DEFAULT_ALPHA = verdicts.Policy().alpha


@dataclass(frozen=True, kw_only=True)
class Metric:
    key: str  # a ThroughputPoint field in results.json
    label: str
    higher_is_better: bool


METRICS = (
    Metric(key="tokens_per_s_per_gpu", label="tok/s/GPU", higher_is_better=True),
    Metric(key="tokens_per_s_per_user", label="tok/s/user", higher_is_better=True),
    Metric(key="median_ttft_ms", label="TTFT p50 ms", higher_is_better=False),
    Metric(key="p99_ttft_ms", label="TTFT p99 ms", higher_is_better=False),
    Metric(key="median_tpot_ms", label="TPOT p50 ms", higher_is_better=False),
    Metric(key="p99_tpot_ms", label="TPOT p99 ms", higher_is_better=False),
    Metric(key="median_itl_ms", label="ITL p50 ms", higher_is_better=False),
    Metric(key="p99_itl_ms", label="ITL p99 ms", higher_is_better=False),
)
GATED = ("tokens_per_s_per_gpu",)  # what a pipeline's baseline gate fails on; the rest are reported


RegressionPolicy = verdicts.Policy


@dataclass(kw_only=True)
class Side:
    """One image's results: throughput points (every repeat), accuracy, and each recipe's conditions."""

    label: str
    image: str
    stack: str
    points: dict[tuple[str, int], list[ThroughputPoint]] = field(default_factory=dict)
    accuracy: dict[str, list[float]] = field(default_factory=dict)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Change(Record):
    recipe: str
    concurrency: int
    metric: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    change: float | None  # B / A - 1 (verdicts.py; None: too few values to estimate)
    low: float | None  # its (1 - 2 alpha) interval
    high: float | None
    verdict: str  # verdicts.VERDICTS
    reason: str
    rounds_to_decide: int | None  # undecided: rounds in all that would decide it at the spread seen
    alongside: bool  # A and B measured in the same session (paired), else "not measured alongside"


@dataclass(kw_only=True)
class Comparison:
    a: Side
    b: Side
    policy: verdicts.Policy
    alongside: bool = False
    changes: list[Change] = field(default_factory=list)
    accuracy: list[dict[str, Any]] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # what could not be, and why

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "regression"]

    def gated(self, metrics: tuple[str, ...] = GATED) -> list[Change]:
        return [c for c in self.changes if c.metric in metrics]

    def gated_regressions(self, metrics: tuple[str, ...] = GATED) -> list[Change]:
        return [c for c in self.gated(metrics) if c.verdict == "regression"]

    def verdict(self, metrics: tuple[str, ...] = GATED) -> str:
        """The gated metric's verdict over every point (verdicts.worst)."""
        return verdicts.worst([c.verdict for c in self.gated(metrics)] or [verdicts.UNDECIDED])

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "a": _side_dict(self.a), "b": _side_dict(self.b),
                "measured": verdicts.ALONGSIDE if self.alongside else verdicts.NOT_ALONGSIDE,
                "verdict": self.verdict(),
                "policy": {**self.policy.__dict__,
                           "test": ("Student t on paired log ratios of ABBA rounds" if self.alongside else
                                    "Welch t on log values of two periods")},
                "changes": [c.to_json() for c in self.changes], "accuracy": self.accuracy,
                "not_compared": self.not_compared, "regressions": len(self.regressions),
                "gated": list(GATED), "gated_regressions": len(self.gated_regressions())}


def _side_dict(s: Side) -> dict[str, Any]:
    return {"label": s.label, "image": s.image, "stack": s.stack}


# ----------------------------------------------------------------------------- reading a side

def invalid_reason(point: ThroughputPoint) -> str | None:
    """Why a measured point is not a result (None: it is one)."""
    if point.failed:
        return f"{point.failed} failed requests"
    if point.completed != point.requested:
        return f"completed {point.completed} of {point.requested} requests"
    if not point.output_tokens:
        return "no output tokens"
    return None


def side_from_stages(stages: list[StageResult], label: str) -> tuple[Side, list[str]]:
    """A side from a run's stage results, and the points they hold that are not results."""
    images = {s.image for s in stages if s.image}
    side = Side(label=label, image=", ".join(sorted(images)) or "-", stack=next((s.stack for s in stages if s.stack), "-"))
    invalid = []
    for stage in stages:
        for recipe, cond in stage.conditions.items():
            side.conditions[f"{stage.stage}/{recipe}"] = cond
        for p in stage.points_in_order:
            reason = invalid_reason(p)
            if reason:
                invalid.append(f"{label}: {p.recipe} c={p.concurrency} repeat {p.repeat}: {reason}")
                continue
            side.points.setdefault((p.recipe, p.concurrency), []).append(p)
        for a in stage.runs_in_order:
            side.accuracy.setdefault(a.recipe, []).append(float(a.accuracy))
    return side, invalid


def side_from_results(results: dict[str, Any], label: str, where: Path) -> tuple[Side, list[str]]:
    """A side from a run's results.json (write_run's), and the points it holds that are not results."""
    run = Fields(results, where)
    if not isinstance(results.get("stages"), list):
        raise InputError(where, "stages", "expected a run's results.json (servestack pipeline, report.write_run)")
    out_dir = where if where.is_dir() else where.parent
    stages = run.items("stages", lambda stage: StageResult.from_json(stage, out_dir=out_dir))
    return side_from_stages(list(stages), label)


def _read(f: Path) -> dict[str, Any]:
    try:
        data = json.loads(f.read_text())
    except FileNotFoundError:
        raise InputError(f, "", "no results.json: expected a run directory (build/<stack>/runs/<id>) "
                                "or a publication pulled by digest") from None
    except json.JSONDecodeError as exc:
        raise InputError(f, "", f"not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise InputError(f, "", "expected a JSON object")
    return data


def load_run(path: Path, label: str | None = None) -> tuple[Side, list[str]]:
    """A run directory (the pipeline's results.json, else its stages' own), a stage directory, or a results.json."""
    f = path / "results.json" if path.is_dir() else path
    if path.is_dir() and not f.exists() and sorted(path.glob("*/results.json")):
        stages = [_read(s) for s in sorted(path.glob("*/results.json"))]  # stages run one at a time
        return side_from_results({"stages": stages}, label or path.name, path)
    data = _read(f)
    if data.get("schema") == STAGE_SCHEMA:
        data = {"stages": [data]}
    return side_from_results(data, label or f.parent.name, f)


def load_pulled(directory: Path, label: str | None = None) -> tuple[Side, list[str]]:
    """A publication `servestack pull` wrote: its one run's results (a bundle without results has none to compare)."""
    found = sorted({f.parent for f in directory.glob("runs/*/results.json")}
                   | {f.parent.parent for f in directory.glob("runs/*/*/results.json")})
    if len(found) != 1:
        raise InputError(directory, "runs/", f"expected one published run, found {len(found)} "
                                             "(publish --run RUN_ID puts a run's results in the bundle)")
    return load_run(found[0], label)


def load_side(reference: str, *, runs: Path, pulled: Path, key: Path | None = None,
              label: str | None = None) -> tuple[Side, list[str]]:
    """A side named as the command line and `gate.baseline` name it: an image reference with a
    digest (its verified publication is pulled into `pulled`, which must not exist yet), a run id
    under `runs`, a run directory, or a directory `servestack pull` wrote."""
    if names_a_digest(reference):
        from servestack.publish import pull

        if key is None:
            raise InputError(Path(reference), "key", "a published baseline is verified with its publisher's public key "
                                                     "(--key, or gate.baseline_key)")
        with console.quiet():  # a side is a comparison's input: the comparison is what is said
            pull(reference, key=key, out=pulled)
        return load_pulled(pulled, label or reference.rsplit("@", 1)[1][:19])
    path = Path(reference)
    if not path.exists() and (runs / reference).is_dir():
        path = runs / reference
    if path.is_dir() and not (path / "results.json").exists() and (path / "publication.json").exists():
        return load_pulled(path, label or path.name)
    if path.exists():
        return load_run(path, label)
    raise InputError(path, "", f"not a run id under {runs}, a run directory, a pulled publication, "
                               "or an image reference with @sha256: digest")


# ----------------------------------------------------------------------------- the verdicts

def _values(points: list[ThroughputPoint], key: str, alongside: bool) -> dict[int, float]:
    """{repeat: value}: measured alongside, repeat k of A pairs with repeat k of B."""
    values = [(p.repeat, float(getattr(p, key))) for p in points if getattr(p, key) is not None]
    return dict(values) if alongside else dict(enumerate(v for _, v in values))


def judge(recipe: str, concurrency: int, metric: Metric, a: dict[int, float], b: dict[int, float],
          policy: verdicts.Policy, alongside: bool) -> Change:
    if alongside:  # rounds where one half failed pair with nothing
        common = sorted(set(a) & set(b))
        va, vb = tuple(a[k] for k in common), tuple(b[k] for k in common)
    else:
        va, vb = tuple(a.values()), tuple(b.values())
    d = verdicts.judge(va, vb, higher_is_better=metric.higher_is_better, alongside=alongside, policy=policy)
    est = d.estimate
    return Change(recipe=recipe, concurrency=concurrency, metric=metric.key, a=va, b=vb,
                  change=None if est is None else est.change, low=None if est is None else est.low,
                  high=None if est is None else est.high, verdict=d.verdict, reason=d.reason,
                  rounds_to_decide=d.rounds_to_decide, alongside=alongside)


def compare(a: Side, b: Side, policy: verdicts.Policy = verdicts.Policy(), *,
            invalid: list[str] | None = None, alongside: bool = False) -> Comparison:
    """`alongside`: A and B were measured in one interleaved session (their repeats pair up)."""
    out = Comparison(a=a, b=b, policy=policy, alongside=alongside, not_compared=list(invalid or []))
    differing = set()
    for key in sorted(set(a.conditions) & set(b.conditions)):
        ca, cb = a.conditions[key], b.conditions[key]
        diffs = [f"{k} {ca.get(k)!r} vs {cb.get(k)!r}" for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
        if diffs:
            differing.add(key.split("/", 1)[1])
            out.not_compared.append(f"{key}: not the same experiment: " + "; ".join(diffs))
    for point in sorted(set(a.points) | set(b.points)):
        recipe, conc = point
        if recipe in differing:
            continue
        if point not in a.points or point not in b.points:
            out.not_compared.append(f"{recipe} c={conc}: measured only in {a.label if point in a.points else b.label}")
            continue
        for metric in METRICS:
            va, vb = (_values(side.points[point], metric.key, alongside) for side in (a, b))
            if va and vb:
                out.changes.append(judge(recipe, conc, metric, va, vb, policy, alongside))
    for recipe in sorted(set(a.accuracy) & set(b.accuracy)):
        ma, mb = (sum(v) / len(v) for v in (a.accuracy[recipe], b.accuracy[recipe]))
        out.accuracy.append({"recipe": recipe, "a": a.accuracy[recipe], "b": b.accuracy[recipe],
                             "mean_a": ma, "mean_b": mb, "change": mb - ma})
    return out


def slug(reference: str) -> str:
    tail = reference.rsplit("@", 1)[-1].replace("sha256:", "")[:12] if "@" in reference else Path(reference).name
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in tail) or "side"


def gate_failures(c: Comparison, metrics: tuple[str, ...] = GATED) -> list[tuple[Change, str]]:
    """What fails a gate: a gated metric that regressed, and one still undecided unless the policy
    lets undecided pass (stages.throughput.gate.undecided_fails)."""
    out = []
    for ch in c.gated(metrics):
        failing = ch.verdict == verdicts.REGRESSION or (ch.verdict == verdicts.UNDECIDED and c.policy.undecided_fails)
        if failing:
            out.append((ch, failure_line(ch, c.policy)))
    return out


def failure_line(ch: Change, policy: verdicts.Policy) -> str:
    interval = "-" if ch.low is None else f"{ch.low:+.1%} .. {ch.high:+.1%}"
    change = "-" if ch.change is None else f"{ch.change:+.1%}"
    return (f"{ch.verdict}: {ch.metric} {change} (interval {interval}, {len(ch.b)} rounds, "
            f"threshold {policy.threshold:.0%}): {ch.reason}")
