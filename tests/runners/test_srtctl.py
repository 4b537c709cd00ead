"""The srtctl runner: recipe binding, srtctl's --json output and result layout (real srtctl from the
vendored srt-slurm tree submitting to this machine's Slurm: test_srtctl_e2e.py)."""

from __future__ import annotations

import json

import pytest

from fixtures.runner_jobs import DIGEST, IMAGE, RECIPE, bad_recipe
from servestack.errors import InputErrors, ServestackError
from servestack.runners.interface import JobHandle, JobSpec
from servestack.runners.slurm import pull_reference
from servestack.runners.srtctl import GSM8K_IN_CONTAINER, SrtctlRunner, bind_recipe, parse_apply_output, results_in


def test_bind_recipe_sets_digest_model_dir_data_and_remaining_points(tmp_path):
    bound = bind_recipe(RECIPE, IMAGE, ("16", "64"), "benchmark.concurrencies", model_dir=tmp_path / "m",
                        gsm8k=tmp_path / "g")
    assert bound["model"]["container"] == IMAGE and bound["benchmark"]["concurrencies"] == [16, 64]
    assert bound["model"]["path"] == str(tmp_path / "m")
    assert bound["container_mounts"] == {str(tmp_path / "g"): GSM8K_IN_CONTAINER}
    assert bound["environment"]["TMPDIR"] == GSM8K_IN_CONTAINER
    assert RECIPE["benchmark"]["concurrencies"] == "4x16x64" and RECIPE["model"]["path"] == "qwen3.5"


def test_pull_reference_is_enroots_form_on_the_registry_the_nodes_use():
    assert pull_reference(IMAGE) == f"127.0.0.1:5000#servestack/qwen35-gb200@{DIGEST}"
    assert pull_reference(IMAGE, {"127.0.0.1:5000": "127.0.0.1:5001"}) == f"127.0.0.1:5001#servestack/qwen35-gb200@{DIGEST}"
    with pytest.raises(ServestackError):
        pull_reference("127.0.0.1:5000/servestack/dev-cpu:latest")  # never by tag


def test_parse_apply_output_reads_json_lines():
    out = 'Submitting: agg\n{"status": "submitted", "slurm_job_id": "42", "output_dir": "/o/42"}\n'
    assert parse_apply_output(out) == [{"status": "submitted", "slurm_job_id": "42", "output_dir": "/o/42"}]


def test_results_are_read_from_srt_slurms_own_layout(tmp_path):
    logs = tmp_path / "42" / "logs"
    (logs / "sa-bench_isl_128_osl_32").mkdir(parents=True)
    (logs / "accuracy").mkdir()
    for c in (1, 16):
        (logs / "sa-bench_isl_128_osl_32" / f"results_concurrency_{c}_gpus_1.json").write_text("{}")
    (logs / "accuracy" / "gsm8k_run1.json").write_text(json.dumps({"accuracy": 0.0, "num_questions": 50}))
    (logs / "benchmark-rollup.json").write_text("{}")  # not a point
    found = results_in(tmp_path / "42")
    assert sorted(found) == ["1", "16", "repeat-0"]
    assert found["repeat-0"].name == "gsm8k_run1.json"
    spec = JobSpec(name="throughput-agg", points=("1", "4"), out_dir=tmp_path / "out", command=())
    SrtctlRunner().collect(JobHandle(runner="srtctl", job_id="42", spec=spec, output_dir=tmp_path / "42"))
    assert sorted(p.name for p in (tmp_path / "out").glob("*.json")) == ["1.json"]  # only this job's points



def test_a_repeat_of_a_sweep_is_one_job_whose_results_are_that_repeats_points(tmp_path):
    bound = bind_recipe(RECIPE, IMAGE, ("16-r2", "64-r2"), "benchmark.concurrencies")
    assert bound["benchmark"]["concurrencies"] == [16, 64]
    logs = tmp_path / "43" / "logs" / "sa-bench_isl_128_osl_32"
    logs.mkdir(parents=True)
    for c in (16, 64):
        (logs / f"results_concurrency_{c}_gpus_1.json").write_text(json.dumps({"c": c}))
    spec = JobSpec(name="throughput-agg-r2", points=("16-r2", "64-r2"), out_dir=tmp_path / "out", command=(),
                   extra={"points_field": "benchmark.concurrencies"})
    SrtctlRunner().collect(JobHandle(runner="srtctl", job_id="43", spec=spec, output_dir=tmp_path / "43"))
    assert sorted(p.name for p in (tmp_path / "out").glob("*.json")) == ["16-r2.json", "64-r2.json"]
    assert json.loads((tmp_path / "out" / "64-r2.json").read_text()) == {"c": 64}


def test_the_oracles_answers_are_read_and_its_client_is_mounted(tmp_path):
    from servestack.runners.srtctl import CLIENTS_IN_CONTAINER, bind_recipe

    logs = tmp_path / "7" / "logs" / "accuracy"
    logs.mkdir(parents=True)
    (logs / "agreement.json").write_text("{}")  # the custom benchmark's --out /logs/accuracy/agreement.json
    assert results_in(tmp_path / "7") == {"answers": logs / "agreement.json"}
    bound = bind_recipe({"benchmark": {"type": "custom"}}, None, ("answers",), None, clients=tmp_path / "clients")
    assert bound["container_mounts"] == {str(tmp_path / "clients"): CLIENTS_IN_CONTAINER}


def test_a_recipe_that_cannot_run_is_refused_before_srtctl_sees_it(tmp_path):
    runner = SrtctlRunner(executable=["/nonexistent/srtctl"], output_base=tmp_path / "o", env={})
    with pytest.raises(InputErrors, match=r"agg\.yaml:\d+:\d+: benchmark\.concurrencies: malformed concurrency list '4x-1'"):
        runner.submit(bad_recipe(tmp_path))
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())  # nothing submitted


def test_the_preflight_is_srt_slurms_setup_script_with_its_limits_in_every_workers_environment(tmp_path):
    from servestack.runners.preflight import SCRIPT_NAME, NodePreflight
    from servestack.runners.srtctl import bind_preflight

    recipe = {"resources": {"prefill_nodes": 2, "decode_nodes": 2}, "backend": {"prefill_environment": {"A": "1"}}}
    bind_preflight(recipe, NodePreflight(min_driver=580, gpus_per_node=4, nodes=4), tmp_path / "r.yaml")
    assert recipe["setup_script"] == SCRIPT_NAME
    assert recipe["backend"]["prefill_environment"] == {"A": "1", "SERVESTACK_PREFLIGHT_MIN_DRIVER": "580",
                                                        "SERVESTACK_PREFLIGHT_GPUS": "4", "SERVESTACK_PREFLIGHT_NODES": "4"}
    assert recipe["backend"]["decode_environment"]["SERVESTACK_PREFLIGHT_GPUS"] == "4"
    with pytest.raises(ServestackError, match="setup_script is 'pin-worker-cpus.sh'; the node preflight"):
        bind_preflight({"setup_script": "pin-worker-cpus.sh"}, NodePreflight(min_driver=580, gpus_per_node=4), tmp_path / "r.yaml")
