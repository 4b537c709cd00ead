"""Where comparisons go, and what they say: one directory per pair of measured runs, a report that
gives each point's verdict plainly, and a plot a user can read.

Place: `build/<stack>/comparisons/<A digest 12>.<A run>-vs-<B digest 12>.<B run>/`. `compare`
(stored or interleaved), the throughput stage's baseline gate and `bump` all write there, so two
reports of the same pair are never in two places under two names. An interleaved session's sides
share its run id.

Plot (`comparison.png`): tokens/s per GPU against concurrency, one point per concurrency and side
(the median of its repeats) with the spread of the repeats as a bar (lowest to highest); the
baseline (A) drawn under B, in grey.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Sequence
from pathlib import Path

from servestack import compare
from servestack.compare import GATED, METRICS, Change, Comparison, verdicts
from servestack.records.stageresults import ThroughputPoint
from servestack.util.fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text
from servestack.util.project import Project


def _digest12(reference: str) -> str:
    return reference.rsplit("sha256:", 1)[-1][:12] if "sha256:" in reference else ""


def name(a_image: str, a_run: str, b_image: str, b_run: str) -> str:
    def one(image: str, run: str) -> str:
        return ".".join(x for x in (_digest12(image), run) if x) or "side"

    return f"{one(a_image, a_run)}-vs-{one(b_image, b_run)}"


def place(project: Project, stack: str, a_image: str, a_run: str, b_image: str, b_run: str) -> Path:
    return project.artifacts(stack) / "comparisons" / name(a_image, a_run, b_image, b_run)


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def headline(c: Comparison, metrics: tuple[str, ...] = GATED) -> str:
    """The gated metric's verdict first, counted per verdict; the other metrics inform, each its own
    test at alpha, so across many of them some calls are noise's."""
    labels = {m.key: m.label for m in METRICS}
    gated = c.gated(metrics)
    counts = ", ".join(f"{sum(ch.verdict == v for ch in gated)} {v}" for v in verdicts.VERDICTS)
    where = "measured alongside (interleaved)" if c.alongside else f"**{verdicts.NOT_ALONGSIDE}** (a stored baseline)"
    out = f"**{c.verdict(metrics)}** in {', '.join(labels[m] for m in metrics)} ({counts}; {where})"
    moved = [ch for ch in c.changes if ch.metric not in metrics and ch.verdict == verdicts.REGRESSION]
    if moved:
        out += ("; reported, not gated: regression in " +
                ", ".join(f"{labels[ch.metric]} {ch.recipe} c={ch.concurrency}" for ch in moved))
    return out + "."


def failing_points(c: Comparison) -> list[str]:
    """One line per gated point that fails, as the command prints them."""
    from servestack.compare import gate_failures

    return [f"FAIL {ch.recipe} c={ch.concurrency}: {msg}" for ch, msg in gate_failures(c)]


def _row(ch: Change, labels: dict[str, str]) -> str:
    interval = "-" if ch.low is None else f"{_pct(ch.low)} .. {_pct(ch.high)}"
    mark = ch.verdict if ch.verdict == verdicts.NO_REGRESSION else f"**{ch.verdict}**"

    def median(xs: Sequence[float]) -> str:
        return f"{statistics.median(xs):,.2f}" if xs else "-"

    return (f"| {ch.recipe} | {ch.concurrency} | {labels[ch.metric]} | {median(ch.a)} | {median(ch.b)} | {len(ch.b)} "
            f"| {_pct(ch.change)} | {interval} | {mark} | {ch.reason} |")


def markdown(c: Comparison, plot: str | None = None, measuring: list[dict] | None = None) -> str:
    p = c.policy
    test = ("Student t on the paired log ratios of ABBA rounds" if c.alongside
            else f"Welch t on the log values of two periods: {verdicts.NOT_ALONGSIDE}")
    lines = [f"# Comparison: `{c.b.label}` against `{c.a.label}`", "",
             f"- A `{c.a.label}`: image `{c.a.image}`", f"- B `{c.b.label}`: image `{c.b.image}`",
             f"- verdicts: {test}; {1 - 2 * p.alpha:.0%} interval of B / A against a {p.threshold:.0%} threshold, "
             f"{p.min_rounds} to {p.max_rounds} rounds; undecided {'fails' if p.undecided_fails else 'passes'}", "",
             headline(c), ""]
    failing = failing_points(c)
    if failing:
        lines += ["```", *failing, "```", ""]
    labels = {m.key: m.label for m in METRICS}
    if c.changes:
        lines += ["| recipe | concurrency | metric | A median | B median | rounds | change | interval | verdict "
                  "| why |",
                  "|---|---:|---|---:|---:|---:|---:|---|---|---|"]
        lines += [_row(ch, labels) for ch in sorted(c.changes, key=lambda ch: (ch.metric not in GATED,))]
        lines.append("")
    if measuring:
        lines += ["Rounds and time per point (interleaved):", "",
                  "| recipe | concurrency | verdict | rounds | seconds |",
                  "|---|---:|---|---:|---:|"]
        lines += [f"| {m['recipe']} | {m['concurrency']} | {m['verdict']} | {m['rounds']} | {m['seconds']:.0f} |"
                  for m in measuring]
        lines.append("")
    if c.accuracy:
        lines += ["| recipe | accuracy A | accuracy B | change |", "|---|---:|---:|---:|"]
        lines += [f"| {r['recipe']} | {r['mean_a']:.4f} | {r['mean_b']:.4f} | {r['change']:+.4f} |" for r in c.accuracy]
        lines.append("")
    if c.not_compared:
        lines += ["Not compared:", ""] + [f"- {n}" for n in c.not_compared] + [""]
    if plot:
        lines += [f"![tokens/s per GPU against concurrency, each point's spread, the baseline under it]({plot})", ""]
    return "\n".join(lines)


Spread = tuple[int, float, float, float]  # concurrency, median, lowest, highest


def spread_by_concurrency(points: dict[tuple[str, int], list[ThroughputPoint]], key: str) -> dict[str, list[Spread]]:
    """{recipe: [(concurrency, median, lowest, highest)]} over each point's repeats."""
    out: dict[str, list[Spread]] = {}
    for (recipe, conc), ps in sorted(points.items()):
        xs = [float(getattr(p, key)) for p in ps if getattr(p, key) is not None]
        if xs:
            out.setdefault(recipe, []).append((conc, statistics.median(xs), min(xs), max(xs)))
    return out


def plot(c: Comparison, out_dir: Path, name_: str = "comparison.png") -> str | None:
    series = [(c.a, "grey"), (c.b, "tab:orange")]
    if not any(side.points for side, _ in series):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for (side, colour), shift in zip(series, (0.97, 1.03), strict=False):  # apart by a hair, so both bars show
        for recipe, rows in spread_by_concurrency(side.points, GATED[0]).items():
            xs = [r[0] * shift for r in rows]
            ax.errorbar(xs, [r[1] for r in rows], yerr=[[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]],
                        color=colour, marker="o", capsize=4, label=f"{side.label} {recipe}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("total tokens/s per GPU (median, bar: lowest to highest repeat)")
    ax.set_title(f"{c.b.label} against {c.a.label}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(out_dir / name_, buf.getvalue())
    return name_


def write(c: Comparison, out_dir: Path, measuring: list[dict] | None = None) -> Path:
    """comparison.json, comparison.md and comparison.png in `out_dir`; returns the Markdown file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot(c, out_dir)
    atomic_write_json(out_dir / "comparison.json", {**c.to_dict(), "measuring": measuring or []})
    report = out_dir / "comparison.md"
    atomic_write_text(report, markdown(c, png, measuring))
    return report


def compare_references(project: Project, stack: str, a: str, b: str, *, key: Path | None = None, out: Path | None = None,
                       policy: verdicts.Policy = verdicts.Policy()) -> tuple[Comparison, Path]:
    """`servestack compare A B` of two stored results: both sides resolved (published ones pulled
    and verified into the output directory), compared apart ("not measured alongside"), written
    where comparisons.place says; returns the comparison and its Markdown report."""
    runs = project.artifacts(stack) / "runs"
    out = out or place(project, stack, a, compare.slug(a), b, compare.slug(b))
    if out.exists():
        import shutil

        shutil.rmtree(out / "pulled", ignore_errors=True)  # a pull writes a fresh directory
    side_a, invalid_a = compare.load_side(a, runs=runs, pulled=out / "pulled" / "a", key=key,
                                          label=f"A {compare.slug(a)}")
    side_b, invalid_b = compare.load_side(b, runs=runs, pulled=out / "pulled" / "b", key=key,
                                          label=f"B {compare.slug(b)}")
    result = compare.compare(side_a, side_b, policy, invalid=invalid_a + invalid_b)
    return result, write(result, out)
