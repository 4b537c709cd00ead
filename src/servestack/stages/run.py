"""Run the accuracy and throughput stages of a pipeline against an image, gate and report.

Layout: `build/<stack>/runs/<run id>/<stage>/` with one directory per recipe holding the point
files (`<concurrency>.json`: vLLM's result JSON; `repeat-<i>.json`: the gsm8k client's), plus
`results.json` (normalized results and the verdict), `report.md` and plots. The run id is derived
from the image digest and the pipeline file, so rerunning the same thing resumes it: points with
a file on disk are not redone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..clients import CLIENTS_DIR, CONTAINER_DIR
from ..datasets import gsm8k_dir
from ..engine import server_argv
from ..errors import InputError, ServestackError
from ..fsutil import atomic_write_json
from ..imageref import ImageRef
from ..progress import phase
from ..project import Project
from ..recipes.read import RecipeView
from ..runners.base import JobSpec, Mount, Runner
from ..runners.driver import run_job
from ..runners.preflight import NodePreflight
from ..runners.registry import RUNNERS, make_runner, starting
from .gates import (
    Verdict,
    evaluate_accuracy,
    evaluate_agreement,
    evaluate_throughput,
    format_verdict,
    placement_failures,
)
from .pipeline import STAGES, Pipeline, Stage, load_pipeline
from .results import (
    StageResult,
    compare_answers,
    load_answers,
    parse_gsm8k_result,
    parse_throughput_point,
    parse_vllm_result,
    throughput_point,
)

log = logging.getLogger("servestack.stages")

RESULTS = "/results"
MODEL = "/model"
DATA = "/data/gsm8k"
# The image ships sources without bytecode, so every fresh container compiles torch and vLLM again
# (three processes per server, one per client): about a minute per job on 2 cores. Jobs keep the
# bytecode outside the image, in a host directory per image digest (the image is not changed).
PYCACHE = "/var/cache/servestack-pycache"
# The image sets PYTHONDONTWRITEBYTECODE=1 (nothing may be written into it); with the prefix, the
# bytecode goes to the mounted directory instead, so writing it is allowed again (empty = unset).
PYCACHE_ENV = {"PYTHONPYCACHEPREFIX": PYCACHE, "PYTHONDONTWRITEBYTECODE": ""}


def pycache_dir(project: Project, stack: str, image_ref: str) -> Path:
    return project.artifacts(stack) / "pycache" / image_ref.rsplit("sha256:", 1)[-1][:16]


class StageFailed(ServestackError):
    """The stage ran but its gates failed; `.result` holds the numbers and the verdict."""

    def __init__(self, result: StageResult):
        self.result = result
        super().__init__(format_verdict(result.verdict))


def run_id_for(pipeline: Pipeline, image_ref: str) -> str:
    h = hashlib.sha256()
    h.update(image_ref.encode())
    h.update(Path(pipeline.file).read_bytes())
    return h.hexdigest()[:12]


def _recipe(project: Project, pipeline: Pipeline, name: str) -> RecipeView:
    return RecipeView.load(project.recipes / pipeline.stack / f"{name}.yaml")


def _model_mount(pipeline: Pipeline, recipe: RecipeView) -> tuple[str, list[Mount]]:
    if pipeline.model_dir is None and recipe.model_path in pipeline.model_paths:
        return pipeline.model_paths[recipe.model_path], []  # a directory inside the image
    host = pipeline.model_dir
    if host is None and recipe.model_path and Path(recipe.model_path).is_dir():
        host = Path(recipe.model_path).resolve()
    if host is not None:
        if not host.is_dir():
            raise InputError(pipeline.file, "model_dir", f"{host} is not a directory")
        return MODEL, [Mount(host, MODEL)]
    if not recipe.model_path:
        raise InputError(recipe.file, "model.path", "required (or set model_dir in the pipeline)")
    return recipe.model_path, []


def _server(pipeline: Pipeline, recipe: RecipeView, model: str) -> dict:
    python = pipeline.runner.python
    flags = {**recipe.server_flags, **pipeline.server.extra_flags}
    for reserved in ("model", "served-model-name", "port", "host"):
        flags.pop(reserved, None)
    argv = server_argv(python, {"model": model, "served-model-name": recipe.served_model_name, "host": "127.0.0.1",
                                "port": pipeline.server.port, **flags})
    return {"argv": argv, "env": recipe.server_env,
            "health_url": f"http://127.0.0.1:{pipeline.server.port}/health",
            "startup_timeout": pipeline.server.startup_timeout}


@dataclass
class _Planned:
    key: str  # the recipe as the pipeline names it (recipes/<stack>/<key>.yaml): results, gates, baselines
    recipe: RecipeView
    spec: JobSpec
    points: tuple[str, ...]
    gpus: int
    runner_kind: str  # the runner that starts this recipe's shape (_runner_kind)
    # What run_points reads in the container ({"server", "point", "out_dir"}): `write_job_files`
    # puts it at job_file before the job runs. None for a job that is the recipe itself.
    job: dict | None = None

    @property
    def job_file(self) -> Path:
        return self.spec.out_dir / ".jobs" / "job.json"  # RESULTS/.jobs/job.json in the container


def _runner_kind(pipeline: Pipeline, kind: str, recipe: RecipeView) -> str:
    """`kind` when it can start the recipe's shape, else the pipeline's runner for that shape."""
    if recipe.shape in RUNNERS[kind].shapes:
        return kind
    other = pipeline.runner.disaggregated if recipe.shape == "disaggregated" else None
    if other and recipe.shape in RUNNERS[other].shapes:
        return other
    raise InputError(pipeline.file, "runner.disaggregated",
                     f"{recipe.file} is {recipe.shape}; the {kind} runner cannot start it (set runner.disaggregated "
                     f"to one of {', '.join(starting(recipe.shape))})")


def _preflight(project: Project, pipeline: Pipeline, recipe: RecipeView, skip: bool) -> NodePreflight | None:
    """The node preflight a GPU stack's recipe gets on Slurm (its driver minimum is the stack's gpu_node.min_driver)."""
    from ..lock import load_lock

    if not project.lock_file(pipeline.stack).exists():
        return None  # nothing without a lock runs; the stage names the missing lock where it needs one
    min_driver = (load_lock(project, pipeline.stack).gpu_node or {}).get("min_driver")
    if not min_driver:
        return None
    res = recipe.raw.get("resources") or {}
    nodes = int(res.get("prefill_nodes") or 0) + int(res.get("decode_nodes") or 0) or int(res.get("agg_nodes") or 1)
    return NodePreflight(int(min_driver), int(res.get("gpus_per_node") or 0), nodes, skipped=skip)


def plan_stage(project: Project, pipeline: Pipeline, stage: Stage, image_ref: str,
               stage_dir: Path, runner_kind: str | None = None, *, skip_preflight: bool = False) -> list[_Planned]:
    """One job per recipe for `runner_kind` (default: the pipeline's runner), or for the pipeline's
    runner.disaggregated where that runner cannot start the recipe's shape, as data: nothing is
    written (`write_job_files` does, when the jobs are about to run)."""
    default_kind = runner_kind or pipeline.runner.kind
    planned = []
    base_url = f"http://127.0.0.1:{pipeline.server.port}"
    python = pipeline.runner.python
    for name in stage.recipes:
        recipe = _recipe(project, pipeline, name)
        kind = _runner_kind(pipeline, default_kind, recipe)
        out_dir = stage_dir / name
        preflight = _preflight(project, pipeline, recipe, skip_preflight) if RUNNERS[kind].allocates_nodes else None
        gpus = stage.gpus or recipe.gpus
        if stage.name == "throughput":
            concs = list(stage.concurrencies or recipe.concurrencies)
            if not concs:
                raise InputError(recipe.file, "benchmark.concurrencies",
                                 f"no concurrency points (set them here or in {pipeline.file} stages.throughput)")
            # Round by round (1, 4, 1-r1, 4-r1, ...): a server slower for a minute (its first
            # requests, a noisy neighbour) then costs every concurrency a little instead of
            # every repeat of one point, which a baseline gate would read as its regression.
            points = tuple(throughput_point(c, k) for k in range(stage.repeats) for c in concs)
        else:
            points = stage.points
        if RUNNERS[kind].submits_recipes:
            extra: dict[str, object] = {"points_field": "benchmark.concurrencies" if stage.name == "throughput" else None}
            if pipeline.model_dir is not None or recipe.model_path in pipeline.model_paths:
                # srtctl mounts a host model directory at /model: the pipeline's, else the model
                # the stack's build wrote.
                host = pipeline.model_dir or project.artifacts(pipeline.stack) / "model"
                if not host.is_dir():
                    raise InputError(pipeline.file, "model_dir", f"{host} is not a directory "
                                     f"(`nox -s build -- --stack {pipeline.stack}` writes the stack's model)")
                extra["model_dir"] = str(host)
            if stage.name == "accuracy" and stage.gate.agreement_with is None:
                extra["gsm8k_dir"] = str(gsm8k_dir(project.root, pipeline.data_dir, pipeline.file))
            elif stage.name == "accuracy":
                extra["clients_dir"] = str(CLIENTS_DIR)  # the recipe's custom benchmark runs agreement.py
            # The recipe's job sweeps each concurrency once: one job per repeat (a fresh deployment each,
            # so the repeats also show how much one deployment differs from the next).
            repeats = stage.repeats if stage.name == "throughput" else 1
            for k in range(repeats):
                mine = tuple(p for p in points if repeats == 1 or parse_throughput_point(p)[1] == k)
                spec = JobSpec(
                    name=f"{stage.name}-{name}" + (f"-r{k}" if k else ""), points=mine, out_dir=out_dir, command=(),
                    image=image_ref, time_limit_s=stage.time_limit,
                    gpus=recipe.accelerators if stage.gpus is None else gpus, recipe_file=recipe.file, recipe_name=name,
                    extra=extra, preflight=preflight,
                )
                planned.append(_Planned(name, recipe, spec, mine, gpus, kind))
            continue
        model, mounts = _model_mount(pipeline, recipe)
        pycache = pycache_dir(project, pipeline.stack, image_ref)
        mounts = [*mounts, Mount(CLIENTS_DIR, CONTAINER_DIR), Mount(out_dir, RESULTS, read_only=False),
                  Mount(pycache, PYCACHE, read_only=False)]
        if stage.name == "throughput":
            isl = stage.input_len or int(recipe.benchmark.get("isl") or 128)
            osl = stage.output_len or int(recipe.benchmark.get("osl") or 32)
            mult = stage.prompts_per_concurrency or int(recipe.benchmark.get("num_prompts_mult") or 10)
            point = {
                "argv": [python, f"{CONTAINER_DIR}/vllm_bench_serve.py",
                         "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
                         "--model", model, "--served-model-name", recipe.served_model_name,
                         "--tokenizer", model, "--dataset-name", "random",
                         "--random-input-len", str(isl), "--random-output-len", str(osl),
                         "--num-prompts", "{num_prompts}", "--max-concurrency", "{concurrency}",
                         "--request-rate", "inf", "--ignore-eos", "--seed", "0", "--temperature", "0",
                         "--ready-check-timeout-sec", "60",
                         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                         "--disable-tqdm", "--save-result", "--result-dir", "{out_dir}",
                         "--result-filename", "{out_name}",
                         "--metadata", f"servestack_recipe={name}", f"servestack_gpus={gpus}"],
                "prompts_per_point": mult, "min_prompts": stage.min_prompts,
                "timeout": stage.time_limit,
            }
        elif stage.gate.agreement_with is not None:
            point = {
                "argv": [python, f"{CONTAINER_DIR}/agreement.py", "collect", "--base-url", base_url,
                         "--model", recipe.served_model_name, "--vocab-size", str(_oracle_vocab(project, pipeline)),
                         "--out", "{out}"],
                "timeout": stage.time_limit,
            }
        else:
            data = gsm8k_dir(project.root, pipeline.data_dir, pipeline.file)
            mounts.append(Mount(data, DATA))
            g = stage.gsm8k
            point = {
                "argv": [python, f"{CONTAINER_DIR}/gsm8k.py", "--base-url", base_url,
                         "--model", recipe.served_model_name, "--dataset", f"{DATA}/test.jsonl",
                         "--fewshot-from", f"{DATA}/train.jsonl", "--num-questions", str(g.num_questions),
                         "--shots", str(g.shots), "--repeats", "1", "--first-repeat", "{index}",
                         "--concurrency", str(g.concurrency), "--max-tokens", str(g.max_tokens),
                         "--out", "{out}"],
                "timeout": stage.time_limit,
            }
        job = {"server": _server(pipeline, recipe, model), "point": point, "out_dir": RESULTS}
        spec = JobSpec(
            name=f"{stage.name}-{name}", points=points, out_dir=out_dir,
            command=(python, f"{CONTAINER_DIR}/run_points.py", "--spec", f"{RESULTS}/.jobs/job.json",
                     "--points", "{points}"),
            image=image_ref, mounts=tuple(mounts), env=dict(PYCACHE_ENV),
            time_limit_s=stage.time_limit,
            gpus=recipe.accelerators if stage.gpus is None else gpus,
            recipe_file=recipe.file, recipe_name=name, preflight=preflight,
        )
        planned.append(_Planned(name, recipe, spec, points, gpus, kind, job))
    return planned


def _oracle_vocab(project: Project, pipeline: Pipeline) -> int:
    from ..lock import load_lock
    from ..smoke.plan import oracle_vocab

    vocab = oracle_vocab(load_lock(project, pipeline.stack))
    if vocab is None:
        raise InputError(pipeline.file, "stages.accuracy.gate.agreement_with",
                         f"the oracle needs a smoke model the project makes; {pipeline.stack}'s is a checkpoint (use threshold)")
    return vocab


def write_job_files(planned: list[_Planned]) -> None:
    """The in-container job specs, next to each job's results (where its command reads them)."""
    for p in planned:
        if p.job is not None:
            atomic_write_json(p.job_file, p.job)


def _read_timing(planned: list[_Planned], since: float) -> tuple[float | None, float, dict[str, float]]:
    """Client and server start-up seconds that run_points recorded since `since` (this invocation)."""
    client: float | None = None
    server = 0.0
    per_point: dict[str, float] = {}
    for p in planned:
        f = p.spec.out_dir / ".timing.jsonl"
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line)
                if float(ev.get("started") or 0) < since:
                    continue
                secs = float(ev["seconds"])
            except (ValueError, KeyError, TypeError):
                continue
            if ev.get("event") == "point":
                client = (client or 0.0) + secs
                per_point[f"{p.key}/{ev.get('point')}"] = per_point.get(f"{p.key}/{ev.get('point')}", 0.0) + secs
            elif ev.get("event") == "server":
                server += secs
    return client, server, per_point


# The client's own wall time, as each kind of result file names it: servestack's clients
# (client_seconds), vLLM's serving benchmark as srt-slurm's sa-bench runs it (duration) and
# srt-slurm's gsm8k_eval.py (latency).
CLIENT_SECONDS_KEYS = ("client_seconds", "duration", "latency")


def _reported_client_seconds(f: Path) -> float | None:
    """The wall time of the client that wrote a result file, when the file records it."""
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    for key in CLIENT_SECONDS_KEYS:
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def conditions(p: _Planned, stage: Stage) -> dict[str, object]:
    """What makes two throughput runs of a recipe the same experiment (compare.py holds them equal):
    the workload and the hardware it ran on. Not the serving flags: changing those, like changing
    the image, is what a comparison is for."""
    bench = p.recipe.benchmark
    resources = p.recipe.raw.get("resources") or {}
    placement = json.dumps({"resources": resources, "benchmark": {k: v for k, v in bench.items() if k != "concurrencies"}},
                           sort_keys=True, default=str)
    return {"isl": stage.input_len or int(bench.get("isl") or 128),
            "osl": stage.output_len or int(bench.get("osl") or 32),
            "prompts_per_concurrency": stage.prompts_per_concurrency or int(bench.get("num_prompts_mult") or 10),
            "gpus": p.gpus, "gpu_type": resources.get("gpu_type"), "runner": p.runner_kind,
            "resources_and_benchmark_sha256": hashlib.sha256(placement.encode()).hexdigest()}


def hold_to_baseline(project: Project, pipeline: Pipeline, stage: Stage, result: StageResult) -> None:
    """The stage's results against gate.baseline's (compare.py), written to <stage>/baseline/; a
    regression, or a change the repeats cannot judge, is a failure of the stage's verdict."""
    from .. import compare
    from .gates import Check, Failure

    gate = stage.gate
    out = result.out_dir / "baseline"
    if out.exists():
        import shutil

        shutil.rmtree(out)  # judged afresh each time: the baseline's publication is pulled again
    key = None if gate.baseline_key is None else (project.root / gate.baseline_key)
    try:
        base, invalid = compare.load_side(gate.baseline, runs=project.artifacts(pipeline.stack) / "runs",
                                          pulled=out / "pulled", key=key, label=f"baseline {gate.baseline}")
    except InputError as exc:
        raise InputError(pipeline.file, "stages.throughput.gate.baseline", str(exc)) from exc
    here, _ = compare.side_from_results({"stages": [result.to_dict()]}, "this run", result.out_dir)
    policy = compare.RegressionPolicy(gate.regression_threshold, gate.regression_alpha)
    comparison = compare.compare(base, here, policy, invalid=invalid)
    compare.write(comparison, out)
    failing = {(ch.recipe, ch.concurrency, ch.metric): msg for ch, msg in compare.gate_failures(comparison)}
    for ch in comparison.gated():
        where = f"c={ch.concurrency}"
        msg = failing.get((ch.recipe, ch.concurrency, ch.metric))
        result.verdict.checks.append(Check("regression", ch.recipe, where, ch.change, -policy.threshold, msg is None))
        if msg is not None:
            result.verdict.failures.append(Failure("regression", ch.recipe, where, msg, ch.change, -policy.threshold))
    if not comparison.gated():
        result.verdict.failures.append(Failure("regression", "-", None, f"nothing to hold to {gate.baseline}: "
                                               + ("; ".join(comparison.not_compared) or "no point in common")))


def collect_stage(pipeline: Pipeline, stage: Stage, planned: list[_Planned], image_ref: str,
                  runner_name: str, stage_dir: Path, jobs: list[dict], since: float = 0.0) -> StageResult:
    result = StageResult(stack=pipeline.stack, pipeline=pipeline.name, stage=stage.name, image=image_ref,
                         runner=runner_name, out_dir=stage_dir, jobs=jobs)
    bench = 0.0
    measured_now: list[str] = []
    reported_client: dict[str, float] = {}
    problems: list[str] = []
    answers: dict[str, dict] = {}  # the oracle's, by recipe
    for p in planned:
        for point in p.points:
            f = p.spec.point_file(point)
            if not f.exists():
                result.missing.append(f"{p.recipe.name}/{point}")
                continue
            fresh = f.stat().st_mtime >= since
            try:
                if stage.name == "throughput":
                    conc, repeat = parse_throughput_point(point)
                    tp = replace(parse_vllm_result(f, recipe=p.key, gpus=p.gpus, concurrency=conc), repeat=repeat)
                    result.throughput.append(tp)
                    secs = tp.duration_s
                elif stage.gate.agreement_with is not None:
                    answers[p.key] = load_answers(f)
                    secs = float(answers[p.key].get("seconds") or 0.0)
                else:
                    runs = parse_gsm8k_result(f, recipe=p.key)
                    idx = int(point.rsplit("-", 1)[-1])
                    runs = [r if len(runs) > 1 else replace(r, repeat=idx) for r in runs]
                    result.accuracy += runs
                    secs = sum(float(r.seconds or 0.0) for r in runs)
                if fresh:
                    bench += secs
                    measured_now.append(f"{p.key}/{point}")
                    reported = _reported_client_seconds(f)
                    if reported is not None:  # e.g. from the srtctl runner's result files
                        reported_client[f"{p.key}/{point}"] = reported
            except InputError as exc:
                problems.append(str(exc))
                result.missing.append(f"{p.key}/{point}")
    client, server, per_point = _read_timing(planned, since)
    if client is None and reported_client and len(reported_client) == len(measured_now):
        client, per_point = sum(reported_client.values()), reported_client
    result.timing = {
        "started": round(since, 3),
        "measured_points": measured_now,  # points this invocation ran (the rest were on disk)
        "client_seconds": None if client is None else round(client, 3),  # client processes, per run_points
        "client_seconds_per_point": {k: round(v, 3) for k, v in per_point.items()},
        "server_startup_seconds": round(server, 3),
        "benchmark_seconds": round(bench, 3),  # the benchmarks' own durations (vLLM duration, gsm8k seconds)
    }
    if stage.name == "throughput":
        result.conditions = {p.key: conditions(p, stage) for p in planned}
        expected = {p.key: sorted({parse_throughput_point(x)[0] for x in p.points}) for p in planned}
        verdict = evaluate_throughput(result.throughput, expected, stage.gate.config(), repeats=stage.repeats)
    elif stage.gate.agreement_with is not None:
        result.agreement, result.accuracy = compare_answers(answers, stage.gate.agreement_with)
        verdict = evaluate_agreement(result.agreement, stage.gate.agreement_with, [p.key for p in planned], set(answers))
    else:
        verdict = evaluate_accuracy(result.accuracy, {p.key: len(p.points) for p in planned}, stage.gate.config())
    for msg in problems:
        from .gates import Failure

        verdict.failures.append(Failure("unreadable", "-", None, msg))
    verdict.failures += placement_failures(result.jobs)
    result.verdict = verdict
    return result


def _selected(pipeline: Pipeline, recipes: tuple[str, ...] | None) -> dict[str, Stage]:
    """The pipeline's stages narrowed to `recipes` (None: all); a stage left with none is dropped."""
    defined = pipeline.stages.defined()
    if recipes is None:
        return defined
    known = {r for s in defined.values() for r in s.recipes}
    unknown = [r for r in recipes if r not in known]
    if unknown:
        raise InputError(pipeline.file, "stages", f"runs no recipe named {', '.join(unknown)} "
                                                  f"(its recipes: {', '.join(sorted(known))})")
    out = {}
    for name, settings in defined.items():
        kept = tuple(r for r in settings.recipes if r in recipes)
        reference = getattr(settings.gate, "agreement_with", None)
        if reference is not None and kept:
            if kept == (reference,):
                raise InputError(pipeline.file, f"stages.{name}.gate.agreement_with",
                                 f"{reference} is the reference the other recipes are held to; alone it is judged by "
                                 f"nothing (select one of {', '.join(r for r in settings.recipes if r != reference)} too)")
            # A recipe is judged against the reference's answers: the reference runs with it.
            kept = tuple(r for r in settings.recipes if r in kept or r == reference)
        if kept:
            out[name] = settings.model_copy(update={"recipes": kept})
    return out


def run_stage(project: Project, pipeline_name: str, stage: str, image_ref: str,
              runner: Runner | None = None, *, run_id: str | None = None,
              recipes: tuple[str, ...] | None = None, skip_preflight: bool = False,
              min_repeats: int = 1) -> StageResult:
    """Run one stage (accuracy | throughput) of pipelines/<pipeline_name>.yaml against image_ref.

    `min_repeats` raises the throughput stage's repeats to at least that many (bump: enough for a
    regression verdict).

    `runner` (default: the pipeline's) runs the recipes it can start; disaggregated ones it cannot
    go to the pipeline's runner.disaggregated. `recipes` narrows the stage to those names.

    Writes results.json, report.md and plots under build/<stack>/runs/<run id>/<stage>/ and
    returns the StageResult; `result.passed` tells whether the gates held (callers exit non-zero
    when it is False; `raise_for_verdict` does that as an exception).
    """
    from .. import report

    if stage not in STAGES:
        raise InputError(pipeline_name, "stage", f"{stage!r} is not one of {', '.join(STAGES)}")
    ImageRef.parse(image_ref)
    pipeline = load_pipeline(project.pipelines / f"{pipeline_name}.yaml", project.root)
    if stage not in pipeline.stages.defined():
        raise InputError(pipeline.file, f"stages.{stage}", "this pipeline does not define the stage")
    settings = _selected(pipeline, recipes).get(stage)
    if settings is None:
        raise InputError(pipeline.file, f"stages.{stage}.recipes", f"runs none of {', '.join(recipes or ())}")
    if stage == "throughput" and settings.repeats < min_repeats:
        settings = settings.model_copy(update={"repeats": min_repeats})
    rid = run_id or run_id_for(pipeline, image_ref)
    stage_dir = project.artifacts(pipeline.stack) / "runs" / rid / stage
    stage_dir.mkdir(parents=True, exist_ok=True)
    started, t0 = time.time(), time.monotonic()
    runner = runner or make_runner(pipeline)
    # Plan for the runner that runs the jobs (the CLI's --runner may differ from the pipeline's).
    kind = runner.name if runner.name in RUNNERS else pipeline.runner.kind
    planned = plan_stage(project, pipeline, settings, image_ref, stage_dir, kind, skip_preflight=skip_preflight)
    write_job_files(planned)
    policy = pipeline.retry.policy()
    runners = {kind: runner}
    jobs = []
    for p in planned:
        if p.runner_kind not in runners:
            runners[p.runner_kind] = make_runner(pipeline, p.runner_kind)
        job_runner = runners[p.runner_kind]
        outcome = run_job(job_runner, p.spec, policy, timeout_s=settings.time_limit + 600)
        jobs.append({**outcome.to_dict(), "runner": job_runner.name})
    used = "+".join(dict.fromkeys(j["runner"] for j in jobs)) or runner.name
    result = collect_stage(pipeline, settings, planned, image_ref, used, stage_dir, jobs, since=started)
    if settings.name == "throughput" and settings.gate.baseline:
        hold_to_baseline(project, pipeline, settings, result)
    _finish_timing(result.timing, time.monotonic() - t0)
    report.write_stage(result)
    log.info("%s", format_verdict(result.verdict))
    return result


def run_pipeline(project: Project, pipeline_name: str, image_ref: str, runner: Runner | None = None,
                 stages: tuple[str, ...] | None = None, *, run_id: str | None = None,
                 recipes: tuple[str, ...] | None = None, skip_preflight: bool = False,
                 min_repeats: int = 1) -> list[StageResult]:
    """Every stage the pipeline defines (accuracy, then throughput), then the run-level report;
    `recipes` narrows the run to those recipes (stages that run none of them are skipped)."""
    from .. import report

    t0 = time.monotonic()
    pipeline = load_pipeline(project.pipelines / f"{pipeline_name}.yaml", project.root)
    wanted = [s for s in _selected(pipeline, recipes) if stages is None or s in stages]
    results = []
    for stage in wanted:
        with phase(f"pipeline {pipeline_name}", f"stage {stage} ({wanted.index(stage) + 1} of {len(wanted)})"):
            results.append(run_stage(project, pipeline_name, stage, image_ref, runner, run_id=run_id,
                                     recipes=recipes, skip_preflight=skip_preflight, min_repeats=min_repeats))
    if results:
        timing = {"runner": results[0].runner, **_sum_timing([r.timing for r in results])}
        _finish_timing(timing, time.monotonic() - t0)
        report.write_run(results[0].out_dir.parent, results, timing)
    return results


def _sum_timing(parts: list[dict]) -> dict:
    out: dict = {"client_seconds": None, "server_startup_seconds": 0.0, "benchmark_seconds": 0.0}
    for t in parts:
        if t.get("client_seconds") is not None:
            out["client_seconds"] = round((out["client_seconds"] or 0.0) + t["client_seconds"], 3)
        out["server_startup_seconds"] = round(out["server_startup_seconds"] + t.get("server_startup_seconds", 0.0), 3)
        out["benchmark_seconds"] = round(out["benchmark_seconds"] + t.get("benchmark_seconds", 0.0), 3)
    return out


def _finish_timing(timing: dict, wall: float) -> None:
    """Wall time, and the overhead: wall time not spent inside the benchmark clients."""
    timing["wall_seconds"] = round(wall, 3)
    inside = timing.get("client_seconds")
    timing["overhead_basis"] = "client_seconds" if inside is not None else "benchmark_seconds"
    if inside is None:
        inside = timing.get("benchmark_seconds", 0.0)
    timing["overhead_seconds"] = round(wall - inside, 3)
    timing["overhead_fraction"] = round((wall - inside) / wall, 4) if wall > 0 else None


def raise_for_verdict(result: StageResult) -> StageResult:
    if not result.passed:
        raise StageFailed(result)
    return result


__all__ = ["StageFailed", "Verdict", "plan_stage", "raise_for_verdict", "run_id_for", "run_pipeline",
           "run_stage", "write_job_files"]
