"""srt-slurm's override form: `base:` plus `override_<name>` (deep-merged onto it) and `zip_override_<name>`
(lists zipped into one variant each); every variant is then checked as a complete recipe."""

from __future__ import annotations

from servestack.recipes import schema as S
from servestack.recipes.structure import Checker, suggest
from servestack.util.yamlfile import Node


def expand_overrides(c: Checker, root: Node) -> tuple[Node, dict, dict, list[tuple[str, Node]]]:
    """(base, its schema, its required keys, the variants by name); the override sections' own keys are checked here."""
    base = root.get("base")
    assert base is not None  # overrides are expanded only for a recipe with a `base:`
    spec = S.TOP_V2 if (base.is_map and base.get("schema") is not None) else S.TOP_V1
    required = S.REQUIRED_V2 if spec is S.TOP_V2 else S.REQUIRED_V1
    c.walk(base, spec, ("base",))
    variants: list[tuple[str, Node]] = []
    for key, over in root.value.items():
        if key == "base":
            continue
        if key.startswith("override_"):
            c.walk(over, spec, (key,), keys_only=True)
            if base.is_map and over.is_map:
                variants.append((key, deep_merge(base, over)))
        elif key.startswith("zip_override_"):
            c.walk(over, spec, (key,), keys_only=True)
            if base.is_map and over.is_map:
                n = _zip_length(c, over, (key,))
                for i in range(n or 0):
                    variants.append((f"{key}[{i}]", deep_merge(base, _zip_slice(over, i))))
        else:
            c.err(over, (key,), "unknown key in an override recipe (expected base, override_<name> or zip_override_<name>)"
                  + suggest(key, ["base", "override_", "zip_override_"]), at_key=True)
    if not variants and base.is_map:
        variants.append(("base", base))
    return base, spec, required, variants


def deep_merge(base: Node, over: Node) -> Node:
    """srt-slurm's deep_merge on positioned nodes: mappings merge, a null removes, others replace.

    The one merge of recipes: srt-slurm's override sections here, and servestack's recipe families
    (render.py: base, then a config's `set`, then a variant's)."""
    if not (base.is_map and over.is_map):
        return over
    merged = dict(base.value)
    for k, v in over.value.items():
        if v.value is None:
            merged.pop(k, None)
        elif k in merged:
            merged[k] = deep_merge(merged[k], v)
        else:
            merged[k] = v
    return Node(value=merged, line=base.line, column=base.column, key_line=base.key_line, key_column=base.key_column, tag=base.tag)


def _list_lengths(node: Node) -> list[int]:
    if node.is_list:
        return [len(node.value)]
    if node.is_map:
        return [n for child in node.value.values() for n in _list_lengths(child)]
    return []


def _zip_length(c: Checker, node: Node, path: tuple[str, ...]) -> int | None:
    """srt-slurm's zip rule: lists of length 1 broadcast, all others share one length N."""
    lengths = _list_lengths(node)
    if not lengths or 0 in lengths:
        c.err(node, path, "a zip_override section needs non-empty lists to zip", at_key=True)
        return None
    other = {n for n in lengths if n != 1}
    if len(other) > 1:
        c.err(node, path, f"incompatible zip lengths {sorted(other)}: lists must share one length or have length 1", at_key=True)
        return None
    return other.pop() if other else 1


def _zip_slice(node: Node, i: int) -> Node:
    if node.is_list:
        return node.value[0 if len(node.value) == 1 else i]
    if node.is_map:
        return Node(value={k: _zip_slice(v, i) for k, v in node.value.items()}, line=node.line, column=node.column,
                    key_line=node.key_line, key_column=node.key_column, tag=node.tag)
    return node
