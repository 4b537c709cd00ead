"""Two images side by side by their results, and a regression verdict that respects the noise.

A side is a run (`build/<stack>/runs/<id>`, its results.json) or a publication pulled by digest
(the verified bundle's `runs/<id>/results.json`). For every recipe and concurrency both sides
measured, each metric's change is the relative change of the medians over the repeats, with a 95%
bootstrap interval (scipy.stats.bootstrap, percentile method, fixed seed). A point regresses on a
metric only when both hold:

  - the change is worse than `threshold` (relative: 0.10 = ten per cent slower or later), and
  - a one-sided Mann-Whitney U test (scipy.stats.mannwhitneyu, exact) says B's values moved that
    way at `alpha` (the p reported is that test's, in the direction of the change). With 3
    repeats a side the smallest p it can give is 0.05, so 3 is the fewest that can show a
    regression; with fewer, a change beyond the threshold is `inconclusive`, never a pass.

A point that is not valid (a failed request, no output tokens, fewer completed than requested)
is never compared: it is named, with the reason. So is a recipe whose conditions differ between
the two sides (stages.run.conditions: the workload and the hardware; serving flags may differ,
as images do, since that is what is being compared).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text

SCHEMA = "servestack.comparison/1"
STAGE_SCHEMA = "servestack.stage-result/1"  # StageResult.to_dict()
MIN_REPEATS = 3  # the fewest a side for a one-sided exact Mann-Whitney test to reach p = 0.05
DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class Metric:
    key: str  # a ThroughputPoint field in results.json
    label: str
    higher_is_better: bool


METRICS = (
    Metric("tokens_per_s_per_gpu", "tok/s/GPU", True),
    Metric("tokens_per_s_per_user", "tok/s/user", True),
    Metric("median_ttft_ms", "TTFT p50 ms", False),
    Metric("p99_ttft_ms", "TTFT p99 ms", False),
    Metric("median_tpot_ms", "TPOT p50 ms", False),
    Metric("p99_tpot_ms", "TPOT p99 ms", False),
    Metric("median_itl_ms", "ITL p50 ms", False),
    Metric("p99_itl_ms", "ITL p99 ms", False),
)
GATED = ("tokens_per_s_per_gpu",)  # what a pipeline's baseline gate fails on; the rest are reported


@dataclass(frozen=True)
class RegressionPolicy:
    threshold: float = DEFAULT_THRESHOLD
    alpha: float = DEFAULT_ALPHA


@dataclass
class Side:
    """One image's results: throughput points (every repeat), accuracy, and each recipe's conditions."""

    label: str
    image: str
    stack: str
    points: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    accuracy: dict[str, list[float]] = field(default_factory=dict)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    recipe: str
    concurrency: int
    metric: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    change: float  # median(b) / median(a) - 1
    low: float | None  # the 95% bootstrap interval of `change` (None: fewer than 2 repeats a side)
    high: float | None
    p_value: float | None  # one-sided Mann-Whitney in the direction of the change (None: fewer than MIN_REPEATS)
    verdict: str  # regression | improvement | within noise | inconclusive

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class Comparison:
    a: Side
    b: Side
    policy: RegressionPolicy
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

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "a": _side_dict(self.a), "b": _side_dict(self.b),
                "policy": {"threshold": self.policy.threshold, "alpha": self.policy.alpha, "min_repeats": MIN_REPEATS,
                           "test": "one-sided Mann-Whitney U (exact), 95% bootstrap interval of the median change"},
                "changes": [c.to_dict() for c in self.changes], "accuracy": self.accuracy,
                "not_compared": self.not_compared, "regressions": len(self.regressions),
                "gated": list(GATED), "gated_regressions": len(self.gated_regressions())}


def _side_dict(s: Side) -> dict[str, Any]:
    return {"label": s.label, "image": s.image, "stack": s.stack}


# ----------------------------------------------------------------------------- reading a side

def invalid_reason(point: dict[str, Any]) -> str | None:
    """Why a measured point is not a result (None: it is one)."""
    if point.get("failed"):
        return f"{point['failed']} failed requests"
    if point.get("completed") != point.get("requested"):
        return f"completed {point.get('completed')} of {point.get('requested')} requests"
    if not point.get("output_tokens"):
        return "no output tokens"
    return None


def side_from_results(results: dict[str, Any], label: str, where: Path) -> tuple[Side, list[str]]:
    """A side from a run's results.json (write_run's), and the points it holds that are not results."""
    stages = results.get("stages")
    if not isinstance(stages, list):
        raise InputError(where, "stages", "expected a run's results.json (servestack pipeline, report.write_run)")
    images = {s.get("image") for s in stages if s.get("image")}
    side = Side(label, ", ".join(sorted(images)) or "-", next((s.get("stack") for s in stages if s.get("stack")), "-"))
    invalid = []
    for stage in stages:
        for recipe, cond in (stage.get("conditions") or {}).items():
            side.conditions[f"{stage.get('stage')}/{recipe}"] = cond
        for p in stage.get("throughput") or []:
            reason = invalid_reason(p)
            if reason:
                invalid.append(f"{label}: {p['recipe']} c={p['concurrency']} repeat {p.get('repeat', 0)}: {reason}")
                continue
            side.points.setdefault((p["recipe"], int(p["concurrency"])), []).append(p)
        for a in stage.get("accuracy") or []:
            side.accuracy.setdefault(a["recipe"], []).append(float(a["accuracy"]))
    return side, invalid


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
    if "@sha256:" in reference:
        from .publish import pull

        if key is None:
            raise InputError(Path(reference), "key", "a published baseline is verified with its publisher's public key "
                                                     "(--key, or gate.baseline_key)")
        pull(reference, key=key, out=pulled, echo=None)
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


# ----------------------------------------------------------------------------- the statistics

def _median(xs: tuple[float, ...]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _interval(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float | None, float | None]:
    if len(a) < 2 or len(b) < 2 or len(set(a)) == 1 == len(set(b)):
        return (None, None) if len(a) < 2 or len(b) < 2 else (_median(b) / _median(a) - 1,) * 2
    import numpy as np
    from scipy import stats

    def change(x, y, axis=-1):
        return np.median(y, axis=axis) / np.median(x, axis=axis) - 1

    res = stats.bootstrap((np.array(a), np.array(b)), change, n_resamples=2000, method="percentile",
                          vectorized=True, rng=np.random.default_rng(0))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _p_higher(a: tuple[float, ...], b: tuple[float, ...], higher: bool) -> float | None:
    """One-sided exact Mann-Whitney p that B's values are higher (else lower) than A's."""
    if len(a) < MIN_REPEATS or len(b) < MIN_REPEATS:
        return None
    from scipy import stats

    return float(stats.mannwhitneyu(b, a, alternative="greater" if higher else "less", method="exact").pvalue)


def judge(recipe: str, concurrency: int, metric: Metric, a: tuple[float, ...], b: tuple[float, ...],
          policy: RegressionPolicy) -> Change:
    change = _median(b) / _median(a) - 1 if _median(a) else math.inf
    worse = -change if metric.higher_is_better else change  # > 0: B is worse by this fraction
    low, high = _interval(a, b)
    p = _p_higher(a, b, change > 0)  # that the values moved the way the medians did
    if abs(worse) <= policy.threshold:
        verdict = "within noise"
    elif p is None:
        verdict = "inconclusive"
    elif p <= policy.alpha:
        verdict = "regression" if worse > 0 else "improvement"
    else:
        verdict = "within noise"
    return Change(recipe, concurrency, metric.key, a, b, change, low, high, p, verdict)


def compare(a: Side, b: Side, policy: RegressionPolicy = RegressionPolicy(), *,
            invalid: list[str] | None = None) -> Comparison:
    out = Comparison(a, b, policy, not_compared=list(invalid or []))
    differing = set()
    for key in sorted(set(a.conditions) & set(b.conditions)):
        ca, cb = a.conditions[key], b.conditions[key]
        diffs = [f"{k} {ca.get(k)!r} vs {cb.get(k)!r}" for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
        if diffs:
            differing.add(key.split("/", 1)[1])
            out.not_compared.append(f"{key}: not the same experiment: " + "; ".join(diffs))
    for key in sorted(set(a.points) | set(b.points)):
        recipe, conc = key
        if recipe in differing:
            continue
        if key not in a.points or key not in b.points:
            out.not_compared.append(f"{recipe} c={conc}: measured only in {a.label if key in a.points else b.label}")
            continue
        for metric in METRICS:
            va = tuple(float(p[metric.key]) for p in a.points[key] if p.get(metric.key) is not None)
            vb = tuple(float(p[metric.key]) for p in b.points[key] if p.get(metric.key) is not None)
            if va and vb:
                out.changes.append(judge(recipe, conc, metric, va, vb, policy))
    for recipe in sorted(set(a.accuracy) & set(b.accuracy)):
        ma, mb = (sum(v) / len(v) for v in (a.accuracy[recipe], b.accuracy[recipe]))
        out.accuracy.append({"recipe": recipe, "a": a.accuracy[recipe], "b": b.accuracy[recipe],
                             "mean_a": ma, "mean_b": mb, "change": mb - ma})
    return out


# ----------------------------------------------------------------------------- the report

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def headline(c: Comparison, metrics: tuple[str, ...] = GATED) -> str:
    """The verdict on the gated metric first, then what the reported metrics showed: each is its own
    test at `alpha`, so across many of them some false alarms are expected from noise alone (tail
    latencies over a handful of requests most of all), and they inform rather than decide."""
    labels = {m.key: m.label for m in METRICS}
    gated = c.gated(metrics)
    regressed = c.gated_regressions(metrics)
    names = ", ".join(labels[m] for m in metrics)
    out = (f"**{plural(len(regressed), 'regression')}**" if regressed else "**no regression**") + (
        f" in {names} (gated, {plural(len(gated), 'compared value')})")
    reported = [ch for ch in c.changes if ch.metric not in metrics]
    moved = [ch for ch in reported if ch.verdict == "regression"]
    if not reported:
        return out + "."
    if not moved:
        return out + f"; reported, not gated: no regression in the other {plural(len(reported), 'value')}."
    where = ", ".join(f"{labels[ch.metric]} {ch.recipe} c={ch.concurrency}" for ch in moved)
    return out + (f"; reported, not gated: {len(moved)} of the other {len(reported)} values regressed ({where}), "
                  f"where noise alone would flag about {len(reported) * c.policy.alpha:.1f} at alpha {c.policy.alpha}.")


def markdown(c: Comparison, plot: str | None = None) -> str:
    lines = [f"# Comparison: `{c.b.label}` against `{c.a.label}`", "",
             f"- A `{c.a.label}`: image `{c.a.image}`", f"- B `{c.b.label}`: image `{c.b.image}`",
             (f"- a point regresses when it is worse by more than {c.policy.threshold:.0%} and a one-sided "
              f"Mann-Whitney U test gives p <= {c.policy.alpha} (it needs {MIN_REPEATS} repeats a side); "
              "the interval is the 95% bootstrap interval of the change of the medians"), ""]
    lines += [headline(c), ""]
    if c.changes:
        lines += ["| recipe | concurrency | metric | A (median, n) | B (median, n) | change | 95% interval | p | verdict |",
                  "|---|---:|---|---:|---:|---:|---|---:|---|"]
        labels = {m.key: m.label for m in METRICS}
        for ch in c.changes:
            interval = "-" if ch.low is None else f"{_pct(ch.low)} .. {_pct(ch.high)}"
            mark = f"**{ch.verdict}**" if ch.verdict in ("regression", "inconclusive") else ch.verdict
            lines.append(f"| {ch.recipe} | {ch.concurrency} | {labels[ch.metric]} | {_median(ch.a):,.2f} ({len(ch.a)}) "
                         f"| {_median(ch.b):,.2f} ({len(ch.b)}) | {_pct(ch.change)} | {interval} "
                         f"| {'-' if ch.p_value is None else f'{ch.p_value:.3f}'} | {mark} |")
        lines.append("")
    if c.accuracy:
        lines += ["| recipe | accuracy A | accuracy B | change |", "|---|---:|---:|---:|"]
        for r in c.accuracy:
            lines.append(f"| {r['recipe']} | {r['mean_a']:.4f} | {r['mean_b']:.4f} | {r['change']:+.4f} |")
        lines.append("")
    if c.not_compared:
        lines += ["Not compared:", ""] + [f"- {n}" for n in c.not_compared] + [""]
    if plot:
        lines += [f"![tokens/s per GPU against tokens/s per user, both sides]({plot})", ""]
    return "\n".join(lines)


def plot_overlay(c: Comparison, out_dir: Path) -> str | None:
    """tokens/s per GPU against tokens/s per user, both sides' medians and Pareto fronts."""
    from .report import _pareto_xy

    series = {}
    for side in (c.a, c.b):
        xy = [(_median(tuple(p["tokens_per_s_per_user"] for p in ps)), _median(tuple(p["tokens_per_s_per_gpu"] for p in ps)))
              for ps in side.points.values()]
        if xy:
            series[side.label] = xy
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for (label, xy), colour in zip(series.items(), ("tab:blue", "tab:orange")):
        ax.scatter([x for x, _ in xy], [y for _, y in xy], color=colour, alpha=0.6, label=f"{label}")
        front = _pareto_xy(xy)
        ax.plot([x for x, _ in front], [y for _, y in front], color=colour, marker="o", label=f"{label} Pareto front")
    ax.set_xlabel("tokens/s per user (1000 / median TPOT)")
    ax.set_ylabel("total tokens/s per GPU")
    ax.set_title(f"{c.b.label} against {c.a.label}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = "comparison_pareto.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(out_dir / name, buf.getvalue())
    return name


def write(c: Comparison, out_dir: Path) -> Path:
    """comparison.json, comparison.md and the overlay plot in `out_dir`; returns the Markdown file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_overlay(c, out_dir)
    atomic_write_json(out_dir / "comparison.json", c.to_dict())
    report = out_dir / "comparison.md"
    atomic_write_text(report, markdown(c, plot))
    return report


def _slug(reference: str) -> str:
    tail = reference.rsplit("@", 1)[-1].replace("sha256:", "")[:12] if "@" in reference else Path(reference).name
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in tail) or "side"


def compare_references(project, stack: str, a: str, b: str, *, key: Path | None = None, out: Path | None = None,
                       policy: RegressionPolicy = RegressionPolicy()) -> tuple[Comparison, Path]:
    """`servestack compare A B`: both sides resolved (published ones pulled and verified into the
    output directory), compared, written; returns the comparison and its Markdown report."""
    runs = project.artifacts(stack) / "runs"
    out = out or project.artifacts(stack) / "comparisons" / f"{_slug(a)}-vs-{_slug(b)}"
    if out.exists():
        import shutil

        shutil.rmtree(out / "pulled", ignore_errors=True)  # a pull writes a fresh directory
    side_a, invalid_a = load_side(a, runs=runs, pulled=out / "pulled" / "a", key=key, label=f"A {_slug(a)}")
    side_b, invalid_b = load_side(b, runs=runs, pulled=out / "pulled" / "b", key=key, label=f"B {_slug(b)}")
    result = compare(side_a, side_b, policy, invalid=invalid_a + invalid_b)
    return result, write(result, out)


def gate_failures(c: Comparison, metrics: tuple[str, ...] = GATED) -> list[tuple[Change, str]]:
    """What fails a pipeline's baseline gate: a gated metric that regressed, or that the repeats
    cannot judge (a gate that cannot decide does not pass)."""
    out = []
    for ch in c.gated(metrics):
        if ch.verdict == "regression":
            out.append((ch, (f"{ch.metric} {_pct(ch.change)} against the baseline (median {_median(ch.b):,.2f} vs "
                             f"{_median(ch.a):,.2f}, 95% interval {_pct(ch.low)} .. {_pct(ch.high)}, Mann-Whitney "
                             f"p = {ch.p_value:.3f} <= {c.policy.alpha}; threshold {c.policy.threshold:.0%})")))
        elif ch.verdict == "inconclusive":
            out.append((ch, (f"{ch.metric} {_pct(ch.change)} against the baseline, beyond the "
                             f"{c.policy.threshold:.0%} threshold, but {len(ch.a)} and {len(ch.b)} repeats cannot show "
                             f"whether it is noise (the test needs {MIN_REPEATS} a side: stages.throughput.repeats)")))
    return out
