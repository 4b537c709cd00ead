"""Reports: Markdown tables and the two PNG plots render from real results."""

from __future__ import annotations

from fixtures import paths
from servestack.stages.gates import GateConfig, evaluate_throughput
from servestack.stages.results import StageResult, parse_vllm_result
from servestack.stages.stage_report import _pareto, markdown_stage, plot_throughput, write_stage

DATA = paths.DATA / "dev-cpu"


def points():
    return [parse_vllm_result(DATA / f"{c}.json", recipe="agg", gpus=1, concurrency=c) for c in (1, 4, 16)]


def test_plots_render(tmp_path):
    written = plot_throughput(points(), tmp_path, "(dev-cpu)")
    assert set(written.values()) == {"throughput_vs_concurrency.png", "pareto.png"}
    for name in written.values():
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert plot_throughput([], tmp_path) == {}


def test_markdown_has_tables_and_verdict(tmp_path):
    pts = points()
    r = StageResult(stack="dev-cpu", pipeline="dev-cpu", stage="throughput", image="img@sha256:" + "0" * 64, runner="local",
                    out_dir=tmp_path, throughput=pts,
                    verdict=evaluate_throughput(pts, {"agg": [1, 4, 16, 64]}, GateConfig()))
    md = markdown_stage(r)
    assert md.startswith("## throughput: FAIL") and "| recipe | concurrency |" in md
    assert "FAIL missing       agg c=64: no result for this point" in md
    write_stage(r)
    assert (tmp_path / "results.json").exists() and "![tokens/s per GPU vs concurrency]" in (tmp_path / "report.md").read_text()


def test_pareto_frontier():
    pts = points()
    front = _pareto(pts)
    assert front and all(any(q.tokens_per_s_per_user >= p.tokens_per_s_per_user or
                             q.tokens_per_s_per_gpu >= p.tokens_per_s_per_gpu for q in front) for p in pts)
