"""The srtctl runner: recipe binding, srtctl's --json output, and a real Slurm job via the stand-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servestack.runners.base import JobSpec
from servestack.runners.srtctl import SrtctlRunner, bind_recipe, parse_apply_output

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


def test_standin_refuses_what_it_cannot_run_with_srtctls_error_contract(tmp_path):
    """srtctl's --json error line and exit 1; the runner turns it into a readable error."""
    from servestack.errors import ServestackError

    recipe = tmp_path / "agg.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "model": {**RECIPE["model"], "container": "not-a-digest"}}))
    proc = subprocess.run([sys.executable, str(STANDIN), "apply", "-f", str(recipe), "-o", str(tmp_path / "o"),
                           "--json", "-y"], capture_output=True, text=True)
    assert proc.returncode == 1
    [record] = parse_apply_output(proc.stdout)
    assert record["status"] == "error" and "not an image by digest" in record["error"]
    spec = JobSpec(name="throughput-agg", points=("4",), out_dir=tmp_path / "out", command=(), image=None,
                   recipe_file=recipe, recipe_name="agg", extra={"points_field": "benchmark.concurrencies"})
    runner = SrtctlRunner(executable=[sys.executable, str(STANDIN)], output_base=tmp_path / "o")
    with pytest.raises(ServestackError, match="not an image by digest"):
        runner.submit(spec)


def test_standin_plans_a_real_vllm_job_from_the_dev_cpu_recipe():
    """The stand-in's job for recipes/dev-cpu/agg.yaml bound to a digest (the e2e suite runs it)."""
    sys.path.insert(0, str(STANDIN.parent))
    import srtctl_standin

    root = Path(__file__).resolve().parents[1]
    recipe = bind_recipe(yaml.safe_load((root / "recipes" / "dev-cpu" / "agg.yaml").read_text()),
                         "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32, ("4", "16"),
                         "benchmark.concurrencies")
    job = srtctl_standin.plan_job(recipe, srtctl_standin.DEFAULT_CLUSTER)
    assert job["server"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert job["model"] == "/opt/servestack/models/servestack/tiny-qwen3" and job["served_model_name"] == "tiny-qwen3"
    assert "--enforce-eager" in job["server"] and job["benchmark"]["concurrencies"] == [4, 16] and job["gpus"] == 1
    script = srtctl_standin.batch_script(recipe, Path("/o"), job, srtctl_standin.DEFAULT_CLUSTER, Path("/d.py"))
    assert f"{job['image']} python3 /opt/srtctl-driver.py" in script and "#SBATCH --exclusive" in script
