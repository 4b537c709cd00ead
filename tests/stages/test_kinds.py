"""Adding a stage kind is one entry in `stages.kinds.STAGE_KINDS`.

The table is held against the pipeline file's schema (the stages it defines, the gates an accuracy
stage may name), the planner and the collector are shown to take what differs from the entry, and
the last test fails when a special case keyed on a stage's name reappears in either.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fixtures.paths import ROOT
from servestack.records.stageresults import Verdict
from servestack.stages import kinds
from servestack.stages.execute import collect_stage, plan_stage
from servestack.stages.kinds import STAGE_KINDS, Judged, Reading, kind_of
from servestack.stages.pipeline import STAGES, AccuracyGate, load_pipeline
from servestack.util.project import Project

SRC = ROOT / "src" / "servestack"
IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "a" * 64
# What each of the accuracy gate's options names in a pipeline file: one kind per option.
ACCURACY_GATES = {"threshold": 0.5, "agreement_with": "agg-acc"}


def _pipeline(tmp_path: Path, stages: dict) -> Path:
    f = tmp_path / "pipelines" / "p.yaml"
    f.parent.mkdir(exist_ok=True)
    f.write_text(yaml.safe_dump({"stack": "dev-cpu", "stages": stages}))
    return f


def test_every_stage_the_pipeline_defines_runs_as_a_kind_and_every_kind_runs_one():
    assert {kind.stage for kind in STAGE_KINDS.values()} == set(STAGES)


def test_each_gate_a_pipeline_file_may_name_is_one_kind_of_the_table(tmp_path):
    assert set(ACCURACY_GATES) == set(AccuracyGate.model_fields), "a new accuracy gate needs its kind"
    selected = {}
    for option, value in ACCURACY_GATES.items():
        stages = {"accuracy": {"recipes": ["agg-acc", "disagg-acc"], "gate": {option: value}},
                  "throughput": {"recipes": ["agg"]}}
        for stage in load_pipeline(_pipeline(tmp_path, stages)).stages.defined().values():
            selected[f"{stage.name} with {option}"] = kind_of(stage)
    assert set(STAGE_KINDS.values()) == set(selected.values())  # no entry that no pipeline selects
    assert selected["accuracy with threshold"] is not selected["accuracy with agreement_with"]
    assert all(kind.stage == where.split()[0] for where, kind in selected.items())


def _dev_cpu_stage(name: str):
    project = Project(root=ROOT)
    pipeline = load_pipeline(project.pipelines / "dev-cpu.yaml", project.root)
    settings = getattr(pipeline.stages, name)
    return project, pipeline, settings.model_copy(update={"recipes": settings.recipes[:1]})


def test_the_planner_takes_the_points_and_the_command_from_the_stage_kind(tmp_path, monkeypatch):
    project, pipeline, stage = _dev_cpu_stage("throughput")
    command = {"argv": ["python3", "probe.py", "{out}"], "timeout": 5}
    monkeypatch.setitem(STAGE_KINDS, "throughput", replace(
        STAGE_KINDS["throughput"], points=lambda pipeline, stage, recipe: ("p0", "p1"),
        command=lambda c: (command, [])))
    [planned] = plan_stage(project, pipeline, stage, IMAGE, tmp_path, "local")
    assert planned.points == planned.spec.points == ("p0", "p1")
    assert planned.job is not None and planned.job["point"] == command


def test_the_collector_reads_and_gates_through_the_stage_kind(tmp_path, monkeypatch):
    project, pipeline, stage = _dev_cpu_stage("accuracy")
    planned = plan_stage(project, pipeline, stage, IMAGE, tmp_path, "local")
    for p in planned:
        for point in p.points:
            p.spec.point_file(point).parent.mkdir(parents=True, exist_ok=True)
            p.spec.point_file(point).write_text("{}")
    read: list[str] = []
    verdict = Verdict(stage="accuracy")

    def reading(f: Path, point: str, p: kinds.PlannedJob) -> Reading:
        read.append(f"{p.key}/{point}")
        return Reading(seconds=2.5)

    entry = next(name for name, kind in STAGE_KINDS.items() if kind is kind_of(stage))
    monkeypatch.setitem(STAGE_KINDS, entry, replace(STAGE_KINDS[entry], read=reading, judge=lambda stage, planned, readings:
                                                    Judged(verdict=verdict, conditions={key: {"read": r.seconds}
                                                                                        for key, r in readings})))
    result = collect_stage(pipeline, stage, planned, IMAGE, "local", tmp_path, [], since=0.0)
    assert read == [f"{p.key}/{pt}" for p in planned for pt in p.points] and read
    assert result.verdict is verdict and result.conditions == {p.key: {"read": 2.5} for p in planned}
    assert result.timing["benchmark_seconds"] == 2.5 * len(read)


def _function(path: Path, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize(("module", "function"), [("jobs.py", "plan_stage"), ("execute.py", "collect_stage")])
def test_no_special_case_by_stage_kind_in_the_planner_or_the_collector(module, function):
    named = set(STAGE_KINDS) | {kind.stage for kind in STAGE_KINDS.values()}
    cases = []
    for node in ast.walk(_function(SRC / "stages" / module, function)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            cases += [o.value for o in operands if isinstance(o, ast.Constant) and o.value in named]
        elif isinstance(node, ast.Attribute) and node.attr in AccuracyGate.model_fields:
            cases.append(node.attr)
    assert not cases, f"{module}:{function} special-cases {cases}: say it in stages.kinds.STAGE_KINDS"
