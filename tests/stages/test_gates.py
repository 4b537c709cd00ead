"""Gates: pass and fail, with verdict text that names recipe, point and numbers."""

from __future__ import annotations

from servestack.stages.gates import GateConfig, evaluate_accuracy, evaluate_throughput, format_verdict
from servestack.stages.results import AccuracyRun, ThroughputPoint


def point(recipe="agg", c=4, requested=40, completed=40, failed=0, out_tokens=1280, total=400.0, gpus=4):
    return ThroughputPoint(
        recipe=recipe, concurrency=c, requested=requested, completed=completed, failed=failed,
        input_tokens=5120, output_tokens=out_tokens, duration_s=10.0, request_throughput=4.0,
        output_throughput=128.0, total_token_throughput=total, gpus=gpus, tokens_per_s_per_gpu=total / gpus,
        tokens_per_s_per_user=50.0, per_user_source="median_tpot", median_ttft_ms=10.0, median_tpot_ms=20.0,
        median_itl_ms=20.0)


def test_throughput_passes_at_the_tolerance_edge():
    gate = GateConfig(baselines={"agg": {4: 110.0}}, tolerance=0.1)  # floor 99
    v = evaluate_throughput([point(total=400.0)], {"agg": [4]}, gate)  # 100 tok/s/GPU
    assert v.passed, format_verdict(v)
    assert format_verdict(v) == "throughput: PASS (1 numeric check, structural gates met)"
    assert v.checks[0].measured == 100.0 and round(v.checks[0].required, 6) == 99.0


def test_throughput_regression_names_recipe_point_and_numbers():
    gate = GateConfig(baselines={"agg": {4: 200.0}}, tolerance=0.1)
    v = evaluate_throughput([point(total=400.0)], {"agg": [4]}, gate)
    assert not v.passed
    text = format_verdict(v)
    assert "FAIL throughput" in text and "agg c=4" in text
    assert "100.0 tok/s/GPU < 180.0 (baseline 200.0 - 10%)" in text


def test_structural_gates_apply_without_baselines():
    pts = [point(c=1, completed=38, failed=2), point(c=4, out_tokens=0)]
    v = evaluate_throughput(pts, {"agg": [1, 4, 16]}, GateConfig())
    gates = sorted((f.gate, f.point) for f in v.failures)
    assert gates == [("completed", "c=1"), ("failed", "c=1"), ("missing", "c=16"), ("output_tokens", "c=4")]
    text = format_verdict(v)
    assert text.splitlines()[0] == "throughput: FAIL (4 failures)"
    assert "completed 38 of 40 requests" in text and "no result for this point" in text
    assert len(text.splitlines()) == 5  # one line per failure


def test_accuracy_mean_over_repeats():
    runs = [AccuracyRun(recipe="agg-acc", repeat=0, accuracy=0.90, n=1319), AccuracyRun(recipe="agg-acc", repeat=1, accuracy=0.87, n=1319)]
    v = evaluate_accuracy(runs, {"agg-acc": 2}, GateConfig(accuracy_threshold=0.88))
    assert v.passed and abs(v.checks[0].measured - 0.885) < 1e-9
    v = evaluate_accuracy(runs, {"agg-acc": 2}, GateConfig(accuracy_threshold=0.89))
    assert not v.passed
    assert "GSM8K strict accuracy 0.8850 (mean of 2 repeat(s): 0.9000, 0.8700) < threshold 0.8900" in format_verdict(v)


def test_accuracy_zero_threshold_still_needs_answers():
    ok = evaluate_accuracy([AccuracyRun(recipe="agg", repeat=0, accuracy=0.0, n=50)], {"agg": 1}, GateConfig(accuracy_threshold=0.0))
    assert ok.passed
    dead = evaluate_accuracy([AccuracyRun(recipe="agg", repeat=0, accuracy=0.0, n=50, errors=50)], {"agg": 2},
                             GateConfig(accuracy_threshold=0.0))
    assert sorted(f.gate for f in dead.failures) == ["errors", "missing"]
    assert "all 50 requests failed" in format_verdict(dead)
