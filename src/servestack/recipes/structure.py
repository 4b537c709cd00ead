"""A recipe's structure against srt-slurm's schema (recipes/schema.py): known keys, value types, required
keys, backends and roles, and the benchmark concurrencies (the one reading of that field).

`Checker` collects one recipe's problems with their positions; the arithmetic (topology.py) and the
engine checks (flags.py) report through it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any, TypeGuard

from servestack.errors import InputError, Location
from servestack.recipes import schema as S
from servestack.recipes.engine_cli import EngineSpec
from servestack.util.yamlfile import Node

_CONC_STRING = re.compile(r"^[0-9]+(x[0-9]+)*$")
_PLACEHOLDER = re.compile(r"\{\s*[A-Za-z_][\w.-]*\s*\}")


def concurrency_list(value: Any) -> list[int]:
    """srt-slurm's benchmark.concurrencies ("64x128x256", a list, or one integer) as integers.

    The one reading of the field: the validator and the stages both use it. Raises ValueError
    naming what is wrong: not positive integers, empty, a duplicate, neither ascending nor descending.
    """
    if is_int(value):
        values = [value]
    elif isinstance(value, str):
        if not _CONC_STRING.match(value):
            raise ValueError(f"malformed concurrency list {value!r}: expected positive integers joined by 'x', e.g. \"64x128x256\"")
        values = [int(p) for p in value.split("x")]
    elif isinstance(value, list):
        values = []
        for v in value:
            if isinstance(v, str) and v.isdigit():
                values.append(int(v))  # srt-slurm's loader coerces numeric strings
            elif is_int(v):
                values.append(v)
            else:
                raise ValueError(f"malformed concurrency list: {v!r} is not an integer")
    else:
        raise ValueError(f"malformed concurrency list {value!r}: expected \"64x128x256\" or a list of integers")
    if not values:
        raise ValueError("malformed concurrency list: empty")
    bad = [x for x in values if x <= 0]
    if bad:
        raise ValueError(f"malformed concurrency list: {bad[0]} is not a positive integer")
    dups = sorted({x for x in values if values.count(x) > 1})
    if dups:
        raise ValueError(f"malformed concurrency list: {dups[0]} appears more than once")
    if values != sorted(values) and values != sorted(values, reverse=True):
        raise ValueError(f"malformed concurrency list: {values} is neither ascending nor descending")
    return values


def suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


class Checker:
    """One recipe's problems, each at its file:line:column and key path; what was not checked, in notes."""

    def __init__(self, file: str, engine: EngineSpec | None, sweep: bool):
        self.file = file
        self.engine = engine
        self.sweep = sweep
        self.errors: list[InputError] = []
        self.variant = ""  # an override variant being checked, named in its errors
        self.notes: list[str] = []  # what was not checked, and why (never skipped silently)
        self.warnings: list[InputError] = []  # what runs, but costs (queued requests, eager batches, ...)
        self.platforms: tuple[str, ...] = ()  # the image's platforms (linux/arm64, ...), when the stack is known
        self.judged = False  # the engine judges the resolved roles (judge.py): the static cross-role rules stand down

    def unchecked(self, engine_type: Any) -> None:
        if self.engine is not None and engine_type != self.engine.engine:
            note = (f"{self.file}: {engine_type} flags and environment not checked "
                    f"(the engine description describes {self.engine.engine}, not {engine_type})")
            if note not in self.notes:
                self.notes.append(note)

    # -- reporting ------------------------------------------------------------------------
    def err(self, node: Node | None, path: tuple[str, ...], problem: str, *, at_key: bool = False) -> None:
        self.errors.append(self._error(node, path, problem, at_key))

    def warn(self, node: Node | None, path: tuple[str, ...], problem: str) -> None:
        self.warnings.append(self._error(node, path, problem, False))

    def line(self, node: Node | None) -> str:
        """A node's line, as a message comparing two places names it."""
        return "?" if node is None else str(node.key_line or node.line)

    def _error(self, node: Node | None, path: tuple[str, ...], problem: str, at_key: bool) -> InputError:
        if node is None:
            loc = Location(file=self.file)
        elif at_key and node.key_line is not None:
            loc = Location(file=self.file, line=node.key_line, column=node.key_column)
        else:
            loc = Location(file=self.file, line=node.line, column=node.column)
        field = ".".join(path)
        if self.variant:
            field = f"{self.variant}: {field}"
        return InputError(loc, field, problem)

    def placeholder(self, node: Node) -> bool:
        if not self.sweep:
            return False
        v = node.value
        if isinstance(v, str):
            return bool(_PLACEHOLDER.search(v))
        if isinstance(v, dict):  # `[{ conc }]` parses as a flow mapping {conc: null}
            return bool(v) and all(c.value is None for c in v.values())
        if isinstance(v, list):
            return any(self.placeholder(c) for c in v)
        return False

    # -- structure --------------------------------------------------------------------------
    def walk(self, node: Node, spec: Any, path: tuple[str, ...], *, keys_only: bool = False) -> None:
        if node.value is None:
            return  # every srt-slurm field is optional or nullable at this level; required keys are checked apart
        if self.placeholder(node):
            return
        if isinstance(spec, dict):
            if not node.is_map:
                if not keys_only:
                    self.err(node, path, f"expected a mapping, got {type(node.value).__name__}")
                return
            for key, child in node.value.items():
                if key not in spec:
                    self.err(child, path + (key,), "unknown key" + suggest(key, spec), at_key=True)
                    continue
                self.walk(child, spec[key], path + (key,), keys_only=keys_only)
            return
        if keys_only:
            if spec == "backend" and node.is_map:
                self.backend(node, path, keys_only=True)
            if spec == "roles" and node.is_map:
                self.roles(node, path, keys_only=True)
            return
        self.leaf(node, spec, path)

    def leaf(self, node: Node, spec: str, path: tuple[str, ...]) -> None:
        v = node.value
        ok = True
        if spec == "str":
            ok = isinstance(v, str)
        elif spec == "int":
            ok = is_int(v)
        elif spec == "bool":
            ok = isinstance(v, bool)
        elif spec == "num":
            ok = (is_int(v) or isinstance(v, float))
        elif spec == "str|int":
            ok = isinstance(v, str) or is_int(v)
        elif spec == "scalar":
            ok = not isinstance(v, (dict, list))
        elif spec == "map":
            ok = isinstance(v, dict)
        elif spec in ("bool|map",):
            ok = isinstance(v, (bool, dict))
        elif spec == "str|map":
            ok = isinstance(v, (str, dict))
        elif spec == "list":
            ok = isinstance(v, list)
        elif spec == "strlist":
            ok = isinstance(v, list) and all(isinstance(c.value, str) or self.placeholder(c) for c in v)
        elif spec == "strmap":
            ok = isinstance(v, dict)
            if ok:
                for k, c in v.items():
                    if isinstance(c.value, (dict, list)) and not self.placeholder(c):
                        self.err(c, path + (k,), "expected a scalar value")
        elif spec == "nodes":
            ok = is_int(v) or v == "colocate"
        elif spec == "concurrencies":
            self.concurrencies(node, path)
        elif spec == "backend":
            ok = isinstance(v, dict)
            if ok:
                self.backend(node, path)
        elif spec == "roles":
            ok = isinstance(v, dict)
            if ok:
                self.roles(node, path)
        elif spec == "any":
            pass
        else:  # pragma: no cover - a schema typo
            raise AssertionError(f"unknown leaf type {spec}")
        if not ok:
            want = {"str": "a string", "int": "an integer", "bool": "true or false", "num": "a number",
                    "map": "a mapping", "list": "a list", "strlist": "a list of strings",
                    "strmap": "a mapping", "nodes": "an integer or 'colocate'"}.get(spec, spec)
            self.err(node, path, f"expected {want}, got {v!r}")

    def required(self, root: Node, required: dict) -> None:
        for parent_path, keys in required.items():
            parent: Node | None = root
            for p in parent_path:
                parent = parent.get(p) if parent is not None else None
            if parent is None or not parent.is_map:
                continue
            for key in keys:
                if key not in parent.value:
                    self.err(parent, parent_path + (key,), "required key is missing")

    def backend(self, node: Node, path: tuple[str, ...], *, keys_only: bool = False) -> None:
        if keys_only:  # an override may omit the type its base sets: accept any backend's keys
            union: dict = {}
            for spec in S.BACKENDS_V1.values():
                union.update(spec)
            self.walk(node, union, path, keys_only=True)
            return
        type_node = node.get("type")
        btype = type_node.value if type_node is not None else "sglang"
        if not isinstance(btype, str) or btype not in S.BACKENDS_V1:
            if isinstance(btype, str) and type_node is not None and self.placeholder(type_node):
                return
            self.err(type_node or node, path + ("type",), f"unknown backend type {btype!r}" + suggest(str(btype), S.BACKENDS_V1))
            return
        self.walk(node, S.BACKENDS_V1[btype], path, keys_only=keys_only)

    def roles(self, node: Node, path: tuple[str, ...], *, keys_only: bool = False) -> None:
        for name, role in node.value.items():
            if name not in S.ROLE_NAMES:
                self.err(role, path + (name,), "unknown role" + suggest(name, S.ROLE_NAMES) + " (roles are prefill, decode, agg)",
                         at_key=True)
                continue
            self.walk(role, S.ROLE_V2, path + (name,), keys_only=keys_only)

    # -- concurrencies ----------------------------------------------------------------------
    def concurrencies(self, node: Node, path: tuple[str, ...]) -> None:
        if node.is_list and any(self.placeholder(c) for c in node.value):
            return
        try:
            concurrency_list(node.plain())
        except ValueError as e:
            bad = next((c for c in node.value if not is_int(c.value) and not str(c.value).isdigit()), node) if node.is_list else node
            self.err(bad, path, str(e))

    def int_value(self, node: Node | None) -> int | None:
        if node is None or not is_int(node.value):
            return None
        return node.value
