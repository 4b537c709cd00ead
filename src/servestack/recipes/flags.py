"""Engine flags and environment in a recipe: every vLLM flag is one of the command srt-slurm starts (its
parser as pins/<stack>.engine.json describes it) with a value it takes; every VLLM_* variable exists."""

from __future__ import annotations

from typing import Any

from servestack.recipes.engine_cli import DYNAMO_VLLM, VLLM_SERVE, EngineSpec, ParserSpec
from servestack.recipes.structure import Checker, suggest
from servestack.util.yamlfile import Node


def worker_command(frontend_type: Any) -> str:
    """Which command srt-slurm starts a vLLM worker with: vLLM's own server behind a vLLM frontend,
    Dynamo's worker (`python -m dynamo.vllm`) otherwise (srt-slurm's default frontend is Dynamo)."""
    return VLLM_SERVE if frontend_type == "vllm" else DYNAMO_VLLM


def frontend_type(root: Node) -> Any:
    fe = root.get("frontend")
    t = fe.get("type") if fe is not None and fe.is_map else None
    return t.value if t is not None else "dynamo"


def check_flags(c: Checker, args: Node | None, where: tuple[str, ...], parser_name: str) -> None:
    """Every key of an engine argument mapping is a flag of the command srt-slurm starts, with a value it takes."""
    if c.engine is None or args is None or not args.is_map:
        return
    parser = c.engine.parser(parser_name)
    if parser is None:
        c.err(args, where, f"{c.engine.source or 'the engine description'} does not describe {parser_name!r}, "
              f"the command srt-slurm starts here: regenerate it with servestack.recipes.engine_cli "
              f"where that command is installed", at_key=True)
        return
    for key, child in args.value.items():
        spec = parser.lookup(key)
        if spec is None:
            c.err(child, where + (key,),
                  f"--{key} is not a flag of {parser.command} ({_versions(c.engine, parser)})"
                  + suggest(key, parser.flag_names()).replace("'", "").replace("mean ", "mean --"),
                  at_key=True)
            continue
        if c.placeholder(child):
            continue
        problem = spec.problem(child.value, flag=True)
        if problem:
            c.err(child, where + (key,), f"{problem}; allowed: {spec.allowed()}")


def _versions(engine: EngineSpec, parser: ParserSpec) -> str:
    own = f"{parser.name} {parser.version}, " if parser.version else ""
    return f"{own}{engine.engine} {engine.version}"


def check_env(c: Checker, envs: Node | None, where: tuple[str, ...]) -> None:
    """VLLM_* names must exist; any variable the engine reads must have a value it accepts."""
    if c.engine is None or envs is None or not envs.is_map:
        return
    for name, child in envs.value.items():
        spec = c.engine.environment.get(name)
        if spec is None:
            if name.startswith("VLLM_"):
                c.err(child, where + (name,),
                      f"{name} is not an environment variable of {c.engine.engine} {c.engine.version}"
                      + suggest(name, c.engine.environment), at_key=True)
            continue
        if c.placeholder(child):
            continue
        problem = spec.problem(child.value, flag=False)
        if problem:
            c.err(child, where + (name,), f"{problem}; allowed: {spec.allowed()}")
