"""YAML documents that remember where each value came from, so errors can name line and column."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError, Location

PathKey = tuple[str | int, ...]


@dataclass(frozen=True)
class Document:
    file: Path
    data: Any
    marks: dict[PathKey, tuple[int, int]]

    def location(self, path: PathKey) -> Location:
        """The closest known position of `path`: the key itself, else its nearest parent."""
        for end in range(len(path), -1, -1):
            mark = self.marks.get(tuple(path[:end]))
            if mark:
                return Location(self.file, *mark)
        return Location(self.file)

    def error(self, path: PathKey, problem: str) -> InputError:
        return InputError(self.location(path), dotted(path), problem)


def _walk(node: yaml.Node, path: PathKey, marks: dict[PathKey, tuple[int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value)
            marks[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk(value_node, child, marks)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            marks[child] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, child, marks)


def load(file: Path) -> Document:
    file = Path(file)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise InputError(file, "", "file not found") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file)
        raise InputError(where, "", f"not valid YAML: {exc.problem}") from None
    marks: dict[PathKey, tuple[int, int]] = {(): (1, 1)}
    if node is not None:
        _walk(node, (), marks)
    return Document(file, data, marks)


def dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
