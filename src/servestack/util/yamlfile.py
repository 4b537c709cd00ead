"""YAML documents that remember where each value came from, so errors can name line and column.

The one YAML reader of the project. Two views of the same parse:

    parse(text, file) -> Node       a tree whose every value keeps its line and column (and its
                                    key's), for walkers that check as they go (recipes);
    load(file) -> Document          plain data plus a table of positions by key path, for typed
                                    models that validate the plain data;
    load_model(file, Model) -> Model   that validation, every problem at its line and column with
                                    "did you mean" for a misspelled key (stacks, the image plan, pipelines).

Every user file's model derives from `UserModel`, and says "give exactly one of" through `exactly_one`,
so the files refuse the same mistakes in the same words.

A duplicate mapping key is an error (pyyaml would keep the last one silently); anchors and merge
keys (`<<: *base`) are resolved; invalid YAML is an InputError at its position.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo
from pydantic_core import ErrorDetails

from servestack.errors import FieldProblem, InputError, InputErrors, Location

M = TypeVar("M", bound=BaseModel)

PathKey = tuple[str | int, ...]


@dataclass(kw_only=True)
class Node:
    value: Any  # dict[str, Node] | list[Node] | scalar
    line: int  # 1-based
    column: int  # 1-based
    key_line: int | None = None  # where the key naming this value is
    key_column: int | None = None
    tag: str = ""
    key: Any = None  # the key as YAML typed it (an int stays an int in plain()); the tree indexes by str(key)

    @property
    def is_map(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_list(self) -> bool:
        return isinstance(self.value, list)

    def get(self, key: str) -> Node | None:
        return self.value.get(key) if isinstance(self.value, dict) else None

    def plain(self) -> Any:
        """The Python value without positions."""
        if isinstance(self.value, dict):
            return {(k if v.key is None else v.key): v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


class _Constructor(yaml.constructor.SafeConstructor):
    pass


def _convert(node: yaml.Node, file: Path | str) -> Node:
    line, col = node.start_mark.line + 1, node.start_mark.column + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Node] = {}
        c = _Constructor()
        # A key written here overrides the same key a merge (`<<: *anchor`) brings in, as YAML says;
        # two written here are a mistake.
        if any(k.tag == "tag:yaml.org,2002:merge" for k, _ in node.value):
            # flatten_mapping rewrites the node in place, and an alias reaches the same node again
            # (a config merging a config): flattened once, its merged keys would read as written.
            node = copy.deepcopy(node)
        written = {id(k) for k, _ in node.value}
        merged: set[str] = set()
        c.flatten_mapping(node)
        for knode, vnode in node.value:
            typed = c.construct_object(knode, deep=True)
            kline, kcol = knode.start_mark.line + 1, knode.start_mark.column + 1
            key = typed if isinstance(typed, str) else str(typed)
            if id(knode) not in written:
                merged.add(key)
            elif key in merged:
                merged.discard(key)
                del out[key]
            if key in out:
                raise InputError(Location(file=file, line=kline, column=kcol), key, "duplicate key")
            child = _convert(vnode, file)
            child.key_line, child.key_column = kline, kcol
            child.key = typed
            out[key] = child
        return Node(value=out, line=line, column=col, tag=node.tag)
    if isinstance(node, yaml.SequenceNode):
        return Node(value=[_convert(n, file) for n in node.value], line=line, column=col, tag=node.tag)
    value = _Constructor().construct_object(node, deep=True)
    return Node(value=value, line=line, column=col, tag=node.tag)


def _compose(text: str, file: Path | str) -> Node | None:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        loc = Location(file=file, line=mark.line + 1, column=mark.column + 1) if mark else Location(file=file)
        raise InputError(loc, "", f"not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise InputError(file, "", f"not valid YAML: {e}") from None
    return _convert(root, file) if root is not None else None


def parse(text: str, file: Path | str) -> Node:
    """Parse one YAML document into positioned nodes; errors name the file and position."""
    root = _compose(text, str(file))
    if root is None:
        raise InputError(Location(file=str(file), line=1, column=1), "", "empty YAML document")
    return root


@dataclass(frozen=True, kw_only=True)
class Document:
    file: Path
    data: Any
    marks: dict[PathKey, tuple[int, int]]

    def location(self, path: PathKey) -> Location:
        """The closest known position of `path`: the key itself, else its nearest parent."""
        for end in range(len(path), -1, -1):
            mark = self.marks.get(tuple(path[:end]))
            if mark:
                return Location(file=self.file, line=mark[0], column=mark[1])
        return Location(file=self.file)

    def error(self, path: PathKey, problem: str) -> InputError:
        return InputError(self.location(path), dotted(path), problem)


def _marks(node: Node, path: PathKey, marks: dict[PathKey, tuple[int, int]]) -> None:
    if isinstance(node.value, dict):
        for name, child in node.value.items():
            key = name if child.key is None else child.key
            marks[(*path, key)] = (child.key_line or child.line, child.key_column or child.column)
            _marks(child, (*path, key), marks)
    elif isinstance(node.value, list):
        for index, item in enumerate(node.value):
            marks[(*path, index)] = (item.line, item.column)
            _marks(item, (*path, index), marks)


def load(file: Path) -> Document:
    file = Path(file)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise InputError(file, "", "file not found") from None
    root = _compose(text, file)
    marks: dict[PathKey, tuple[int, int]] = {(): (1, 1)}
    if root is not None:
        _marks(root, (), marks)
    return Document(file=file, data=root.plain() if root is not None else None, marks=marks)


def load_nodes(file: Path | str) -> Node:
    file = Path(file)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise InputError(file, "", "file not found") from None
    return parse(text, file)


def dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def relative_to_base(value: Path | str, info: ValidationInfo) -> Path:
    """A path as the document writes it, made absolute against the `base` directory that
    `load_model` was given (unchanged when there is none)."""
    base = (info.context or {}).get("base")
    return (Path(base) / value).resolve() if base is not None else Path(value)


# A path in a document, relative to the `base` given to load_model (e.g. the project root).
RelativePath = Annotated[Path, AfterValidator(relative_to_base)]


class UserModel(BaseModel):
    """The base of every model of a user file (the stack file, a pipeline and its runners' sections,
    the image plan): a key the model does not know is refused, so a misspelling is named with a
    "did you mean" instead of being ignored; and a file once read is a value nothing changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def exactly_one(model: BaseModel, choices: Mapping[str, str], *, lead: str = "give") -> None:
    """For a model validator: unless exactly one of CHOICES (field -> what it is, or "") is set, the
    ValueError every user file gives for it, `give exactly one of `a` (what it is) or `b``. LEAD
    begins the sentence for a choice that only some values need (`` `file` needs ``)."""
    given = [name for name in choices if getattr(model, name) is not None]
    if len(given) != 1:
        named = [f"`{name}`" + (f" ({what})" if what else "") for name, what in choices.items()]
        raise ValueError(f"{lead} exactly one of {', '.join(named[:-1])} or {named[-1]}")


def load_model(file: Path, model: type[M], expected: str, *, base: Path | None = None) -> M:
    """FILE validated as MODEL; all problems at once, each with file:line:col, field and what was
    expected (EXPECTED says what the whole document should be). Relative paths (`RelativePath`)
    are resolved against BASE."""
    document = load(file)
    if not isinstance(document.data, dict):
        raise InputError(document.location(()), "", f"expected {expected}")
    try:
        return model.model_validate(document.data, context={"base": base})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, FieldProblem):
                loc += cause.path
            problems.append(InputError(document.location(loc), dotted(loc) or "(document)", _explain(model, error, loc)))
        raise InputErrors(problems) from None


def _field_names(model: type[BaseModel], path: PathKey) -> list[str]:
    """The field names allowed at `path` (used to suggest a fix for a misspelled key)."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
    return sorted(current.model_fields) if current else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found:
            return found
    return None


def _explain(model: type[BaseModel], error: ErrorDetails, loc: PathKey) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _field_names(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean `{close[0]}`? " if close else ""
        return f"unknown field; {hint}expected one of: {', '.join(allowed)}"
    if kind == "missing":
        return "required field is missing"
    message = error["msg"].removeprefix("Value error, ")
    if kind != "value_error":
        message += f" (got {error.get('input')!r})"
    return message
