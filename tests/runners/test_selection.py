"""Adding a runner is one module and one entry in `runners.selection.RUNNERS`.

The test below adds one (a runner with its own pipeline settings) the way a new runner would be
added, and checks that the pipeline file, the CLI and the stage planner all take it from the
registry, with nothing else to change. The last test fails when a second list of runner names, or
a special case keyed on one runner's name, reappears in the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from fixtures.paths import ROOT
from servestack.cli import build_parser
from servestack.clients import CONTAINER_DIR
from servestack.errors import InputErrors
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait
from servestack.runners.local import LocalRunner
from servestack.runners.selection import RUNNERS, SRTCTL_ENV, RunnerKind, make_runner
from servestack.runners.slurm import SlurmRunner
from servestack.runners.srtctl import SrtctlRunner
from servestack.stages.execute import plan_stage
from servestack.stages.pipeline import load_pipeline
from servestack.util.project import Project

SRC = ROOT / "src" / "servestack"
IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "a" * 64


# -- the new runner's module ---------------------------------------------------------------------
class KubeSettings(BaseModel):
    """Its section of the pipeline file, `runner.kube`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    namespace: str = "default"


class KubeRunner(PollingWait):
    name = "kube"

    def __init__(self, namespace: str):
        self.namespace = namespace

    def submit(self, job: JobSpec) -> JobHandle:
        return JobHandle(runner=self.name, job_id="1", spec=job)

    def state(self, handle: JobHandle) -> JobState:
        return JobState.COMPLETED

    def cancel(self, handle: JobHandle) -> None:
        pass

    def collect(self, handle: JobHandle) -> Path:
        return handle.spec.out_dir


# -- its registry entry --------------------------------------------------------------------------
@pytest.fixture
def kube(monkeypatch):
    monkeypatch.setitem(RUNNERS, "kube", RunnerKind(make=lambda p: KubeRunner(p.runner.kube.namespace),
                                                    settings=KubeSettings))


def _pipeline(tmp_path: Path, runner: str) -> Path:
    f = tmp_path / "pipelines" / "p.yaml"
    f.parent.mkdir(exist_ok=True)
    f.write_text(f"stack: dev-cpu\nrunner: {runner}\nstages: {{throughput: {{recipes: [agg]}}}}\n")
    return f


def test_a_registered_runner_is_a_pipeline_kind_with_its_own_settings(tmp_path, kube):
    pipeline = load_pipeline(_pipeline(tmp_path, "{kind: kube, kube: {namespace: bench}}"))
    runner = make_runner(pipeline)
    assert isinstance(runner, KubeRunner) and runner.namespace == "bench"
    with pytest.raises(InputErrors, match=r"runner.kube.namespce: unknown field; did you mean `namespace`\?"):
        load_pipeline(_pipeline(tmp_path, "{kind: kube, kube: {namespce: bench}}"))


def test_an_unregistered_runner_is_rejected_naming_the_registered_ones(tmp_path):
    with pytest.raises(InputErrors, match=r"runner.kind: Input should be 'local', 'slurm' or 'srtctl' \(got 'kube'\)"):
        load_pipeline(_pipeline(tmp_path, "{kind: kube}"))


def test_a_registered_runner_is_a_cli_choice(kube):
    assert build_parser().parse_args(["pipeline", "--runner", "kube"]).runner == "kube"


def test_an_unregistered_runner_is_not_a_cli_choice(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pipeline", "--runner", "kube"])
    assert "invalid choice: 'kube'" in capsys.readouterr().err


def test_jobs_are_planned_as_the_registry_entry_says(tmp_path, kube, monkeypatch):
    """A runner that does not submit recipes gets servestack's run_points command in the image; one
    that does (like srtctl) gets the stage's recipe itself."""
    monkeypatch.setitem(RUNNERS, "kube-recipes", RunnerKind(make=lambda p: KubeRunner("x"), submits_recipes=True))
    (tmp_path / "model").mkdir()
    f = _pipeline(tmp_path, "{kind: kube}")
    f.write_text(f.read_text() + f"model_dir: {tmp_path / 'model'}\n")
    project = Project(root=ROOT)  # its recipes/dev-cpu/agg.yaml
    pipeline = load_pipeline(f, project.root)
    stage = pipeline.stages.throughput
    [command_job] = plan_stage(project, pipeline, stage, IMAGE, tmp_path / "out")
    assert f"{CONTAINER_DIR}/run_points.py" in command_job.spec.command and command_job.job is not None
    [recipe_job] = plan_stage(project, pipeline, stage, IMAGE, tmp_path / "out", "kube-recipes")
    assert recipe_job.spec.command == () and recipe_job.spec.recipe_file.name == "agg.yaml"
    assert recipe_job.job is None and recipe_job.spec.extra["model_dir"] == str(tmp_path / "model")


def test_the_pipeline_settings_reach_the_registered_runners(tmp_path, monkeypatch):
    monkeypatch.delenv(SRTCTL_ENV, raising=False)
    f = _pipeline(tmp_path, "{kind: slurm, slurm: {partition: gpu, container: pyxis, extra_sbatch: [--exclusive]}, "
                            "srtctl: {executable: [./srtctl, -v], output_dir: out}}")
    f.write_text(f.read_text() + "retry: {poll_seconds: 7}\n")
    pipeline = load_pipeline(f)
    slurm = make_runner(pipeline)
    assert isinstance(slurm, SlurmRunner) and slurm.poll_seconds == 7.0
    assert (slurm.cfg.partition, slurm.cfg.container, slurm.cfg.extra_sbatch) == ("gpu", "pyxis", ("--exclusive",))
    srtctl = make_runner(pipeline, "srtctl")
    assert isinstance(srtctl, SrtctlRunner) and srtctl.executable == [str(tmp_path / "srtctl"), "-v"]
    assert srtctl.output_base == tmp_path / "out" and srtctl.poll_seconds == 7.0
    assert isinstance(make_runner(pipeline, "local"), LocalRunner)


def test_no_second_list_of_runners_and_no_special_case_by_name():
    names = set(RUNNERS)
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "runners" / "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                listed = {e.value for e in node.elts if isinstance(e, ast.Constant)} & names
                if len(listed) >= 2:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: a list of runners {sorted(listed)}")
            elif isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                named = [o.value for o in operands if isinstance(o, ast.Constant) and o.value in names]
                if named:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: a special case for runner {named[0]}")
    assert problems == []
