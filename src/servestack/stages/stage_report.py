"""Stage reports: results.json, a Markdown report (GitHub step-summary friendly), PNG plots.

Plots (matplotlib, Agg backend, written only when there are throughput points):
  throughput_vs_concurrency.png  total tokens/s per GPU against concurrency, one line per recipe,
                                 one point per concurrency (the median of its repeats, a bar for
                                 their spread);
  pareto.png                     total tokens/s per GPU against tokens/s per user (1000 / median
                                 TPOT), one line per recipe, the Pareto frontier marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from servestack.stages.gates import format_verdict
from servestack.stages.results import StageResult, ThroughputPoint
from servestack.util.fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def markdown_stage(result: StageResult, plots: dict[str, str] | None = None) -> str:
    status = "PASS" if result.passed else "FAIL"
    lines = [f"## {result.stage}: {status}", "",
             f"- stack `{result.stack}`, pipeline `{result.pipeline}`, runner `{result.runner}`",
             f"- image `{result.image}`", ""]
    if result.throughput:
        lines += ["| recipe | concurrency | completed / requested | failed | output tokens | tok/s/GPU "
                  "| tok/s/user | total tok/s | output tok/s | TTFT p50 ms | TPOT p50 ms | ITL p50 ms |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in sorted(result.throughput, key=lambda p: (p.recipe, p.concurrency)):
            lines.append(
                f"| {p.recipe} | {p.concurrency} | {p.completed} / {p.requested} | {p.failed} | {p.output_tokens:,} "
                f"| {_fmt(p.tokens_per_s_per_gpu)} | {_fmt(p.tokens_per_s_per_user)} "
                f"| {_fmt(p.total_token_throughput)} | {_fmt(p.output_throughput)} | {_fmt(p.median_ttft_ms)} "
                f"| {_fmt(p.median_tpot_ms, 2)} | {_fmt(p.median_itl_ms, 2)} |")
        lines.append("")
    if result.accuracy:
        lines += ["| recipe | repeat | accuracy (strict) | accuracy (flexible) | n | invalid | errors | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for a in sorted(result.accuracy, key=lambda a: (a.recipe, a.repeat)):
            lines.append(f"| {a.recipe} | {a.repeat} | {a.accuracy:.4f} | "
                         f"{'-' if a.accuracy_flexible is None else f'{a.accuracy_flexible:.4f}'} | {a.n} "
                         f"| {a.invalid} | {a.errors} | {_fmt(a.seconds)} |")
        lines.append("")
    for c in result.agreement:
        lines += [f"Agreement of `{c['recipe']}` with `{c['reference']}` (greedy, token ids; log-probs within "
                  f"{c['logprob_bound']} nats at the first token and {c.get('later_logprob_bound', c['logprob_bound'])} "
                  f"after, a different token only at a near tie within {c['tie_tolerance']} nats):",
                  "", "| prompt | kind | tokens in | parted at | first-token diff | agreed / compared | verdict | detail |",
                  "|---:|---|---:|---:|---:|---:|---|---|"]
        for i, row in enumerate(c["rows"]):
            first = row.get("first_token_diff")
            first_text = "-" if first is None else f"{'>= ' if row.get('first_token_diff_at_least') else ''}{first:.4f}"
            parted = "-" if row.get("parted_at") is None else str(row["parted_at"])
            verdict = f"{row['verdict']} (control)" if row.get("control") else row["verdict"]
            lines.append(f"| {i} | {row['kind']} | {row['length']} | {parted} | {first_text} | {row['agreed']} / "
                         f"{row['compared']} | {verdict} | {row['detail'] or '-'} |")
        lines.append("")
        asked_again = [f"`{side}`: {(warmup or {}).get('failed_attempts', 0)} failed warm-up attempts, "
                       f"{c.get('refused_attempts', {}).get(side, 0)} attempts refused as unavailable (HTTP 503) and asked again"
                       for side, warmup in (c.get("warmup") or {}).items()
                       if (warmup or {}).get("failed_attempts") or c.get("refused_attempts", {}).get(side)]
        if asked_again:
            lines += ["Asked again: " + "; ".join(asked_again) + ".", ""]
    if result.comparison:
        lines += [f"Held to a baseline: {result.comparison}", ""]
    if result.missing:
        lines += [f"Missing points: {', '.join(f'`{m}`' for m in sorted(result.missing))}", ""]
    if result.verdict is not None:
        checks = result.verdict.checks
        if checks:
            lines += ["| gate | recipe | point | measured | required | |", "|---|---|---|---:|---:|---|"]
            for check in checks:
                lines.append(f"| {check.gate} | {check.recipe} | {check.point or '-'} | {check.measured:,.4g} "
                             f"| {check.required:,.4g} | {'pass' if check.passed else '**FAIL**'} |")
            lines.append("")
        lines += ["```", format_verdict(result.verdict), "```", ""]
    if result.timing:
        lines += [_timing_line(result.timing), ""]
    for title, name in (plots or {}).items():
        lines += [f"![{title}]({name})", ""]
    placed = [f"- `{j['name']}` job {a['job_id']} ({a['state']}): {_placed(a)}"
              for j in result.jobs for a in j["attempts"] if a.get("placement")]
    if placed:
        lines += ["Where each job ran (srt-slurm's logs):", "", *placed, ""]
    if result.jobs:
        lines += ["<details><summary>jobs</summary>", "", "| job | attempts (id: state, points) | remaining |",
                  "|---|---|---|"]
        for j in result.jobs:
            att = "; ".join(f"{a['job_id']}: {a['state']} ({','.join(a['points'])})" for a in j["attempts"]) or \
                ("skipped: results on disk" if j.get("skipped") else "-")
            lines.append(f"| {j['name']} | {att} | {','.join(j['remaining']) or '-'} |")
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def _placed(attempt: dict) -> str:
    """node1: frontend_0, head, infra; node2: prefill_w0; node3: decode_w0; KV 12 transfers (0 failed) node2 -> node3"""
    where = attempt.get("placement") or {}
    by_node: dict[str, list[str]] = {}
    for role, node in sorted((where.get("nodes") or {}).items()):
        by_node.setdefault(node, []).append(role)
    text = "; ".join(f"{node}: {', '.join(roles)}" for node, roles in sorted(by_node.items()))
    kv = where.get("kv_transfers")
    if kv:
        text += (f"; KV {kv['successful']} transfers ({kv['failed']} failed) "
                 f"{','.join(kv['from']) or '?'} -> {','.join(kv['to']) or '?'}")
    return text


def _timing_line(t: dict) -> str:
    client = t.get("client_seconds")
    inside = "-" if client is None else f"{client:,.1f} s"
    return (f"Time: wall {_fmt(t.get('wall_seconds'))} s; inside the benchmark clients {inside} "
            f"(benchmarks' own durations {_fmt(t.get('benchmark_seconds'))} s); server start-up "
            f"{_fmt(t.get('server_startup_seconds'))} s; overhead (wall - {t.get('overhead_basis', 'client_seconds')}) "
            f"{_fmt(t.get('overhead_seconds'))} s")


def _pareto_xy(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(per-user, per-GPU) pairs not dominated by another: both larger is better."""
    best: list[tuple[float, float]] = []
    for x, y in sorted(xy, key=lambda p: (-p[0], -p[1])):
        if not best or y > best[-1][1]:
            best.append((x, y))
    return best


def _pareto(points: list[ThroughputPoint]) -> list[ThroughputPoint]:
    """Points not dominated in (per-user, per-GPU)."""
    front = set(_pareto_xy([(p.tokens_per_s_per_user, p.tokens_per_s_per_gpu) for p in points]))
    best = [p for p in points if (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu) in front]
    return sorted(best, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu))


def _spread(points: list[ThroughputPoint]) -> list[tuple[int, float, float, float]]:
    """[(concurrency, median, lowest, highest)] of tokens/s per GPU over each concurrency's repeats."""
    import statistics

    by_c: dict[int, list[float]] = {}
    for p in points:
        by_c.setdefault(p.concurrency, []).append(p.tokens_per_s_per_gpu)
    return [(c, statistics.median(xs), min(xs), max(xs)) for c, xs in sorted(by_c.items())]


def plot_throughput(points: list[ThroughputPoint], out_dir: Path, title: str = "") -> dict[str, str]:
    """Write the two PNGs; returns {title: file name}."""
    if not points:
        return {}
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_recipe: dict[str, list[ThroughputPoint]] = {}
    for p in points:
        by_recipe.setdefault(p.recipe, []).append(p)
    written: dict[str, str] = {}

    def finish(fig: Figure, ax: Axes, xlabel: str, heading: str, name: str, label: str) -> None:
        """Both plots: tokens/s per GPU up the side, the stack in the title, a grid, a legend; then the PNG."""
        ax.set_xlabel(xlabel)
        ax.set_ylabel("total tokens/s per GPU")
        ax.set_title(f"{heading} {title}".strip())
        ax.grid(True, alpha=0.3)
        ax.legend()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        atomic_write_bytes(out_dir / name, buf.getvalue())
        written[label] = name

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for recipe, ps in sorted(by_recipe.items()):
        # One point per concurrency (the median of its repeats) with their spread as a bar: repeats
        # joined in measurement order drew a zig-zag.
        rows = _spread(ps)
        ax.errorbar([r[0] for r in rows], [r[1] for r in rows], yerr=[[r[1] - r[2] for r in rows],
                    [r[3] - r[1] for r in rows]], marker="o", capsize=4, label=recipe)
    ax.set_xscale("log", base=2)
    finish(fig, ax, "concurrency", "Throughput per GPU vs concurrency", "throughput_vs_concurrency.png",
           "tokens/s per GPU vs concurrency")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for recipe, ps in sorted(by_recipe.items()):
        ps = sorted(ps, key=lambda p: p.concurrency)  # the sweep in order, as the other plot draws it
        ax.plot([p.tokens_per_s_per_user for p in ps], [p.tokens_per_s_per_gpu for p in ps], marker="o", label=recipe)
        for p in ps:
            ax.annotate(f"c={p.concurrency}", (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu),
                        textcoords="offset points", xytext=(4, 4), fontsize=7)
    front = _pareto(points)
    ax.plot([p.tokens_per_s_per_user for p in front], [p.tokens_per_s_per_gpu for p in front],
            linestyle="--", color="black", alpha=0.5, label="Pareto frontier")
    finish(fig, ax, "tokens/s per user (1000 / median TPOT)", "Throughput vs interactivity", "pareto.png",
           "tokens/s per GPU vs tokens/s per user")
    return written


def write_stage(result: StageResult) -> Path:
    """results.json + report.md (+ plots) in the stage directory; returns the report path."""
    out = result.out_dir
    atomic_write_json(out / "results.json", result.to_json())
    plots = plot_throughput(result.throughput, out, f"({result.stack})")
    report = out / "report.md"
    atomic_write_text(report, f"# servestack {result.stage} report\n\n" + markdown_stage(result, plots))
    return report


def write_run(run_dir: Path, results: list[StageResult], timing: dict | None = None) -> Path:
    """One report for the whole run; plot links point into the stage directories."""
    parts = ["# servestack pipeline report", ""]
    overall = all(r.passed for r in results)
    parts += [f"**{'PASS' if overall else 'FAIL'}**: " +
              ", ".join(f"{r.stage} {'pass' if r.passed else 'FAIL'}" for r in results), ""]
    if timing:
        parts += [f"Pipeline ({timing.get('runner', '-')} runner). " + _timing_line(timing), ""]
    for r in results:
        plots = {t: f"{r.stage}/{n}" for t, n in {
            "tokens/s per GPU vs concurrency": "throughput_vs_concurrency.png",
            "tokens/s per GPU vs tokens/s per user": "pareto.png"}.items() if (r.out_dir / n).exists()}
        parts.append(markdown_stage(r, plots))
    report = run_dir / "report.md"
    atomic_write_text(report, "\n".join(parts))
    atomic_write_json(run_dir / "results.json", {"passed": overall, "timing": timing or {},
                                                 "stages": [r.to_json() for r in results]})
    return report
