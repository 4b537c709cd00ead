"""Reading a JSON record field by field: a wrong field is named with its file and what was expected.

Every record (lock, build.json, image.json, ...) is read through `Fields`, so a hand-edited or
truncated file fails with `<file>: platforms.linux/amd64[3].sha256: expected a string, found null`
instead of a KeyError deep inside a step.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from servestack.errors import InputError, Location, ServestackError
from servestack.util.fsutil import atomic_write_json

T = TypeVar("T")
_MISSING = object()


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


class Fields:
    """One JSON object of a record file at `prefix` (dotted, "" for the top)."""

    def __init__(self, data: Any, file: Path | str, prefix: str = ""):
        self.file, self.prefix = file, prefix
        if not isinstance(data, dict):
            raise InputError(file, prefix, f"expected an object, found {_kind(data)}")
        self.data: dict[str, Any] = data

    def path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.prefix}[{key}]"
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str | int, problem: str) -> InputError:
        return InputError(self.file, self.path(key), problem)

    def has(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, check: Callable[[Any], bool], expected: str, default: Any) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            if default is not _MISSING:
                return default
            raise self.error(key, f"missing (expected {expected})")
        if not check(value):
            raise self.error(key, f"expected {expected}, found {_kind(value)}")
        return value

    def str(self, key: builtins.str, default: Any = _MISSING) -> builtins.str:
        return self._get(key, lambda v: isinstance(v, str), "a string", default)

    def str_or_none(self, key: builtins.str, default: Any = _MISSING) -> builtins.str | None:
        return self._get(key, lambda v: v is None or isinstance(v, str), "a string or null", default)

    def int(self, key: builtins.str, default: Any = _MISSING) -> builtins.int:
        return self._get(key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", default)

    def int_or_none(self, key: builtins.str, default: Any = _MISSING) -> builtins.int | None:
        return self._get(key, lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
                         "an integer or null", default)

    def number(self, key: builtins.str, default: Any = _MISSING) -> float:
        return self._get(key, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number", default)

    def number_or_none(self, key: builtins.str, default: Any = _MISSING) -> float | None:
        return self._get(key, lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                         "a number or null", default)

    def bool(self, key: builtins.str, default: Any = _MISSING) -> builtins.bool:
        return self._get(key, lambda v: isinstance(v, bool), "true or false", default)

    def strs(self, key: builtins.str, default: Any = _MISSING) -> tuple[builtins.str, ...]:
        value = self._get(key, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                          "a list of strings", default)
        return tuple(value) if isinstance(value, list) else value

    def str_map(self, key: builtins.str, *, values_may_be_null: builtins.bool = False, default: Any = _MISSING) -> dict[builtins.str, Any]:
        ok = (lambda x: x is None or isinstance(x, str)) if values_may_be_null else (lambda x: isinstance(x, str))
        value = self._get(key, lambda v: isinstance(v, dict) and all(ok(x) for x in v.values()),
                          "an object of strings", default)
        return dict(value) if isinstance(value, dict) else value

    def json(self, key: builtins.str, default: Any = _MISSING) -> Any:
        """A field whose content another owner defines (kept as plain JSON data)."""
        return self._get(key, lambda v: True, "a value", default)

    def obj(self, key: builtins.str) -> Fields:
        return Fields(self._get(key, lambda v: isinstance(v, dict), "an object", _MISSING), self.file, self.path(key))

    def obj_or_none(self, key: builtins.str) -> Fields | None:
        value = self._get(key, lambda v: v is None or isinstance(v, dict), "an object or null", None)
        return None if value is None else Fields(value, self.file, self.path(key))

    def items(self, key: builtins.str, read: Callable[[Fields], T], default: Any = _MISSING) -> tuple[T, ...]:
        """A list of objects, each read by `read`."""
        value = self._get(key, lambda v: isinstance(v, list), "a list of objects", default)
        if not isinstance(value, list):
            return value
        return tuple(read(Fields(item, self.file, f"{self.path(key)}[{i}]")) for i, item in enumerate(value))

    def entries(self, key: builtins.str, read: Callable[[Fields], T], default: Any = _MISSING) -> dict[builtins.str, T]:
        """An object of objects, each read by `read`."""
        value = self._get(key, lambda v: isinstance(v, dict), "an object", default)
        return {name: read(Fields(item, self.file, f"{self.path(key)}.{name}")) for name, item in value.items()}

    def only(self, *known: builtins.str) -> None:
        """Refuse fields this reader does not know: re-writing the record would drop them."""
        unknown = sorted(set(self.data) - set(known))
        if unknown:
            raise self.error(unknown[0], f"unknown field (expected one of: {', '.join(sorted(known))})")


def read_record(path: Path, read: Callable[[Fields], T], remedy: builtins.str, shown: Path | builtins.str | None = None) -> T:
    """The record at `path`, parsed by `read`; a missing or broken file says so and what to run."""
    shown = shown or path
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ServestackError(f"{shown}: missing; {remedy}" if remedy else f"{shown}: missing") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(Location(file=shown, line=exc.lineno, column=exc.colno), "", f"not valid JSON ({exc.msg})") from None
    return read(Fields(data, shown))


def write_record(path: Path, document: dict[builtins.str, Any]) -> None:
    """Every record's one spelling: canonical JSON, written atomically."""
    atomic_write_json(path, document)
