"""YAML read with positions: every value keeps the line and column it came from.

pyyaml's composer gives nodes with start marks; this module turns them into a small tree of
`Node`s (mapping keys keep their own marks) so that every error can name file:line:column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError, Location


@dataclass
class Node:
    value: Any  # dict[str, Node] | list[Node] | scalar
    line: int  # 1-based
    column: int  # 1-based
    key_line: int | None = None  # where the key naming this value is
    key_column: int | None = None
    tag: str = ""
    children_keys: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def is_map(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_list(self) -> bool:
        return isinstance(self.value, list)

    def get(self, key: str) -> "Node | None":
        return self.value.get(key) if isinstance(self.value, dict) else None

    def plain(self) -> Any:
        """The Python value without positions."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


class _Constructor(yaml.constructor.SafeConstructor):
    pass


def _convert(node: yaml.Node, file: str) -> Node:
    line, col = node.start_mark.line + 1, node.start_mark.column + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Node] = {}
        c = _Constructor()
        c.flatten_mapping(node)
        for knode, vnode in node.value:
            key = c.construct_object(knode, deep=True)
            kline, kcol = knode.start_mark.line + 1, knode.start_mark.column + 1
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                raise InputError(Location(file, kline, kcol), key, "duplicate key")
            child = _convert(vnode, file)
            child.key_line, child.key_column = kline, kcol
            out[key] = child
        return Node(out, line, col, tag=node.tag)
    if isinstance(node, yaml.SequenceNode):
        return Node([_convert(n, file) for n in node.value], line, col, tag=node.tag)
    value = _Constructor().construct_object(node, deep=True)
    return Node(value, line, col, tag=node.tag)


def parse(text: str, file: Path | str) -> Node:
    """Parse one YAML document; errors name the file and position."""
    file = str(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        loc = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file)
        raise InputError(loc, "", f"not valid YAML: {e.problem or e}") from e
    except yaml.YAMLError as e:
        raise InputError(file, "", f"not valid YAML: {e}") from e
    if root is None:
        raise InputError(Location(file, 1, 1), "", "empty YAML document")
    return _convert(root, file)


def load(path: Path | str) -> Node:
    path = Path(path)
    return parse(path.read_text(), path)
