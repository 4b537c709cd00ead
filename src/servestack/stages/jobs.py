"""A stage as jobs: one per recipe (and per repeat, through srtctl), for the runner that starts it.

Planning writes nothing (`write_job_files` does, when the jobs are about to run). The in-container
layout: results at RESULTS, the model at MODEL or a directory in the image, GSM8K at kinds.DATA,
the bytecode cache at PYCACHE. What differs between the stage kinds is kinds.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servestack.clients import CLIENTS_DIR, CONTAINER_DIR
from servestack.errors import InputError
from servestack.recipes.read import RecipeView
from servestack.runners.interface import JobSpec, Mount
from servestack.runners.preflight import NodePreflight
from servestack.runners.selection import RUNNERS, starting
from servestack.stages.kinds import PointCommand, kind_of
from servestack.stages.pipeline import Pipeline, Stage
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import Project
from servestack.util.vllm_command import server_argv

RESULTS = "/results"
MODEL = "/model"
# The image ships sources without bytecode, so every fresh container compiles torch and vLLM again
# (three processes per server, one per client): about a minute per job on 2 cores. Jobs keep the
# bytecode outside the image, in a host directory per image digest (the image is not changed).
PYCACHE = "/var/cache/servestack-pycache"
# The image sets PYTHONDONTWRITEBYTECODE=1 (nothing may be written into it); with the prefix, the
# bytecode goes to the mounted directory instead, so writing it is allowed again (empty = unset).
PYCACHE_ENV = {"PYTHONPYCACHEPREFIX": PYCACHE, "PYTHONDONTWRITEBYTECODE": ""}


def pycache_dir(project: Project, stack: str, image_ref: str) -> Path:
    return project.artifacts(stack) / "pycache" / image_ref.rsplit("sha256:", 1)[-1][:16]


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
        return MODEL, [Mount(host=host, container=MODEL)]
    if not recipe.model_path:
        raise InputError(recipe.file, "model.path", "required (or set model_dir in the pipeline)")
    return recipe.model_path, []


# vLLM's default shutdown timeout, 0, is its "abort" mode: on SIGTERM the API server force-kills its
# engine core at once, and its output handler, still waiting for outputs, logs EngineDeadError at
# every normal stop. Any timeout is "drain" mode: the engine finishes what it holds (nothing, at the
# end of a job) and exits on its own; measured on dev-cpu: no error, stopped in 5 s. A recipe or the
# pipeline's extra_flags may set another.
SHUTDOWN_TIMEOUT_S = 10


def _server(pipeline: Pipeline, recipe: RecipeView, model: str) -> dict:
    python = pipeline.runner.python
    flags = {**recipe.server_flags, **pipeline.server.extra_flags}
    for reserved in ("model", "served-model-name", "port", "host"):
        flags.pop(reserved, None)
    argv = server_argv(python, {"model": model, "served-model-name": recipe.served_model_name, "host": "127.0.0.1",
                                "port": pipeline.server.port, "shutdown-timeout": SHUTDOWN_TIMEOUT_S, **flags})
    return {"argv": argv, "env": recipe.server_env,
            "health_url": f"http://127.0.0.1:{pipeline.server.port}/health",
            "startup_timeout": pipeline.server.startup_timeout}


@dataclass(kw_only=True)
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
    from servestack.lock import load_lock

    if not project.lock_file(pipeline.stack).exists():
        return None  # nothing without a lock runs; the stage names the missing lock where it needs one
    min_driver = (load_lock(project, pipeline.stack).gpu_node or {}).get("min_driver")
    if not min_driver:
        return None
    res = recipe.raw.get("resources") or {}
    nodes = int(res.get("prefill_nodes") or 0) + int(res.get("decode_nodes") or 0) or int(res.get("agg_nodes") or 1)
    return NodePreflight(min_driver=int(min_driver), gpus_per_node=int(res.get("gpus_per_node") or 0), nodes=nodes, skipped=skip)


def plan_stage(project: Project, pipeline: Pipeline, stage: Stage, image_ref: str,
               stage_dir: Path, runner_kind: str | None = None, *, skip_preflight: bool = False) -> list[_Planned]:
    """One job per recipe for `runner_kind` (default: the pipeline's runner), or for the pipeline's
    runner.disaggregated where that runner cannot start the recipe's shape, as data: nothing is
    written (`write_job_files` does, when the jobs are about to run)."""
    default_kind = runner_kind or pipeline.runner.kind
    stage_kind = kind_of(stage)
    planned = []
    base_url = f"http://127.0.0.1:{pipeline.server.port}"
    python = pipeline.runner.python
    for name in stage.recipes:
        recipe = _recipe(project, pipeline, name)
        kind = _runner_kind(pipeline, default_kind, recipe)
        out_dir = stage_dir / name
        preflight = _preflight(project, pipeline, recipe, skip_preflight) if RUNNERS[kind].allocates_nodes else None
        gpus = stage.gpus or recipe.gpus
        points = stage_kind.points(pipeline, stage, recipe)
        if RUNNERS[kind].submits_recipes:
            extra: dict[str, object] = {"points_field": stage_kind.points_field}
            if pipeline.model_dir is not None or recipe.model_path in pipeline.model_paths:
                # srtctl mounts a host model directory at /model: the pipeline's, else the model
                # the stack's build wrote.
                host = pipeline.model_dir or project.artifacts(pipeline.stack) / "model"
                if not host.is_dir():
                    raise InputError(pipeline.file, "model_dir", f"{host} is not a directory "
                                     f"(`nox -s build -- --stack {pipeline.stack}` writes the stack's model)")
                extra["model_dir"] = str(host)
            extra.update(stage_kind.srtctl_inputs(project, pipeline))
            for k, mine in enumerate(stage_kind.srtctl_jobs(stage, points)):
                spec = JobSpec(
                    name=f"{stage.name}-{name}" + (f"-r{k}" if k else ""), points=mine, out_dir=out_dir, command=(),
                    image=image_ref, time_limit_s=stage.time_limit,
                    gpus=recipe.accelerators if stage.gpus is None else gpus, recipe_file=recipe.file, recipe_name=name,
                    extra=extra, preflight=preflight,
                )
                planned.append(_Planned(key=name, recipe=recipe, spec=spec, points=mine, gpus=gpus, runner_kind=kind))
            continue
        model, mounts = _model_mount(pipeline, recipe)
        pycache = pycache_dir(project, pipeline.stack, image_ref)
        point, inputs = stage_kind.command(PointCommand(project=project, pipeline=pipeline, stage=stage, recipe=recipe,
                                                        key=name, model=model, gpus=gpus, base_url=base_url))
        mounts = [*mounts, Mount(host=CLIENTS_DIR, container=CONTAINER_DIR), Mount(host=out_dir, container=RESULTS, read_only=False),
                  Mount(host=pycache, container=PYCACHE, read_only=False), *inputs]
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
        planned.append(_Planned(key=name, recipe=recipe, spec=spec, points=points, gpus=gpus, runner_kind=kind, job=job))
    return planned


def write_job_files(planned: list[_Planned]) -> None:
    """The in-container job specs, next to each job's results (where its command reads them)."""
    for p in planned:
        if p.job is not None:
            atomic_write_json(p.job_file, p.job)


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
