"""Recipe files judged by srt-slurm and the engine (judge.py, judged.py), per stack, when the stack's image is here.

Without the image the files keep the static rules, and a note says so and why; a file in srt-slurm's override
or sweep form, or of another engine, is left to the static rules too (notes say which).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from servestack.errors import InputError
from servestack.platforms import host_platform
from servestack.recipes import judge as J
from servestack.recipes.engine_cli import EngineSpec
from servestack.recipes.judged import check_file
from servestack.util.project import Project

StandIn = Callable[[str], dict[str, Any] | None]  # stack -> the stand-in model's config.json


def stack_image(project: Project, stack: str) -> tuple[str, str] | None:
    """(reference, digest) of the stack's image for this machine's platform, when docker has it: the committed
    expected digest first, then the last build's."""
    candidates: list[tuple[str, str]] = []
    pins = project.pins / f"{stack}.image.json"
    if pins.is_file():
        digest = (json.loads(pins.read_text()).get("platforms") or {}).get(host_platform(), {}).get("digest")
        if digest:
            candidates.append((f"127.0.0.1:5000/servestack/{stack}@{digest}", digest))
    built = project.artifacts(stack) / "image.json"
    if built.is_file():
        ref = json.loads(built.read_text()).get("reference", "")
        if "@" in ref:
            candidates.append((ref, ref.partition("@")[2]))
    return next((c for c in candidates if J.image_present(c[0])), None)


def built_model_config(project: Project, stack: str) -> dict[str, Any] | None:
    """The stack's smoke model's config.json as the last build made it, if any."""
    config = project.artifacts(stack) / "model" / "config.json"
    return json.loads(config.read_text()) if config.is_file() else None


def _plain_vllm(data: Any) -> bool:
    return (isinstance(data, dict) and "base" not in data and "sweep" not in data and "schema" not in data
            and isinstance(data.get("backend"), dict) and data["backend"].get("type") == "vllm")


def judge_files(project: Project, files: list[Path], stack_of: Callable[[Path, str], str],
                engine_of: Callable[[Path, str], EngineSpec | None], standin: StandIn | None,
                notes: list[str]) -> tuple[list[InputError], frozenset[Path]]:
    """The engine's errors for every file it could judge, and which files it judged."""
    by_stack: dict[str, list[tuple[Path, str, dict]]] = {}
    for f in files:
        try:
            text = f.read_text()
            data = yaml.safe_load(text)
        except (OSError, yaml.YAMLError):
            continue  # the static checks report it
        if _plain_vllm(data):
            by_stack.setdefault(stack_of(f, text), []).append((f, text, data))
        elif isinstance(data, dict) and "vllm" in text:  # another engine's recipe gets its own note (structure.py)
            notes.append(f"{f}: checked by the static rules only (srt-slurm's override, sweep or schema 2 form is "
                         "not judged by the engine)")
    errors: list[InputError] = []
    judged: set[Path] = set()
    # Each stack in its own container, the stacks at once: most of a cold judge is an image importing vLLM.
    with ThreadPoolExecutor(max_workers=max(1, len(by_stack))) as pool:
        done = list(pool.map(lambda item: _judge_stack(project, item[0], item[1], engine_of, standin), by_stack.items()))
    for stack_errors, stack_judged, stack_notes in done:
        errors += stack_errors
        judged |= stack_judged
        notes += stack_notes
    return errors, frozenset(judged)


def _judge_stack(project: Project, stack: str, items: list[tuple[Path, str, dict]],
                 engine_of: Callable[[Path, str], EngineSpec | None],
                 standin: StandIn | None) -> tuple[list[InputError], set[Path], list[str]]:
    started = time.monotonic()
    known = [item for item in items if J.device(_gpu_type(item[2])) is not None]
    notes: list[str] = [f"{f}: checked by the static rules only: gpu_type {_gpu_type(d)!r} has no device to simulate "
                        "(recipes/hardware.py)" for f, _, d in items if J.device(_gpu_type(d)) is None]
    if not known:
        return [], set(), notes
    errors, judged, more = _judge_known(project, stack, known, engine_of, standin, started)
    return errors, judged, notes + more


def _gpu_type(data: dict) -> str:
    return str((data.get("resources") or {}).get("gpu_type") or "")


def _judge_known(project: Project, stack: str, items: list[tuple[Path, str, dict]],
                 engine_of: Callable[[Path, str], EngineSpec | None], standin: StandIn | None,
                 started: float) -> tuple[list[InputError], set[Path], list[str]]:
    image = stack_image(project, stack)
    model = (standin or (lambda s: built_model_config(project, s)))(stack)
    static = f"{len(items)} {stack} recipe(s) checked by the static rules only"
    if image is None:
        why = (f"the {stack} image for {host_platform()} is neither built nor pulled here (`nox -s build image -- "
               f"--stack {stack}`, or `servestack pull`)") if J.docker_answers() else \
            "no Docker daemon answers here (`servestack services docker` starts one)"
        return [], set(), [f"{static}: {why}"]
    if model is None:
        return [], set(), [f"{static}: no stand-in model config for {stack} (its smoke model is made by "
                           f"`nox -s build -- --stack {stack}`)"]
    try:
        J.srtslurm_source()
    except FileNotFoundError as e:
        return [], set(), [f"{static}: {e}"]
    engine = J.Engine(image=image[0], digest=image[1], model_config=model)
    models = [d["model"] for _, _, d in items if isinstance(d.get("model"), dict)]
    launches = J.launches([f for f, _, _ in items],
                          sorted({str(m.get("path")) for m in models if not str(m.get("path", "")).startswith("hf:")}),
                          sorted({str(m.get("container")) for m in models if str(m.get("container", "")).startswith(("/", "./"))}))
    if isinstance(launches, str):
        return [], set(), [f"{static}: {launches}"]
    work: list[tuple[dict | None, J.Worker]] = []  # None: a GPU the hardware table does not know, not simulated
    for f, _, data in items:
        dev = J.device(_gpu_type(data))
        work += [(dev, w) for w in launches[f].roles.values()]
    judged_roles = J.judge(engine, work)
    if isinstance(judged_roles, str):
        return [], set(), [f"{static}: {judged_roles}"]
    answers = iter(judged_roles)
    errors: list[InputError] = []
    notes: list[str] = []
    installing: dict[str, int] = {}
    for f, text, _ in items:
        launch = launches[f]
        errors += check_file(f, text, launch, {mode: next(answers) for mode in launch.roles}, engine_of(f, text))
        if launch.installs_dynamo and not launch.error:
            installing[launch.dynamo_version] = installing.get(launch.dynamo_version, 0) + 1
    notes += [f"{n} {stack} recipe(s) ask srt-slurm to install Dynamo {version} over the image's (`dynamo.install: "
              "true`): their roles were judged with the image's Dynamo" for version, n in sorted(installing.items())]
    notes.append(f"{len(items)} {stack} recipe(s) judged by srt-slurm {J.SRT_SLURM.tag} and the engine in "
                 f"{image[0]} ({time.monotonic() - started:.1f} s)")
    return errors, {f for f, _, _ in items}, notes
