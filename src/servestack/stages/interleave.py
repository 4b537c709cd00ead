"""Measuring A and B alongside: both images by digest in one session on one runner, in ABBA order.

Per recipe both servers start once and stay up (one container each, the local runner); then, round
by round, every concurrency point still open is measured as a pair: A then B in even rounds, B then
A in odd ones, so a machine that slows during a round slows both halves of its pair, and a trend
within the round falls once on each side over two rounds. A session may hold more arms than two
(A, A', B: an A/A and an A/B from three server starts); each is compared with the first. After
`min_rounds` each open point is judged on the gated metric (verdicts.py, paired); a decided point
is measured no more, and the session stops when every point is decided or `max_rounds` is spent.

The servers run `clients/run_points.py --orders`: this process writes the point it wants next, the
container measures it and answers, so the order measured is the order asked. Result files are the
pipeline's (`<out>/<side>/<recipe>/<concurrency>-r<round>.json`); a session resumed with its run id
skips the points whose files are on disk (run_points does).

Only the local runner holds two servers at once: a Slurm job with --exclusive would wait for the
other to end, and srtctl's jobs are whole deployments.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from servestack.compare import Comparison, verdicts
from servestack.errors import InputError, ServestackError
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import Project

if TYPE_CHECKING:
    from servestack.runners.interface import JobHandle, Runner
    from servestack.stages.jobs import _Planned
    from servestack.stages.pipeline import Stage

SIDES = ("a", "b")  # a comparison's two arms: the reference and the image under test
ORDERS = ".orders"  # in each job's result directory: run_points' orders and answers
ANSWER_POLL_S = 0.1  # a stat of one small file: cheap next to any point
RUNNER_POLL_EVERY = 20  # answer polls between two questions to the runner whether the server still runs


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One server of a session: an image by digest, started with a pipeline's flags. The first arm
    is the reference every other is compared with; arms differ in image or serving flags, never in
    workload (compare.py names a recipe whose conditions differ instead of comparing it)."""

    name: str  # its directory in the session
    image: str
    pipeline: str  # pipelines/<name>.yaml: the throughput stage and the server's flags


def pair(image_a: str, image_b: str, pipeline: str, pipeline_b: str | None = None) -> tuple[Arm, Arm]:
    return (Arm(name="a", image=image_a, pipeline=pipeline),
            Arm(name="b", image=image_b, pipeline=pipeline_b or pipeline))


def order(round_index: int, arms: tuple[str, ...] = SIDES) -> tuple[str, ...]:
    """ABBA (ABC, CBA for three): the arms in order in even rounds, reversed in odd ones."""
    return arms if round_index % 2 == 0 else arms[::-1]


def schedule(concurrencies: list[int], round_index: int, arms: tuple[str, ...] = SIDES) -> list[tuple[str, int]]:
    """One round as measured: each open point in sweep order, its arms in the round's order."""
    return [(arm, c) for c in concurrencies for arm in order(round_index, arms)]


@dataclass(frozen=True, kw_only=True)
class PointLog:
    """How a point was decided for one arm against the reference: the closing note per verdict."""

    recipe: str
    concurrency: int
    arm: str
    rounds: int
    seconds: float  # client time for this point, every arm of the session
    verdict: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Orders:
    """One server's order queue (run_points.serve_orders), seen from the asking side."""

    directory: Path
    still_running: Callable[[], bool]
    seq: list[int] = field(default_factory=lambda: [0])  # the next order's number (only this side asks)

    def serving(self) -> bool:
        return (self.directory / "serving").exists()

    def ask(self, order_: dict, timeout_s: float) -> dict:
        n = self.seq[0]
        atomic_write_json(self.directory / f"{n}.json", order_)
        deadline = time.monotonic() + timeout_s
        answer = self.directory / f"{n}.done"
        polls = 0
        while not answer.exists():
            polls += 1
            # The answer file is a stat; the container's state is a call to the runner (docker's API).
            if polls % RUNNER_POLL_EVERY == 0 and not self.still_running():
                raise ServestackError(f"{self.directory.parent}: the server's container ended while measuring {order_}")
            if time.monotonic() > deadline:
                raise ServestackError(f"{self.directory.parent}: no answer to {order_} in {timeout_s:.0f} s")
            time.sleep(ANSWER_POLL_S)
        self.seq[0] = n + 1
        return json.loads(answer.read_text())


@dataclass(frozen=True, kw_only=True)
class Session:
    """What an interleaved session measured: each arm's points and recipes' conditions, and how each
    point was decided."""

    arms: tuple[Arm, ...]
    points: dict[str, list]  # {arm: [ThroughputPoint]}, repeat = the round
    conditions: dict[str, dict[str, dict]]  # {arm: {recipe: stages.jobs.conditions}}
    decided: list[PointLog]


def _client_seconds(out_dir: Path, point: str) -> float:
    """run_points' timing record of one point (0 when it has none: resumed from disk)."""
    f = out_dir / ".timing.jsonl"
    if not f.exists():
        return 0.0
    events = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return sum(float(e.get("seconds") or 0) for e in events if e.get("event") == "point" and e.get("point") == point)


def _gated(recipe: str, c: int, dirs: dict[str, Path], arms: tuple[str, str], rounds: int, gpus: int,
           policy: verdicts.Policy) -> verdicts.Decision:
    """The gated metric at one point, the reference arm against another, over the rounds both finished."""
    from servestack.compare import GATED, METRICS
    from servestack.stages.results import parse_vllm_result, throughput_point

    values: dict[str, list[float]] = {arm: [] for arm in arms}
    for k in range(rounds):
        pair_ = {arm: dirs[arm] / f"{throughput_point(c, k)}.json" for arm in arms}
        if not all(f.exists() for f in pair_.values()):
            continue  # a failed half leaves its round unpaired
        for arm, f in pair_.items():
            values[arm].append(float(getattr(parse_vllm_result(f, recipe=recipe, gpus=gpus, concurrency=c), GATED[0])))
    metric = next(m for m in METRICS if m.key == GATED[0])
    return verdicts.judge(values[arms[0]], values[arms[1]], higher_is_better=metric.higher_is_better, alongside=True,
                          policy=policy)


def compared(session: Session, stack: str, labels: tuple[str, str], out: Path, policy: verdicts.Policy,
             arms: tuple[str, str] = SIDES) -> Comparison:
    """Two arms of the session compared paired (compare.py), as a Comparison."""
    from servestack import compare
    from servestack.stages.results import StageResult

    by_name = {a.name: a for a in session.arms}
    sides = []
    for arm, label in zip(arms, labels, strict=True):
        measured = StageResult(stack=stack, pipeline=by_name[arm].pipeline, stage="throughput",
                               image=by_name[arm].image, runner="local", out_dir=out / arm,
                               throughput=session.points[arm], conditions=session.conditions[arm])
        sides.append(compare.side_from_stages([measured], label)[0])
    return compare.compare(sides[0], sides[1], policy, alongside=True)


def measure_and_compare(project: Project, stack: str, arms: tuple[Arm, Arm], run_id: str, labels: tuple[str, str],
                        policy: verdicts.Policy, *, out: Path | None = None, recipes: tuple[str, ...] | None = None
                        ) -> tuple[Session, Comparison, Path]:
    """Both arms measured alongside, compared paired and written where comparisons.place puts the
    pair (or `out`): the session, the comparison and its Markdown report. `labels` name the sides,
    each followed by the run id."""
    from servestack.compare import comparisons

    out = out or comparisons.place(project, stack, arms[0].image, run_id, arms[1].image, run_id)
    session = measure(project, arms, out, policy=policy, recipes=recipes)
    comparison = compared(session, stack, (f"{labels[0]} {run_id}", f"{labels[1]} {run_id}"), out, policy)
    return session, comparison, comparisons.write(comparison, out, [d.__dict__ for d in session.decided])


def _measured(planned: list, arm_dir: Path) -> list:
    """Every result file an arm's recipes hold, as ThroughputPoints (repeat: the round)."""
    from servestack.stages.results import parse_throughput_point, parse_vllm_result

    points = []
    for p in planned:
        for f in sorted((arm_dir / p.key).glob("*.json")):
            try:
                c, k = parse_throughput_point(f.stem)
            except ValueError:
                continue
            points.append(replace(parse_vllm_result(f, recipe=p.key, gpus=p.gpus, concurrency=c), repeat=k))
    return points


def measure(project: Project, arms: tuple[Arm, ...], out: Path, *, policy: verdicts.Policy,
            recipes: tuple[str, ...] | None = None, runner: Runner | None = None) -> Session:
    """Every arm's throughput stage, interleaved, into `out/<arm>`. The first arm's pipeline says
    the recipes, points and workload, and which runner holds the servers."""
    from servestack.runners.selection import RUNNERS, make_runner
    from servestack.stages.jobs import _selected, plan_stage, write_job_files
    from servestack.stages.kinds import conditions
    from servestack.stages.pipeline import load_pipeline

    pipelines = {arm.name: load_pipeline(project.pipelines / f"{arm.pipeline}.yaml", project.root) for arm in arms}
    first = pipelines[arms[0].name]
    stages: dict[str, Stage] = {}
    for name, p in pipelines.items():
        stage = _selected(p, recipes).get("throughput")
        if stage is None:
            raise InputError(p.file, "stages.throughput", "no throughput stage to measure alongside")
        stages[name] = stage
    runner = runner or make_runner(first)
    if RUNNERS[runner.name].allocates_nodes or RUNNERS[runner.name].submits_recipes:
        raise InputError(first.file, "runner.kind", f"arms are measured alongside by a runner that holds their servers "
                                                    f"at once on this host; {runner.name} allocates nodes")
    planned = {arm.name: plan_stage(project, pipelines[arm.name], stages[arm.name], arm.image, out / arm.name,
                                    runner.name) for arm in arms}
    logs: list[PointLog] = []
    for recipe_jobs in zip(*planned.values(), strict=False):
        for p in recipe_jobs:
            if p.job is None:
                raise InputError(first.file, "stages.throughput.recipes",
                                 f"{p.key} is started by {p.runner_kind}, not a server this session can hold")
        logs += _measure_recipe(runner, dict(zip(planned, recipe_jobs, strict=True)), stages[arms[0].name], policy,
                                write_job_files)
    atomic_write_json(out / "measuring.json", [p.__dict__ for p in logs])
    return Session(arms=arms, points={name: _measured(planned[name], out / name) for name in planned},
                   conditions={name: {p.key: conditions(p, stages[name]) for p in planned[name]} for name in planned},
                   decided=logs)


def _still_running(runner: Runner, handle: JobHandle) -> bool:
    return not runner.state(handle).terminal


def _measure_recipe(runner: Runner, planned: dict[str, _Planned], stage: Stage, policy: verdicts.Policy,
                    write_job_files: Callable[[list[_Planned]], None]) -> list[PointLog]:
    from servestack.stages.jobs import RESULTS
    from servestack.stages.results import parse_throughput_point, throughput_point

    names = tuple(planned)
    reference = names[0]
    key = planned[reference].key
    concurrencies = sorted({parse_throughput_point(p)[0] for p in planned[reference].points})
    specs, handles, queues = {}, {}, {}
    for arm, p in planned.items():
        command = (*(a for a in p.spec.command if a not in ("--points", "{points}")), "--orders", f"{RESULTS}/{ORDERS}")
        # A server stays up for every round, not one sweep: the runner's limit is the session's.
        specs[arm] = replace(p.spec, name=f"{p.spec.name}-{arm}", command=command, points=(),
                             time_limit_s=p.spec.time_limit_s * policy.max_rounds)
    write_job_files(list(planned.values()))
    try:
        for arm in names:
            handles[arm] = runner.submit(specs[arm])
            queues[arm] = Orders(directory=specs[arm].out_dir / ORDERS,
                                 still_running=functools.partial(_still_running, runner, handles[arm]))
        deadline = time.monotonic() + stage.time_limit
        while not all(q.serving() for q in queues.values()):
            if not all(q.still_running() for q in queues.values()) or time.monotonic() > deadline:
                raise ServestackError(f"{key}: a server did not come up for the interleaved session (server.log in "
                                      + ", ".join(str(s.out_dir) for s in specs.values()) + ")")
            time.sleep(ANSWER_POLL_S * 4)
        dirs = {arm: specs[arm].out_dir for arm in names}
        open_points = {c: set(names[1:]) for c in concurrencies}  # the arms still undecided at each point
        seconds, logs = {c: 0.0 for c in concurrencies}, []
        for k in range(policy.max_rounds):
            for arm, c in schedule([c for c in concurrencies if open_points[c]], k, names):
                point = throughput_point(c, k)
                queues[arm].ask({"point": point}, stage.time_limit)
                seconds[c] += _client_seconds(dirs[arm], point)
            for c in concurrencies:
                for arm in sorted(open_points[c]):
                    d = _gated(key, c, dirs, (reference, arm), k + 1, planned[reference].gpus, policy)
                    if d.verdict == verdicts.UNDECIDED and k + 1 < policy.max_rounds:
                        continue
                    open_points[c].discard(arm)
                    logs.append(PointLog(recipe=key, concurrency=c, arm=arm, rounds=k + 1,
                                         seconds=round(seconds[c], 1), verdict=d.verdict, reason=d.reason))
                    console.progress(f"{key} c={c} {arm}: {d.verdict} after {k + 1} rounds ({seconds[c]:.0f} s measuring): "
                                     f"{d.reason}")
            if not any(open_points.values()):
                break
        for arm in names:
            queues[arm].ask({"stop": True}, 120)
            runner.wait(handles[arm], timeout=180)
        return logs
    except BaseException:
        for h in handles.values():
            runner.cancel(h)
        raise
    finally:
        for h in handles.values():
            runner.collect(h)
