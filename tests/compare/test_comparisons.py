"""Comparing two images by their results: what regresses beyond the threshold, what is undecided,
what is not compared at all, and how a stored baseline's verdict is labelled. The points are real
vLLM benchmark results (tests/data/dev-cpu), measured again with known changes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures import paths
from servestack import compare
from servestack.compare import comparisons
from servestack.errors import InputError
from servestack.stages.results import StageResult, parse_vllm_result
from servestack.util.project import Project

DATA = paths.DATA / "dev-cpu"
CONDITIONS = {"isl": 128, "osl": 32, "prompts_per_concurrency": 4, "gpus": 1, "gpu_type": "cpu", "runner": "local",
              "resources_and_benchmark_sha256": "ab" * 32}


def measured(c: int, factors: list[float], recipe: str = "agg"):
    """The c-point of the real result, measured len(factors) times: tokens/s scaled by each factor,
    TPOT inversely, as a slower or faster server would give."""
    base = parse_vllm_result(DATA / f"{c}.json", recipe=recipe, gpus=1, concurrency=c)
    return [replace(base, repeat=k, tokens_per_s_per_gpu=base.tokens_per_s_per_gpu * f,
                    tokens_per_s_per_user=base.tokens_per_s_per_user * f, median_tpot_ms=base.median_tpot_ms / f,
                    p99_tpot_ms=base.p99_tpot_ms / f)
            for k, f in enumerate(factors)]


def run_results(points, conditions=CONDITIONS, image="127.0.0.1:5000/servestack/dev-cpu@sha256:" + "a" * 64) -> dict:
    stage = StageResult(stack="dev-cpu", pipeline="dev-cpu", stage="throughput", image=image, runner="local", out_dir=Path("."),
                        throughput=points,
                        conditions={"agg": conditions})
    return {"passed": True, "stages": [stage.to_json()]}


def side(points, label, **kw):
    return compare.side_from_results(run_results(points, **kw), label, Path(f"{label}/results.json"))


NOISE_A = [1.00, 1.03, 0.98]
NOISE_B = [1.01, 0.99, 1.02]


def test_the_same_image_measured_twice_has_no_regression_at_any_point():
    a, _ = side([p for c in (1, 4, 16) for p in measured(c, NOISE_A)], "A")
    b, _ = side([p for c in (1, 4, 16) for p in measured(c, NOISE_B)], "B")
    result = compare.compare(a, b)
    assert result.changes and not result.regressions
    assert {ch.verdict for ch in result.changes} == {"no regression"}
    assert len(result.changes) == 3 * len(compare.METRICS)


def test_a_slowdown_beyond_threshold_and_noise_is_a_regression_at_the_points_it_slows():
    a, _ = side([p for c in (1, 4, 16) for p in measured(c, NOISE_A)], "A")
    b, _ = side([*measured(1, NOISE_B), *measured(4, NOISE_B), *measured(16, [0.70, 0.72, 0.69])], "B")
    result = compare.compare(a, b)
    regressed = {(ch.concurrency, ch.metric) for ch in result.regressions}
    assert regressed == {(16, "tokens_per_s_per_gpu"), (16, "tokens_per_s_per_user"), (16, "median_tpot_ms"),
                         (16, "p99_tpot_ms")}
    tps = next(ch for ch in result.regressions if ch.metric == "tokens_per_s_per_gpu")
    assert tps.change == pytest.approx(0.70 / 1.00 - 1, abs=0.01)
    assert tps.low < tps.change < tps.high < -compare.DEFAULT_THRESHOLD
    [(ch, message)] = compare.gate_failures(result)
    assert ch is tps and "not measured alongside" in message
    assert message.startswith("regression: tokens_per_s_per_gpu -29.9% (interval -32.7% .. -27.0%, 3 rounds")


def test_a_faster_image_is_no_regression_and_its_change_says_by_how_much():
    a, _ = side(measured(4, NOISE_A), "A")
    b, _ = side(measured(4, [1.30, 1.32, 1.28]), "B")
    changes = {ch.metric: ch for ch in compare.compare(a, b).changes}
    assert changes["tokens_per_s_per_gpu"].verdict == "no regression" and changes["tokens_per_s_per_gpu"].change > 0.2
    assert changes["median_tpot_ms"].verdict == "no regression" and changes["median_tpot_ms"].change < -0.2


def test_a_change_the_spread_covers_is_undecided_never_a_pass():
    """What Mann-Whitney called "within noise" (and the gate passed): the repeats overlap, so the
    interval straddles the threshold, and the verdict says so, with the rounds that would decide."""
    a, _ = side(measured(4, [0.70, 1.30, 1.00]), "A")
    b, _ = side(measured(4, [0.75, 1.25, 0.85]), "B")
    result = compare.compare(a, b)
    [tps] = [ch for ch in result.changes if ch.metric == "tokens_per_s_per_gpu"]
    assert tps.verdict == "undecided" and tps.low < -0.10 < tps.high and "straddles" in tps.reason
    assert [ch for ch, _ in compare.gate_failures(result)] == [tps]
    let_pass = compare.compare(a, b, replace(compare.RegressionPolicy(), undecided_fails=False))
    assert not compare.gate_failures(let_pass)  # the pipeline file's undecided_fails: false


def test_too_few_repeats_are_undecided_and_the_gate_does_not_pass_them():
    a, _ = side(measured(4, [1.0]), "A")
    b, _ = side(measured(4, [0.5]), "B")
    result = compare.compare(a, b)
    [tps] = [ch for ch in result.changes if ch.metric == "tokens_per_s_per_gpu"]
    assert tps.verdict == "undecided" and tps.low is None and tps.rounds_to_decide == 3
    assert not result.regressions
    [(_, message)] = compare.gate_failures(result)
    assert message.startswith("undecided: tokens_per_s_per_gpu") and "fewer than 2 measurements" in message


def test_a_stored_baseline_is_labelled_not_measured_alongside_and_an_interleaved_one_is_paired(tmp_path: Path):
    """The same numbers, judged twice: apart (a stored baseline) the report says so on every verdict;
    as one interleaved session, round k of A pairs with round k of B."""
    drifting = [1.00, 0.90, 0.80]  # the machine slowed through the session, for both sides alike
    a, _ = side(measured(4, drifting), "A")
    b, _ = side(measured(4, [f * 0.99 for f in drifting]), "B")
    stored, paired = compare.compare(a, b), compare.compare(a, b, alongside=True)
    [apart] = [ch for ch in stored.gated()]
    [together] = [ch for ch in paired.gated()]
    assert apart.verdict == "undecided" and not apart.alongside
    assert together.verdict == "no regression" and together.alongside
    assert together.change == pytest.approx(-0.01) and together.high - together.low < 1e-6
    md = comparisons.write(stored, tmp_path / "stored").read_text()
    assert "**not measured alongside** (a stored baseline)" in md
    assert "measured alongside (interleaved)" in comparisons.write(paired, tmp_path / "paired").read_text()
    assert json.loads((tmp_path / "stored" / "comparison.json").read_text())["measured"] == "not measured alongside"


def test_a_point_that_is_not_a_result_is_named_and_never_compared():
    failed = replace(measured(4, [1.0])[0], failed=2, completed=14, repeat=2)
    silent = replace(measured(16, [1.0])[0], output_tokens=0)
    a, invalid_a = side(measured(4, NOISE_A), "A")
    b, invalid_b = side([*measured(4, NOISE_B[:2]), failed, silent], "B")
    assert invalid_b == ["B: agg c=4 repeat 2: 2 failed requests", "B: agg c=16 repeat 0: no output tokens"]
    result = compare.compare(a, b, invalid=invalid_a + invalid_b)
    assert all(len(ch.b) == 2 for ch in result.changes)  # the two valid repeats only
    assert "B: agg c=16 repeat 0: no output tokens" in result.not_compared


def test_different_experiments_are_named_instead_of_compared():
    a, _ = side(measured(4, NOISE_A), "A")
    b, _ = side(measured(4, NOISE_B), "B", conditions={**CONDITIONS, "isl": 1024, "gpu_type": "gb200"})
    result = compare.compare(a, b)
    assert not result.changes
    assert result.not_compared == ["throughput/agg: not the same experiment: gpu_type 'cpu' vs 'gb200'; isl 128 vs 1024"]
    c, _ = side(measured(16, NOISE_B), "C")
    assert compare.compare(a, c).not_compared == ["agg c=4: measured only in A", "agg c=16: measured only in C"]


def test_the_report_the_json_and_the_plot(tmp_path: Path):
    a, _ = side([p for c in (1, 4, 16) for p in measured(c, NOISE_A)], "A")
    b, _ = side([*measured(1, NOISE_B), *measured(4, NOISE_B), *measured(16, [0.70, 0.72, 0.69])], "B")
    report = comparisons.write(compare.compare(a, b), tmp_path)
    md = report.read_text()
    assert md.startswith("# Comparison: `B` against `A`")
    assert ("**regression** in tok/s/GPU (2 no regression, 1 regression, 0 undecided; **not measured alongside** "
            "(a stored baseline)); reported, not gated: regression in tok/s/user agg c=16") in md
    assert "FAIL agg c=16: regression: tokens_per_s_per_gpu -29.9%" in md  # the failing point, said plainly
    assert "| agg | 16 | tok/s/GPU |" in md and "| **regression** |" in md
    assert "(comparison.png)" in md
    assert (tmp_path / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert data["schema"] == compare.SCHEMA and data["policy"]["min_rounds"] == 3 and data["verdict"] == "regression"
    assert (data["gated"], data["gated_regressions"]) == (["tokens_per_s_per_gpu"], 1)


def test_the_plot_has_one_point_per_concurrency_with_the_spread_of_its_repeats():
    a, _ = side([p for c in (1, 4) for p in measured(c, [0.9, 1.0, 1.2])], "A")
    [(c1, median1, low1, high1), (c4, *_)] = comparisons.spread_by_concurrency(a.points, "tokens_per_s_per_gpu")["agg"]
    assert (c1, c4) == (1, 4) and low1 < median1 < high1
    assert high1 / low1 == pytest.approx(1.2 / 0.9)


def test_a_tail_latency_that_moves_is_reported_but_only_the_gated_metric_decides(tmp_path: Path, capsys):
    """An A/A run whose p99 TTFT at c=1 (the slowest of 8 requests) came out 40% later in all three
    repeats: with 16 metric values each tested at alpha 0.05 that happens to the same image, so it
    is named, and neither the headline verdict nor the exit code turns on it."""
    from servestack import cli

    def late(points):
        return [replace(p, p99_ttft_ms=p.p99_ttft_ms * (1.4 + p.repeat / 100)) for p in points]

    points_a = [p for c in (1, 4) for p in measured(c, NOISE_A)]
    points_b = [*late(measured(1, NOISE_B)), *measured(4, NOISE_B)]
    result = compare.compare(side(points_a, "A")[0], side(points_b, "B")[0])
    assert [(ch.concurrency, ch.metric) for ch in result.regressions] == [(1, "p99_ttft_ms")]
    assert not compare.gate_failures(result)
    assert comparisons.headline(result) == (
        "**no regression** in tok/s/GPU (2 no regression, 0 regression, 0 undecided; **not measured alongside** "
        "(a stored baseline)); reported, not gated: regression in TTFT p99 ms agg c=1.")
    runs = tmp_path / "build" / "dev-cpu" / "runs"
    for name, points in (("a", points_a), ("b", points_b)):
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json").write_text(json.dumps(run_results(points)))
    (tmp_path / "pins").mkdir()
    assert cli.main(["--project", str(tmp_path), "compare", "a", "b"]) == 0
    assert "| agg | 1 | TTFT p99 ms |" in capsys.readouterr().out


def test_sides_are_named_by_run_id_run_directory_or_pulled_publication(tmp_path: Path):
    runs = tmp_path / "build" / "dev-cpu" / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "results.json").write_text(json.dumps(run_results(measured(4, NOISE_A))))
    pulled = tmp_path / "servestack-abc"
    (pulled / "runs" / "r1").mkdir(parents=True)
    (pulled / "publication.json").write_text("{}")
    (pulled / "runs" / "r1" / "results.json").write_text((runs / "r1" / "results.json").read_text())
    stages_only = tmp_path / "servestack-def"  # a run of single stages: no run-level results.json
    (stages_only / "runs" / "r1" / "throughput").mkdir(parents=True)
    (stages_only / "publication.json").write_text("{}")
    (stages_only / "runs" / "r1" / "throughput" / "results.json").write_text(
        json.dumps(run_results(measured(4, NOISE_A))["stages"][0]))
    for reference in ("r1", str(runs / "r1"), str(pulled), str(stages_only)):
        s, _ = compare.load_side(reference, runs=runs, pulled=tmp_path / "unused")
        assert len(s.points[("agg", 4)]) == 3
    with pytest.raises(InputError, match="not a run id under"):
        compare.load_side("r2", runs=runs, pulled=tmp_path / "unused")
    with pytest.raises(InputError, match="publisher's public key"):
        compare.load_side("127.0.0.1:5000/x@sha256:" + "a" * 64, runs=runs, pulled=tmp_path / "unused")
    (runs / "bad").mkdir()
    (runs / "bad" / "results.json").write_text("{}")
    with pytest.raises(InputError, match="stages"):
        compare.load_side("bad", runs=runs, pulled=tmp_path / "unused")


def test_compare_references_writes_under_the_stacks_comparisons(tmp_path: Path):
    runs = tmp_path / "build" / "dev-cpu" / "runs"
    for name, factors in (("a1", NOISE_A), ("b1", [0.70, 0.72, 0.69])):
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json").write_text(json.dumps(run_results(measured(4, factors))))
    result, report = comparisons.compare_references(Project(root=tmp_path), "dev-cpu", "a1", "b1")
    assert report == tmp_path / "build" / "dev-cpu" / "comparisons" / "a1-vs-b1" / "comparison.md"
    assert {ch.metric for ch in result.regressions} >= {"tokens_per_s_per_gpu"}


def test_the_command_line_exits_with_the_verdict_and_prints_the_failing_points(tmp_path: Path, capsys):
    from servestack import cli

    runs = tmp_path / "build" / "dev-cpu" / "runs"
    for name, factors in (("a1", NOISE_A), ("a2", NOISE_B), ("b1", [0.70, 0.72, 0.69])):
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json").write_text(json.dumps(run_results(measured(4, factors))))
    (tmp_path / "pins").mkdir()
    assert cli.main(["--project", str(tmp_path), "compare", "a1", "a2"]) == 0
    assert "**no regression**" in capsys.readouterr().out
    assert cli.main(["--project", str(tmp_path), "compare", "a1", "b1", "--threshold", "0.5"]) == 0  # -30% < 50%
    assert cli.main(["--project", str(tmp_path), "compare", "a1", "b1"]) == 4
    out = capsys.readouterr().out
    assert "| **regression** |" in out and "\nFAIL agg c=4: regression: tokens_per_s_per_gpu -" in out
    (runs / "wide").mkdir()
    (runs / "wide" / "results.json").write_text(json.dumps(run_results(measured(4, [0.6, 1.3, 0.9]))))
    assert cli.main(["--project", str(tmp_path), "compare", "a1", "wide"]) == 5  # undecided
    assert cli.main(["--project", str(tmp_path), "compare", "a1", "nowhere"]) == 2


# ----------------------------------------------------------------------------- bump's drift report

def _bump_project(tmp_path: Path, published: dict | None) -> Project:
    project = Project(root=tmp_path)
    runs = project.artifacts("dev-cpu") / "runs"
    (runs / "published").mkdir(parents=True)
    (runs / "published" / "results.json").write_text(json.dumps(run_results(measured(4, NOISE_A))))
    if published is not None:
        (project.artifacts("dev-cpu") / "publish.json").write_text(json.dumps(published))
    return project


def _stages_leaving_a_run(project: Project, drift, factors: list[float], conditions=CONDITIONS):
    """What the stages step leaves: a run of the bumped image, its stage directory recorded."""
    def stages():
        run = project.artifacts("dev-cpu") / "runs" / "bumped"
        (run / "throughput").mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(run_results(measured(4, factors), conditions)))
        drift.stages = [{"stage": "throughput", "passed": True, "dir": str(run / "throughput")}]
        return True, "throughput pass"
    return stages


def test_a_bump_that_slows_serving_fails_and_its_drift_report_says_where(tmp_path: Path):
    from servestack import bump

    project = _bump_project(tmp_path, {"image": "published", "run": "published"})
    assert bump.last_published(project, "dev-cpu") == "published"
    drift, report = bump.bump(project, "dev-cpu", steps=lambda d: [
        ("lock --upgrade", lambda: (True, "2 changes")), ("stages", _stages_leaving_a_run(project, d, [0.70, 0.72, 0.69]))])
    assert not drift.passed and [s.name for s in drift.steps] == ["lock --upgrade", "stages", "compare"]
    assert drift.steps[-1].detail.startswith("regression: 1 gated point(s) regressed (")
    assert drift.steps[-1].detail.endswith("0 undecided, against published")
    assert bump.exit_code(drift) == 4
    md = report.read_text()
    assert report == project.artifacts("dev-cpu") / "bump" / "drift.md"
    assert "**regression** (not measured alongside), 1 gated point(s) regressed, against `published`" in md
    assert "**FAIL**" in md and "| compare | **FAIL** |" in md
    assert json.loads((report.parent / "drift.json").read_text())["schema"] == bump.SCHEMA
    unchanged = _bump_project(tmp_path / "aa", {"image": "published", "run": "published"})
    drift, report = bump.bump(unchanged, "dev-cpu", steps=lambda d: [
        ("stages", _stages_leaving_a_run(unchanged, d, NOISE_B))])
    assert drift.passed and "**no regression** (not measured alongside)" in report.read_text()
    assert bump.exit_code(drift) == 0
    elsewhere = _bump_project(tmp_path / "other", {"image": "published", "run": "published"})
    drift, _ = bump.bump(elsewhere, "dev-cpu", steps=lambda d: [
        ("stages", _stages_leaving_a_run(elsewhere, d, NOISE_B, {**CONDITIONS, "isl": 1024}))])
    assert not drift.passed and drift.steps[-1].detail.startswith("nothing in common with published to compare")


def test_a_bump_stops_at_the_first_failed_step_and_says_so(tmp_path: Path):
    from servestack import bump
    from servestack.errors import ServestackError

    project = _bump_project(tmp_path, {"image": "published", "run": "published"})

    def broken():
        raise ServestackError("build dev-cpu: vllm-0.32.0.whl: sha256 mismatch\nmore")
    ran = []
    drift, report = bump.bump(project, "dev-cpu", steps=lambda d: [
        ("lock --upgrade", lambda: (True, "1 change")), ("build", broken), ("image", lambda: ran.append(1))])
    assert not ran and not drift.passed and drift.comparison is None
    assert "| build | **FAIL** | 0 | build dev-cpu: vllm-0.32.0.whl: sha256 mismatch |" in report.read_text()


def test_a_bump_needs_a_baseline_with_results(tmp_path: Path):
    from servestack import bump

    nothing = _bump_project(tmp_path / "none", None)
    drift, report = bump.bump(nothing, "dev-cpu", steps=lambda d: [
        ("stages", _stages_leaving_a_run(nothing, d, NOISE_B))])
    assert not drift.passed and drift.steps[-1].name == "compare"
    assert "no publication of this stack to hold the bump to" in report.read_text()

    with pytest.raises(InputError, match="no publication of this stack"):
        bump.last_published(_bump_project(tmp_path / "a", None), "dev-cpu")
    with pytest.raises(InputError, match="carries no run's results"):
        bump.last_published(_bump_project(tmp_path / "b", {"image": "x@sha256:" + "1" * 64, "run": None}), "dev-cpu")
