"""Measuring A and B alongside: both images by digest in one session on one runner, in ABBA order.

Per recipe both servers start once and stay up (one container each, the local runner); then, round
by round, every concurrency point still open is measured as a pair: A then B in even rounds, B then
A in odd ones, so a machine that slows during a round slows both halves of its pair, and a trend
within the round falls once on each side over two rounds. After `min_rounds` each open point is
judged on the gated metrics (verdicts.py, paired); a decided point is measured no more, and the
session stops when every point is decided or `max_rounds` is spent.

The servers run `clients/run_points.py --orders`: this process writes the point it wants next, the
container measures it and answers, so the order measured is the order asked. Result files are the
pipeline's (`<out>/<side>/<recipe>/<concurrency>-r<round>.json`); a session resumed with its run id
skips the points whose files are on disk (run_points does).

Only the local runner holds two servers at once: a Slurm job with --exclusive would wait for the
other to end, and srtctl's jobs are whole deployments.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import verdicts
from .errors import InputError, ServestackError
from .fsutil import atomic_write_json

log = logging.getLogger("servestack.interleave")

SIDES = ("a", "b")
ORDERS = ".orders"  # in each job's result directory: run_points' orders and answers
ANSWER_POLL_S = 0.5


def order(round_index: int) -> tuple[str, str]:
    """ABBA: A first in even rounds, B first in odd ones."""
    return SIDES if round_index % 2 == 0 else SIDES[::-1]


def schedule(concurrencies: list[int], round_index: int) -> list[tuple[str, int]]:
    """One round as measured: each open point in sweep order, as a pair in the round's order."""
    return [(side, c) for c in concurrencies for side in order(round_index)]


@dataclass(frozen=True, kw_only=True)
class PointLog:
    """How a point was decided: what the report's closing note gives per verdict."""

    recipe: str
    concurrency: int
    rounds: int
    seconds: float  # both sides' client time for this point
    verdict: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Orders:
    """One server's order queue (run_points.serve_orders), seen from the asking side."""

    directory: Path
    still_running: Callable[[], bool]
    seq: list[int] = field(default_factory=lambda: [0])  # the next order's number (this side only asks)

    def serving(self) -> bool:
        return (self.directory / "serving").exists()

    def ask(self, order_: dict, timeout_s: float) -> dict:
        n = self.seq[0]
        atomic_write_json(self.directory / f"{n}.json", order_)
        deadline = time.monotonic() + timeout_s
        answer = self.directory / f"{n}.done"
        while not answer.exists():
            if not self.still_running():
                raise ServestackError(f"{self.directory.parent}: the server's container ended while measuring {order_}")
            if time.monotonic() > deadline:
                raise ServestackError(f"{self.directory.parent}: no answer to {order_} in {timeout_s:.0f} s")
            time.sleep(ANSWER_POLL_S)
        self.seq[0] = n + 1
        return json.loads(answer.read_text())


def _client_seconds(out_dir: Path, point: str) -> float:
    """run_points' timing record of one point (0 when it has none: resumed from disk)."""
    f = out_dir / ".timing.jsonl"
    if not f.exists():
        return 0.0
    events = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return sum(float(e.get("seconds") or 0) for e in events if e.get("event") == "point" and e.get("point") == point)


def _gated_decision(recipe: str, c: int, dirs: dict[str, Path], rounds: int, gpus: int,
                    policy: verdicts.Policy) -> verdicts.Decision:
    from .compare import GATED, METRICS
    from .stages.results import parse_vllm_result, throughput_point

    values: dict[str, list[float]] = {side: [] for side in SIDES}
    for k in range(rounds):
        pair = {side: dirs[side] / f"{throughput_point(c, k)}.json" for side in SIDES}
        if not all(f.exists() for f in pair.values()):
            continue  # a failed half leaves its round unpaired
        for side, f in pair.items():
            values[side].append(float(getattr(parse_vllm_result(f, recipe=recipe, gpus=gpus, concurrency=c), GATED[0])))
    metric = next(m for m in METRICS if m.key == GATED[0])
    return verdicts.judge(values["a"], values["b"], higher_is_better=metric.higher_is_better, alongside=True,
                          policy=policy)


@dataclass(frozen=True, kw_only=True)
class Session:
    """What an interleaved session measured: each side's points, the recipes' conditions, and how
    each point was decided."""

    points: dict[str, list]  # {side: [ThroughputPoint]}, repeat = the round
    conditions: dict[str, dict]  # {recipe: stages.plan.conditions}
    decided: list[PointLog]


def compared(session: Session, stack: str, pipeline: str, images: tuple[str, str], labels: tuple[str, str],
             out: Path, policy: verdicts.Policy):
    """The session's two sides, compared paired (compare.py), as a Comparison."""
    from . import compare
    from .stages.results import StageResult

    sides = []
    for side, image, label in zip(SIDES, images, labels):
        measured = StageResult(stack=stack, pipeline=pipeline, stage="throughput", image=image, runner="local",
                               out_dir=out / side, throughput=session.points[side], conditions=session.conditions)
        sides.append(compare.side_from_results({"stages": [measured.to_dict()]}, label, out / side)[0])
    return compare.compare(sides[0], sides[1], policy, alongside=True)


def _measured(planned: list, side_dir: Path) -> list:
    """Every result file a side's recipes hold, as ThroughputPoints (repeat: the round)."""
    from .stages.results import parse_throughput_point, parse_vllm_result

    points = []
    for p in planned:
        for f in sorted((side_dir / p.key).glob("*.json")):
            try:
                c, k = parse_throughput_point(f.stem)
            except ValueError:
                continue
            points.append(replace(parse_vllm_result(f, recipe=p.key, gpus=p.gpus, concurrency=c), repeat=k))
    return points


def measure(project, pipeline_name: str, image_a: str, image_b: str, out: Path, *, policy: verdicts.Policy,
            recipes: tuple[str, ...] | None = None, runner=None,
            echo: Callable[[str], None] | None = print) -> Session:
    """Both images' throughput stage, interleaved, into `out/a` and `out/b`. The pipeline's
    throughput stage says the recipes, points and workload."""
    from .runners.registry import make_runner
    from .stages.pipeline import load_pipeline
    from .stages.run import _selected, plan_stage, write_job_files

    pipeline = load_pipeline(project.pipelines / f"{pipeline_name}.yaml", project.root)
    stage = _selected(pipeline, recipes).get("throughput")
    if stage is None:
        raise InputError(pipeline.file, "stages.throughput", "no throughput stage to measure alongside")
    from .runners.registry import RUNNERS

    runner = runner or make_runner(pipeline)
    if RUNNERS[runner.name].allocates_nodes or RUNNERS[runner.name].submits_recipes:
        raise InputError(pipeline.file, "runner.kind", f"A and B are measured alongside by a runner that holds two "
                                                       f"servers at once on this host; {runner.name} allocates nodes")
    planned = {side: plan_stage(project, pipeline, stage, image, out / side, runner.name)
               for side, image in zip(SIDES, (image_a, image_b))}
    logs: list[PointLog] = []
    for pa, pb in zip(planned["a"], planned["b"]):
        if pa.job is None:
            raise InputError(pipeline.file, "stages.throughput.recipes",
                             f"{pa.key} is started by {pa.runner_kind}, not a server this session can hold")
        logs += _measure_recipe(runner, {"a": pa, "b": pb}, stage, policy, write_job_files, echo)
    from .stages.plan import conditions

    atomic_write_json(out / "measuring.json", [p.__dict__ for p in logs])
    return Session(points={side: _measured(planned[side], out / side) for side in SIDES},
                   conditions={p.key: conditions(p, stage) for p in planned["a"]}, decided=logs)


def _measure_recipe(runner, planned: dict, stage, policy: verdicts.Policy, write_job_files, echo) -> list[PointLog]:
    from .stages.results import parse_throughput_point, throughput_point
    from .stages.run import RESULTS

    key = planned["a"].key
    concurrencies = sorted({parse_throughput_point(p)[0] for p in planned["a"].points})
    specs, handles, queues = {}, {}, {}
    for side, p in planned.items():
        command = tuple(a for a in p.spec.command if a not in ("--points", "{points}")) + ("--orders", f"{RESULTS}/{ORDERS}")
        specs[side] = replace(p.spec, name=f"{p.spec.name}-{side}", command=command, points=())
    write_job_files([planned["a"], planned["b"]])
    try:
        for side in SIDES:
            handles[side] = runner.submit(specs[side])
            queues[side] = Orders(directory=specs[side].out_dir / ORDERS,
                                  still_running=lambda h=handles[side]: not runner.state(h).terminal)
        deadline = time.monotonic() + stage.time_limit
        while not all(q.serving() for q in queues.values()):
            if not all(q.still_running() for q in queues.values()) or time.monotonic() > deadline:
                raise ServestackError(f"{key}: a server did not come up for the interleaved session "
                                      f"(server.log in {specs['a'].out_dir} and {specs['b'].out_dir})")
            time.sleep(ANSWER_POLL_S * 4)
        dirs = {side: specs[side].out_dir for side in SIDES}
        open_points, seconds, logs = list(concurrencies), {c: 0.0 for c in concurrencies}, []
        gpus = planned["a"].gpus
        for k in range(policy.max_rounds):
            for side, c in schedule(open_points, k):
                point = throughput_point(c, k)
                queues[side].ask({"point": point}, stage.time_limit)
                seconds[c] += _client_seconds(dirs[side], point)
            for c in list(open_points):
                d = _gated_decision(key, c, dirs, k + 1, gpus, policy)
                if d.verdict != verdicts.UNDECIDED or k + 1 == policy.max_rounds:
                    open_points.remove(c)
                    logs.append(PointLog(recipe=key, concurrency=c, rounds=k + 1, seconds=round(seconds[c], 1),
                                         verdict=d.verdict, reason=d.reason))
                    if echo:
                        echo(f"{key} c={c}: {d.verdict} after {k + 1} rounds ({seconds[c]:.0f} s measuring): {d.reason}")
            if not open_points:
                break
        for side in SIDES:
            queues[side].ask({"stop": True}, 120)
            runner.wait(handles[side], timeout=180)
        return logs
    except BaseException:
        for h in handles.values():
            runner.cancel(h)
        raise
    finally:
        for h in handles.values():
            runner.collect(h)
