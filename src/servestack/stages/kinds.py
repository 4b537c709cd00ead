"""The stage kinds, by what differs between them: the one table.

A kind is what a stage measures and how it is judged: the throughput sweep, GSM8K accuracy, or the
oracle's agreement with a reference recipe (an accuracy stage whose gate names `agreement_with`).
Each entry says how the kind plans (its points, the command run_points runs for each, what srtctl
needs beside the recipe), how it reads a point's result file, and how it gates what it read. The
planner (jobs.py) and the collector (execute.py) do the rest the same way for every kind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from servestack.clients import CLIENTS_DIR, CONTAINER_DIR
from servestack.errors import InputError
from servestack.recipes.read import RecipeView
from servestack.records.stageresults import AccuracyRun, ThroughputPoint, Verdict
from servestack.runners.interface import Mount
from servestack.stages.datasets import gsm8k_dir
from servestack.stages.gates import evaluate_accuracy, evaluate_agreement, evaluate_throughput
from servestack.stages.pipeline import AccuracyStage, Pipeline, Stage, ThroughputStage
from servestack.stages.results import (
    compare_answers,
    load_answers,
    parse_gsm8k_result,
    parse_throughput_point,
    parse_vllm_result,
    throughput_point,
)
from servestack.util.project import Project

DATA = "/data/gsm8k"  # GSM8K in the container


class PlannedJob(Protocol):
    """A planned job as a kind reads it (stages.jobs._Planned)."""

    @property
    def key(self) -> str: ...
    @property
    def recipe(self) -> RecipeView: ...
    @property
    def points(self) -> tuple[str, ...]: ...
    @property
    def gpus(self) -> int: ...
    @property
    def runner_kind(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class PointCommand:
    """What one recipe's job needs to measure a point in its container (run_points' "point")."""

    project: Project
    pipeline: Pipeline
    stage: Stage
    recipe: RecipeView
    key: str  # the recipe as the pipeline names it
    model: str  # the model as the server sees it
    gpus: int
    base_url: str


@dataclass(frozen=True, kw_only=True)
class Reading:
    """What one point's result file holds, toward the stage's result."""

    seconds: float  # the benchmark's own duration
    throughput: tuple[ThroughputPoint, ...] = ()
    accuracy: tuple[AccuracyRun, ...] = ()
    answers: dict[str, Any] | None = None  # the oracle's


@dataclass(frozen=True, kw_only=True)
class Judged:
    """A stage's readings put together and gated: the StageResult fields a kind fills in."""

    verdict: Verdict
    throughput: list[ThroughputPoint] = field(default_factory=list)
    accuracy: list[AccuracyRun] = field(default_factory=list)
    agreement: list[dict[str, Any]] = field(default_factory=list)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StageKind:
    stage: str  # the pipeline's `stages.<name>` that runs as this kind
    # Planning: the points of one recipe, in the order they are measured.
    points: Callable[[Pipeline, Stage, RecipeView], tuple[str, ...]]
    # A run_points job: the command for one point, and the host directories it reads.
    command: Callable[[PointCommand], tuple[dict[str, Any], list[Mount]]]
    # An srtctl job (the recipe itself): the recipe field its points go in (None: it has none), the
    # points of each job (one job per group), and what the recipe's benchmark needs on the host.
    points_field: str | None
    srtctl_jobs: Callable[[Stage, tuple[str, ...]], list[tuple[str, ...]]]
    srtctl_inputs: Callable[[Project, Pipeline], dict[str, object]]
    # Collecting: one point's result file; then every reading gated.
    read: Callable[[Path, str, PlannedJob], Reading]
    judge: Callable[[Stage, Sequence[PlannedJob], list[tuple[str, Reading]]], Judged]


def _throughput(stage: Stage) -> ThroughputStage:
    if not isinstance(stage, ThroughputStage):
        raise TypeError(f"the {stage.name} stage planned as throughput")
    return stage


def _accuracy(stage: Stage) -> AccuracyStage:
    if not isinstance(stage, AccuracyStage):
        raise TypeError(f"the {stage.name} stage planned as accuracy")
    return stage


# ----------------------------------------------------------------------------- throughput

def _sweep(pipeline: Pipeline, stage: Stage, recipe: RecipeView) -> tuple[str, ...]:
    settings = _throughput(stage)
    concs = list(settings.concurrencies or recipe.concurrencies)
    if not concs:
        raise InputError(recipe.file, "benchmark.concurrencies",
                         f"no concurrency points (set them here or in {pipeline.file} stages.throughput)")
    # Round by round (1, 4, 1-r1, 4-r1, ...): a server slower for a minute (its first
    # requests, a noisy neighbour) then costs every concurrency a little instead of
    # every repeat of one point, which a baseline gate would read as its regression.
    return tuple(throughput_point(c, k) for k in range(settings.repeats) for c in concs)


def _bench_serve(c: PointCommand) -> tuple[dict[str, Any], list[Mount]]:
    stage, recipe, python = _throughput(c.stage), c.recipe, c.pipeline.runner.python
    isl = stage.input_len or int(recipe.benchmark.get("isl") or 128)
    osl = stage.output_len or int(recipe.benchmark.get("osl") or 32)
    mult = stage.prompts_per_concurrency or int(recipe.benchmark.get("num_prompts_mult") or 10)
    point = {
        "argv": [python, f"{CONTAINER_DIR}/vllm_bench_serve.py",
                 "--backend", "vllm", "--base-url", c.base_url, "--endpoint", "/v1/completions",
                 "--model", c.model, "--served-model-name", recipe.served_model_name,
                 "--tokenizer", c.model, "--dataset-name", "random",
                 "--random-input-len", str(isl), "--random-output-len", str(osl),
                 "--num-prompts", "{num_prompts}", "--max-concurrency", "{concurrency}",
                 "--request-rate", "inf", "--ignore-eos", "--seed", "0", "--temperature", "0",
                 "--ready-check-timeout-sec", "60",
                 "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                 "--disable-tqdm", "--save-result", "--result-dir", "{out_dir}",
                 "--result-filename", "{out_name}",
                 "--metadata", f"servestack_recipe={c.key}", f"servestack_gpus={c.gpus}"],
        "prompts_per_point": mult, "min_prompts": stage.min_prompts,
        "timeout": stage.time_limit,
    }
    return point, []


def _per_repeat(stage: Stage, points: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The recipe's job sweeps each concurrency once: one job per repeat (a fresh deployment each,
    so the repeats also show how much one deployment differs from the next)."""
    repeats = _throughput(stage).repeats
    if repeats == 1:
        return [points]
    return [tuple(p for p in points if parse_throughput_point(p)[1] == k) for k in range(repeats)]


def _no_inputs(project: Project, pipeline: Pipeline) -> dict[str, object]:
    return {}


def _read_throughput(f: Path, point: str, p: PlannedJob) -> Reading:
    conc, repeat = parse_throughput_point(point)
    tp = replace(parse_vllm_result(f, recipe=p.key, gpus=p.gpus, concurrency=conc), repeat=repeat)
    return Reading(throughput=(tp,), seconds=tp.duration_s)


def conditions(p: PlannedJob, stage: Stage) -> dict[str, object]:
    """What makes two throughput runs of a recipe the same experiment (compare.py holds them equal):
    the workload and the hardware it ran on. Not the serving flags: changing those, like changing
    the image, is what a comparison is for."""
    settings = _throughput(stage)
    bench = p.recipe.benchmark
    resources = p.recipe.raw.get("resources") or {}
    placement = json.dumps({"resources": resources, "benchmark": {k: v for k, v in bench.items() if k != "concurrencies"}},
                           sort_keys=True, default=str)
    return {"isl": settings.input_len or int(bench.get("isl") or 128),
            "osl": settings.output_len or int(bench.get("osl") or 32),
            "prompts_per_concurrency": settings.prompts_per_concurrency or int(bench.get("num_prompts_mult") or 10),
            "gpus": p.gpus, "gpu_type": resources.get("gpu_type"), "runner": p.runner_kind,
            "resources_and_benchmark_sha256": hashlib.sha256(placement.encode()).hexdigest()}


def _judge_throughput(stage: Stage, planned: Sequence[PlannedJob], readings: list[tuple[str, Reading]]) -> Judged:
    settings = _throughput(stage)
    points = [tp for _, r in readings for tp in r.throughput]
    expected = {p.key: sorted({parse_throughput_point(x)[0] for x in p.points}) for p in planned}
    return Judged(throughput=points, conditions={p.key: conditions(p, stage) for p in planned},
                  verdict=evaluate_throughput(points, expected, settings.gate.config(), repeats=settings.repeats))


# ----------------------------------------------------------------------------- accuracy (GSM8K)

def _stage_points(pipeline: Pipeline, stage: Stage, recipe: RecipeView) -> tuple[str, ...]:
    return _accuracy(stage).points


def _gsm8k(c: PointCommand) -> tuple[dict[str, Any], list[Mount]]:
    g, python = _accuracy(c.stage).gsm8k, c.pipeline.runner.python
    data = gsm8k_dir(c.project.root, c.pipeline.data_dir, c.pipeline.file)
    point = {
        "argv": [python, f"{CONTAINER_DIR}/gsm8k.py", "--base-url", c.base_url,
                 "--model", c.recipe.served_model_name, "--dataset", f"{DATA}/test.jsonl",
                 "--fewshot-from", f"{DATA}/train.jsonl", "--num-questions", str(g.num_questions),
                 "--shots", str(g.shots), "--repeats", "1", "--first-repeat", "{index}",
                 "--concurrency", str(g.concurrency), "--max-tokens", str(g.max_tokens),
                 "--out", "{out}"],
        "timeout": c.stage.time_limit,
    }
    return point, [Mount(host=data, container=DATA)]


def _one_job(stage: Stage, points: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [points]


def _gsm8k_on_host(project: Project, pipeline: Pipeline) -> dict[str, object]:
    return {"gsm8k_dir": str(gsm8k_dir(project.root, pipeline.data_dir, pipeline.file))}


def _read_gsm8k(f: Path, point: str, p: PlannedJob) -> Reading:
    runs = parse_gsm8k_result(f, recipe=p.key)
    idx = int(point.rsplit("-", 1)[-1])
    runs = [r if len(runs) > 1 else replace(r, repeat=idx) for r in runs]
    return Reading(accuracy=tuple(runs), seconds=sum(float(r.seconds or 0.0) for r in runs))


def _judge_gsm8k(stage: Stage, planned: Sequence[PlannedJob], readings: list[tuple[str, Reading]]) -> Judged:
    runs = [a for _, r in readings for a in r.accuracy]
    return Judged(accuracy=runs, verdict=evaluate_accuracy(runs, {p.key: len(p.points) for p in planned},
                                                           _accuracy(stage).gate.config()))


# ----------------------------------------------------------------------------- agreement (the oracle)

def _oracle_vocab(project: Project, pipeline: Pipeline) -> int:
    from servestack.lock import load_lock
    from servestack.smoke.checklist import oracle_vocab

    vocab = oracle_vocab(load_lock(project, pipeline.stack))
    if vocab is None:
        raise InputError(pipeline.file, "stages.accuracy.gate.agreement_with",
                         f"the oracle needs a smoke model the project makes; {pipeline.stack}'s is a checkpoint (use threshold)")
    return vocab


def _collect_answers(c: PointCommand) -> tuple[dict[str, Any], list[Mount]]:
    point = {
        "argv": [c.pipeline.runner.python, f"{CONTAINER_DIR}/agreement.py", "collect", "--base-url", c.base_url,
                 "--model", c.recipe.served_model_name, "--vocab-size", str(_oracle_vocab(c.project, c.pipeline)),
                 "--out", "{out}"],
        "timeout": c.stage.time_limit,
    }
    return point, []


def _clients_on_host(project: Project, pipeline: Pipeline) -> dict[str, object]:
    return {"clients_dir": str(CLIENTS_DIR)}  # the recipe's custom benchmark runs agreement.py


def _read_answers(f: Path, point: str, p: PlannedJob) -> Reading:
    answers = load_answers(f)
    return Reading(answers=answers, seconds=float(answers.get("seconds") or 0.0))


def _judge_agreement(stage: Stage, planned: Sequence[PlannedJob], readings: list[tuple[str, Reading]]) -> Judged:
    reference = _accuracy(stage).gate.agreement_with
    if reference is None:
        raise TypeError("the agreement kind without a reference recipe")
    answers = {key: r.answers for key, r in readings if r.answers is not None}
    agreement, runs = compare_answers(answers, reference)
    return Judged(agreement=agreement, accuracy=runs,
                  verdict=evaluate_agreement(agreement, reference, [p.key for p in planned], set(answers)))


STAGE_KINDS: dict[str, StageKind] = {
    "throughput": StageKind(stage="throughput", points=_sweep, command=_bench_serve,
                            points_field="benchmark.concurrencies", srtctl_jobs=_per_repeat, srtctl_inputs=_no_inputs,
                            read=_read_throughput, judge=_judge_throughput),
    "accuracy": StageKind(stage="accuracy", points=_stage_points, command=_gsm8k, points_field=None,
                          srtctl_jobs=_one_job, srtctl_inputs=_gsm8k_on_host, read=_read_gsm8k, judge=_judge_gsm8k),
    "agreement": StageKind(stage="accuracy", points=_stage_points, command=_collect_answers, points_field=None,
                           srtctl_jobs=_one_job, srtctl_inputs=_clients_on_host, read=_read_answers,
                           judge=_judge_agreement),
}


def kind_of(stage: Stage) -> StageKind:
    """The entry a pipeline's stage runs as (the stage's settings name it: pipeline.py `kind`)."""
    return STAGE_KINDS[stage.kind]
