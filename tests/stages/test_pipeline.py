"""The pipeline loader: the committed pipelines load; bad ones name file, line and field."""

from __future__ import annotations

import pytest

from fixtures.paths import ROOT
from servestack.errors import InputErrors
from servestack.stages.pipeline import load_pipeline, parse_duration


def test_committed_pipelines_load():
    dev = load_pipeline(ROOT / "pipelines" / "dev-cpu.yaml", ROOT)
    assert dev.stack == "dev-cpu" and dev.runner.kind == "local"
    # dev-cpu's random weights are judged by the oracle: disagg-acc held to agg-acc's answers.
    assert dev.stages.accuracy.gate.threshold is None and dev.stages.accuracy.gate.agreement_with == "agg-acc"
    assert dev.stages.accuracy.points == ("answers",)
    assert dev.stages.accuracy.gsm8k.num_questions == 50
    assert dev.stages.throughput.concurrencies is None  # each recipe's own points
    assert dev.stages.throughput.recipes == ("agg", "disagg", "disagg-multinode") and dev.runner.disaggregated == "srtctl"
    assert dev.runner.srtctl.local_cluster_nodes == 3
    assert dev.runner.slurm.local_cluster and dev.runner.slurm.extra_sbatch == ("--exclusive",)
    assert dev.data_dir == ROOT / "data" / "gsm8k" and dev.server.startup_timeout == 600
    gb = load_pipeline(ROOT / "pipelines" / "qwen35-gb200.yaml", ROOT)
    assert gb.runner.kind == "srtctl" and gb.stages.accuracy.gate.threshold == 0.88
    assert gb.stages.throughput.time_limit == 4 * 3600 and gb.retry.max_attempts == 3
    assert list(gb.stages.defined()) == ["accuracy", "throughput"]


@pytest.mark.parametrize("text,where", [
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a]\n    gate: {threshold: 1.5}\n",
     r"p.yaml:5:\d+: stages.accuracy.gate.threshold: Input should be less than or equal to 1 \(got 1.5\)"),
    ("stack: x\nrunner:\n  kind: k8s\nstages:\n  throughput: {recipes: [a]}\n",
     r"p.yaml:3:3: runner.kind: Input should be 'local', 'slurm' or 'srtctl' \(got 'k8s'\)"),
    ("stack: x\nrunner:\n  disaggregated: slurm\nstages:\n  throughput: {recipes: [a]}\n",
     r"p.yaml:3:\d+: runner.disaggregated: Input should be 'srtctl' \(got 'slurm'\)"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    concurrencies: [1, 0]\n",
     r"p.yaml:5:\d+: stages.throughput.concurrencies\[1\]: Input should be greater than or equal to 1 \(got 0\)"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    concurrencies: [4, 4]\n",
     r"p.yaml:5:5: stages.throughput.concurrencies: concurrency points repeat"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    time_limit: soon\n",
     r"p.yaml:5:5: stages.throughput.time_limit: 'soon' is not a duration"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    gate: {baselines: {b: {4: 10}}}\n",
     r"p.yaml:5:\d+: stages.throughput.gate.baselines.b: baseline for a recipe this stage does not run"),
    # Measured alongside, the baseline is run: it must be an image by digest.
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    gate: {baseline: run1, alongside: true}\n",
     r"p.yaml:5:\d+: stages.throughput.gate.alongside: measuring alongside runs the baseline"),
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a]\n    gate: {}\n    extra: 1\n",
     r"p.yaml:6:5: stages.accuracy.extra: unknown field; expected one of: gate, gpus, gsm8k, recipes, time_limit"),
    ("stack: x\nretry: {retry_on: [COMPLETED]}\nstages: {throughput: {recipes: [a]}}\n",
     r"p.yaml:2:\d+: retry.retry_on\[0\]: 'COMPLETED' is not an end state a job can be retried from "
     r"\(FAILED CANCELLED PREEMPTED NODE_FAIL TIMEOUT OUT_OF_MEMORY\)"),
    ("stages: {throughput: {recipes: [a]}}\n", r"p.yaml:1:1: stack: required"),
    ("stack: x\nrunner: {slurm: {partiton: a}}\nstages: {throughput: {recipes: [a]}}\n",
     r"p.yaml:2:18: runner.slurm.partiton: unknown field; did you mean `partition`\?"),
    ("stack: x\nstages: {acuracy: {recipes: [a], gate: {threshold: 0.5}}}\n",
     r"p.yaml:2:10: stages.acuracy: unknown field; did you mean `accuracy`\?"),
    ("stack: x\nstages: {}\n", r"p.yaml:2:1: stages: expected at least one of accuracy, throughput"),
    # The oracle's reference must be a recipe the stage runs, beside one it judges.
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a, b]\n    gate: {agreement_with: c}\n",
     r"p.yaml:5:\d+: stages.accuracy.gate.agreement_with: the reference must be one of this stage's recipes \(a, b\)"),
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a]\n    gate: {agreement_with: a}\n",
     r"p.yaml:5:\d+: stages.accuracy.gate.agreement_with: the reference must be .* beside at least one other"),
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a, b]\n    gate: {agreement_with: a, threshold: 0.5}\n",
     r"p.yaml:5:\d+: stages.accuracy.gate: give exactly one of `threshold` \(GSM8K\) or `agreement_with`"),
])
def test_errors_name_file_line_and_field(tmp_path, text, where):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(InputErrors, match=where):
        load_pipeline(f, tmp_path)


def test_every_problem_is_reported_at_once(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("stack: x\nretry: {max_attempts: 0}\nstages:\n  throughput: {recipes: [a], input_len: -1}\n")
    with pytest.raises(InputErrors) as caught:
        load_pipeline(f, tmp_path)
    assert [e.field for e in caught.value.errors] == ["retry.max_attempts", "stages.throughput.input_len"]


def test_the_default_retry_states_are_the_runners_retryable_states(tmp_path):
    from servestack.runners.interface import RETRYABLE

    f = tmp_path / "p.yaml"
    f.write_text("stack: x\nstages: {throughput: {recipes: [a]}}\n")
    assert load_pipeline(f, tmp_path).retry.policy().retry_on == RETRYABLE


def test_paths_are_relative_to_the_project_root(tmp_path):
    f = tmp_path / "pipelines" / "p.yaml"
    f.parent.mkdir()
    f.write_text("stack: x\nmodel_dir: models/m\nrunner: {srtctl: {executable: [./bin/srtctl, --flag], "
                 "output_dir: out}}\nstages: {throughput: {recipes: [a]}}\n")
    p = load_pipeline(f)
    assert p.model_dir == tmp_path / "models" / "m" and p.runner.srtctl.output_dir == tmp_path / "out"
    assert p.runner.srtctl.executable == (str(tmp_path / "bin" / "srtctl"), "--flag")
    assert p.name == "p" and p.file == f


def test_durations():
    assert [parse_duration(x) for x in (90, "90s", "30m", "2h", "01:30:00", "05:00")] == [90, 90, 1800, 7200, 5400, 300]


def test_the_gate_says_the_verdicts_budget_and_whether_undecided_fails(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    gate: {regression_threshold: 0.05, "
                 "min_rounds: 4, max_rounds: 6, undecided_fails: false}\n")
    policy = load_pipeline(f, tmp_path).stages.throughput.gate.policy()
    assert (policy.threshold, policy.min_rounds, policy.max_rounds, policy.undecided_fails) == (0.05, 4, 6, False)


def test_compare_and_bump_judge_by_the_pipelines_gate_else_the_defaults(tmp_path):
    from servestack.compare.verdicts import Policy
    from servestack.stages.pipeline import regression_policy
    from servestack.util.project import Project

    project = Project(root=tmp_path)
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "gated.yaml").write_text(
        "stack: x\nstages:\n  throughput:\n    recipes: [a]\n    gate: {regression_threshold: 0.05}\n")
    (tmp_path / "pipelines" / "accuracy-only.yaml").write_text(
        "stack: x\nstages:\n  accuracy:\n    recipes: [a]\n    gate: {threshold: 0.5}\n")
    assert regression_policy(project, "gated") == Policy(threshold=0.05)
    assert regression_policy(project, "accuracy-only") == regression_policy(project, "absent") == Policy()
