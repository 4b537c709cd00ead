"""The srtctl runner: recipe binding, srtctl's --json output, and a real Slurm job via the stand-in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from servestack.runners.base import JobSpec
from servestack.runners.driver import run_job
from servestack.runners.srtctl import SrtctlRunner, bind_recipe, parse_apply_output
from servestack.stages.results import parse_vllm_result

STANDIN = Path(__file__).parent / "srtctl_standin.py"
IMAGE = "127.0.0.1:5000/servestack/qwen35-gb200@sha256:" + "cd" * 32

RECIPE = {
    "name": "agg", "model": {"path": "qwen3.5", "container": "old", "precision": "fp8"},
    "resources": {"gpu_type": "gb200", "gpus_per_node": 4, "agg_nodes": 2, "agg_workers": 1},
    "backend": {"type": "vllm", "vllm_config": {"aggregated": {"tensor-parallel-size": 8}}},
    "benchmark": {"type": "sa-bench", "isl": 1024, "osl": 1024, "concurrencies": "4x16x64"},
    "slurm": {"time_limit": "00:10:00"},
}


def test_bind_recipe_sets_digest_and_remaining_points():
    bound = bind_recipe(RECIPE, IMAGE, ("16", "64"), "benchmark.concurrencies")
    assert bound["model"]["container"] == IMAGE and bound["benchmark"]["concurrencies"] == [16, 64]
    assert RECIPE["benchmark"]["concurrencies"] == "4x16x64"  # the original is untouched


def test_parse_apply_output_reads_json_lines():
    out = 'Submitting: agg\n{"status": "submitted", "slurm_job_id": "42", "output_dir": "/o/42"}\n'
    assert parse_apply_output(out) == [{"status": "submitted", "slurm_job_id": "42", "output_dir": "/o/42"}]


@pytest.fixture(scope="module")
def slurm_env():
    from servestack import services

    return services.ensure_slurm()


@pytest.mark.e2e
def test_srtctl_job_through_real_slurm(tmp_path, slurm_env, monkeypatch):
    monkeypatch.setenv("STANDIN_SECONDS_PER_POINT", "0.2")
    recipe = tmp_path / "agg.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "throughput" / "agg"
    out.mkdir(parents=True)
    (out / "4.json").write_text("{}")  # finished in an earlier run: must not be asked for again
    spec = JobSpec(name="throughput-agg", points=("4", "16", "64"), out_dir=out, command=(), image=IMAGE,
                   recipe_file=recipe, recipe_name="agg", extra={"points_field": "benchmark.concurrencies"})
    runner = SrtctlRunner(executable=[sys.executable, str(STANDIN)], output_base=tmp_path / "outputs",
                          env=slurm_env, poll_seconds=0.5)
    outcome = run_job(runner, spec)
    assert outcome.complete and outcome.final_state == "COMPLETED", outcome.to_dict()
    job_id = outcome.attempts[0].job_id
    job_dir = tmp_path / "outputs" / job_id
    bound = yaml.safe_load((job_dir / "config.yaml").read_text())
    assert bound["model"]["container"] == IMAGE and bound["benchmark"]["concurrencies"] == [16, 64]
    assert (job_dir / f"{job_id}.json").exists() and (job_dir / "logs" / f"sweep_{job_id}.log").exists()
    assert (job_dir / "logs" / "sa-bench_isl_1024_osl_1024" / "results_concurrency_64_gpus_8.json").exists()
    p = parse_vllm_result(out / "64.json", recipe="agg", gpus=8, concurrency=64)
    assert p.completed == p.requested == 640 and p.failed == 0
    assert json.loads((out / "4.json").read_text()) == {}  # untouched
