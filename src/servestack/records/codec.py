"""A record's JSON derived from its one declaration: the dataclass's fields and their type hints.

A record is a frozen, keyword-only dataclass that subclasses `Record`. `to_json()` writes its fields in
declaration order (records as objects, tuples as lists); `from_json(f)` reads them back through `Fields`,
so a bad file is named by file, field and what was expected, and refuses keys the record does not
declare (re-writing it would drop them). A field with a default may be absent from a file.

What today's files spell differently from the plain rule is declared once, in the field's metadata
(`field(..., metadata=json_quirks(...))`), never re-coded per class:

    omit=True      left out when it equals its default (None, (), {}): files made before it keep their bytes
    key="..."      the JSON key, where it differs from the attribute's name
    inline=True    a nested record whose keys sit in this object, present when any of them is
    tags={...}     a union of records, written as {tag: record}
    check=...      a problem with a value as read (None: none), named at its field
    written=False  not in the file at all (where the record was read from)
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any, Self, TypeVar, Union, get_args, get_origin, get_type_hints

from servestack.errors import InputError
from servestack.records.fields import Fields

R = TypeVar("R", bound="Record")
_QUIRKS = "servestack.records.codec"
_FieldReader = Callable[[Fields, str], Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Quirks:
    omit: bool = False
    key: str | None = None
    inline: bool = False
    tags: Mapping[str, type[Record]] | None = None
    check: Callable[[Any], str | None] | None = None
    written: bool = True


def json_quirks(*, omit: bool = False, key: str | None = None, inline: bool = False,
                tags: Mapping[str, type[Record]] | None = None, check: Callable[[Any], str | None] | None = None,
                written: bool = True) -> dict[str, Any]:
    """A field's metadata saying how its JSON differs from the plain rule (see the module)."""
    return {_QUIRKS: _Quirks(omit=omit, key=key, inline=inline, tags=tags, check=check, written=written)}


def one_of(*choices: str) -> Callable[[Any], str | None]:
    """A `check` for a field whose value is one of CHOICES."""
    def problem(value: Any) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}, found {value!r}"
    return problem


class Record:
    """A frozen, keyword-only dataclass whose JSON is derived from its fields (see the module)."""

    def to_json(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        return decode(cls, f)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Field:
    name: str
    key: str
    quirks: _Quirks
    hint: Any
    default: Callable[[], Any] | None  # None: the field is required
    read: _FieldReader | None  # None: inline or tagged, read by `_values`

    @property
    def keys(self) -> tuple[str, ...]:
        """The JSON keys this field takes in its object (an inline record's own, else its one key)."""
        if self.quirks.inline:
            return tuple(k for inner in _plan(self.hint) for k in inner.keys)
        return (self.key,)


def _default(field: dataclasses.Field[Any]) -> Callable[[], Any] | None:
    if field.default is not dataclasses.MISSING:
        value = field.default
        return lambda: value
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory
    return None


_PLANS: dict[type, tuple[_Field, ...]] = {}


def _plan(cls: type) -> tuple[_Field, ...]:
    """How each written field of CLS is spelled and read, in declaration order (worked out once per class)."""
    if cls not in _PLANS:
        _PLANS[cls] = _planned(cls)
    return _PLANS[cls]


def _planned(cls: type) -> tuple[_Field, ...]:
    hints = get_type_hints(cls)
    plan = []
    for field in dataclasses.fields(cls):
        quirks = field.metadata.get(_QUIRKS, _Quirks())
        if not quirks.written:
            continue
        hint = hints[field.name]
        if quirks.inline:
            hint = _optional(hint) or hint
        plain = not (quirks.inline or quirks.tags)
        plan.append(_Field(name=field.name, key=quirks.key or field.name, quirks=quirks, hint=hint,
                           default=_default(field), read=_reader(hint) if plain else None))
    return tuple(plan)


def encode(record: Record) -> dict[str, Any]:
    """RECORD's JSON object: each written field under its key, in declaration order."""
    document: dict[str, Any] = {}
    for field in _plan(type(record)):
        value = getattr(record, field.name)
        if field.quirks.omit and field.default is not None and value == field.default():
            continue
        if field.quirks.inline:
            document.update(encode(value) if value is not None else {})
        elif field.quirks.tags:
            tag = next(tag for tag, kind in field.quirks.tags.items() if isinstance(value, kind))
            document[field.key] = {tag: _written(value)}
        else:
            document[field.key] = _written(value)
    return document


def _written(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_written(item) for item in value]
    if isinstance(value, dict):  # in key order, as canonical_json writes it: one spelling in memory and on disk
        return {key: _written(item) for key, item in sorted(value.items())}
    return value


def decode(cls: type[R], f: Fields, *, also: tuple[str, ...] = (), given: Mapping[str, Any] | None = None) -> R:
    """The record CLS from the object F; ALSO: keys the class writes beside its fields (and checks itself);
    GIVEN: the fields the file does not hold (where it was read from)."""
    f.only(*(key for field in _plan(cls) for key in field.keys), *also)
    return cls(**_values(cls, f), **(given or {}))


def _values(cls: type, f: Fields) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in _plan(cls):
        if field.quirks.inline:
            if any(f.has(key) for key in field.keys):
                values[field.name] = field.hint(**_values(field.hint, f))
            continue
        if field.default is not None and not f.has(field.key):
            continue
        if field.quirks.tags:
            values[field.name] = _read_kind(f.obj(field.key), field.quirks.tags)
        else:
            assert field.read is not None
            values[field.name] = field.read(f, field.key)
        problem = field.quirks.check(values[field.name]) if field.quirks.check else None
        if problem:
            raise f.error(field.key, problem)
    return values


def _read_kind(f: Fields, tags: Mapping[str, type[Record]]) -> Record:
    """The record F holds under its one key, which names the record's kind among TAGS."""
    tag = next((tag for tag in tags if f.has(tag)), None)
    if tag is None:
        raise InputError(f.file, f.prefix, f"expected one of {', '.join(tags)} as its one key")
    f.only(tag)
    return tags[tag].from_json(f.obj(tag))


def _optional(hint: Any) -> Any:
    """X of `X | None`, else None."""
    if get_origin(hint) in (Union, types.UnionType):
        args = get_args(hint)
        if type(None) in args and len(args) == 2:
            return next(arg for arg in args if arg is not type(None))
    return None


_SCALARS: dict[Any, _FieldReader] = {
    str: Fields.str, int: Fields.int, float: Fields.number, bool: Fields.bool, Any: Fields.json,
}
_SCALARS_OR_NONE: dict[Any, _FieldReader] = {
    str: Fields.str_or_none, int: Fields.int_or_none, float: Fields.number_or_none,
}


def _reader(hint: Any) -> _FieldReader:
    """How a field of type HINT is read from its object."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    inner = _optional(hint)
    if inner is not None:
        if inner in _SCALARS_OR_NONE:
            return _SCALARS_OR_NONE[inner]
        read_inner = _reader(inner)
        return lambda f, key: None if f.data.get(key) is None else read_inner(f, key)
    origin, args = get_origin(hint), get_args(hint)
    if origin is list:  # a list the record's owner appends to while it is made: read as its tuple, then a list
        read_tuple = _reader(tuple[args[0], ...])  # type: ignore[valid-type]
        return lambda f, key: list(read_tuple(f, key))
    if origin is tuple and args[0] is str:
        return Fields.strs
    if origin is tuple and args[0] in (int, float):
        return _numbers
    if origin is tuple:
        read_item = _object_reader(args[0])
        return lambda f, key: f.items(key, read_item)
    if origin is dict and args[1] is str:
        return Fields.str_map
    if origin is dict and _optional(args[1]) is str:
        return lambda f, key: f.str_map(key, values_may_be_null=True)
    read_object = _object_reader(hint)
    return lambda f, key: read_object(f.obj(key))


def _numbers(f: Fields, key: str) -> tuple[float, ...]:
    value = f.json(key)
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise f.error(key, "expected a list of numbers")
    return tuple(value)


def _object_reader(hint: Any) -> Callable[[Fields], Any]:
    """How a value of type HINT is read from its own object."""
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_json
    if get_origin(hint) is dict:
        read_value = _reader(get_args(hint)[1])
        return lambda f: {key: read_value(f, key) for key in f.data}
    raise TypeError(f"records.codec cannot read a {hint}")
