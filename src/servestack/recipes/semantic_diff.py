"""Compare our recipes with someone else's (NVIDIA's published set), by meaning, not by text.

Two recipes mean the same when srt-slurm would run the same thing from them. So the comparison
reads both the way srtctl does: a null is the same as an absent key; an engine flag's key may be
written with `_` or `-` (srtctl passes `--a-b` either way); a flag set to false is left out of the
command line, like an absent one; a flag's value is passed as str(value), so 1 and "1" are equal,
and a JSON value (kv-transfer-config) is compared as JSON; environment values are strings; a
concurrency list "64x128" equals [64, 128]. Quoting, key order, comments and blank lines never count.

`IGNORED` are the parts that differ on purpose: the container (ours is the image by digest), the
Dynamo install block (ours is installed in the image, pinned by the lock) and srt-slurm's identity
block (ours records the bound image and the locked versions).

    compare_dirs(ours_dir, theirs_dir) -> list[FileComparison]   # planning: data only
    format_comparisons(comparisons) -> str                        # what `servestack recipes compare` prints
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.errors import InputError
from servestack.recipes import schema as S
from servestack.recipes.structure import concurrency_list
from servestack.util.yamlfile import load_nodes as load

IGNORED: tuple[tuple[str, ...], ...] = (("model", "container"), ("dynamo",), ("identity",))

# Settings srt-slurm has changed the default of, which ours write out so a recipe runs the same on any
# srtctl: path -> (the value theirs ran with by leaving it unset, why). Ours holding that value where
# theirs leaves the field unset is intended, and said so.
WRITTEN_OUT: dict[tuple[str, ...], tuple[Any, str]] = {
    ("backend", "dp_launch_mode"): (
        "per_gpu", "srt-slurm's vLLM default until v1.0.68 (per_node since), the mode the published numbers ran with"),
}
_ABSENT = "(absent)"


@dataclass(frozen=True, kw_only=True)
class Difference:
    path: tuple[str, ...]
    ours: Any  # _ABSENT when the key is missing
    theirs: Any
    ignored: bool

    @property
    def key(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True, kw_only=True)
class FileComparison:
    name: str
    ours: Path | None  # None: the file exists only in theirs
    theirs: Path | None  # None: only in ours
    differences: tuple[Difference, ...] = ()

    @property
    def same(self) -> bool:
        return self.ours is not None and self.theirs is not None and not any(not d.ignored for d in self.differences)


def _flag_value(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_flag_value(v) for v in value)
    text = str(value)
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.dumps(json.loads(text), sort_keys=True)
        except ValueError:
            return text
    return text


def _concurrencies(value: Any) -> Any:
    try:
        return tuple(concurrency_list(value))
    except ValueError:  # malformed: compared as written (the validator names the problem)
        return value


def _flatten(value: Any, spec: Any, path: tuple[str, ...], out: dict[tuple[str, ...], Any], *, flags: bool = False) -> None:
    """Leaves of one recipe, keyed by path, in the form srtctl would use them."""
    if value is None:
        return
    if flags:  # the keys of an engine's argument mapping: --flag value
        if isinstance(value, dict):
            for k, v in value.items():
                if v is None or v is False:
                    continue
                out[path + (str(k).replace("_", "-"),)] = True if v is True else _flag_value(v)
            return
    if isinstance(value, dict):
        if spec == "strmap":
            for k, v in value.items():
                if v is not None:
                    out[path + (str(k),)] = str(v)  # srt-slurm's str(): a YAML true is "True", not "true"
            return
        if spec == "backend":
            spec = S.BACKENDS_V1.get(str(value.get("type", "sglang")), {})
        # the modes under vllm_config (and the other engines' *_config) are engine argument mappings
        engine_args = bool(path) and path[-1] in S.ENGINE_CONFIG_KEY.values()
        for k, v in value.items():
            child = spec.get(k) if isinstance(spec, dict) else None
            _flatten(v, child, path + (str(k),), out, flags=engine_args)
        return
    if spec == "concurrencies":
        out[path] = _concurrencies(value)
        return
    if isinstance(value, list):
        out[path] = tuple(json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for v in value)
        return
    out[path] = value


def semantic(recipe: dict) -> dict[tuple[str, ...], Any]:
    """The recipe as srtctl would use it: leaf path -> normalized value."""
    out: dict[tuple[str, ...], Any] = {}
    spec = S.TOP_V2 if recipe.get("schema") == 2 else S.TOP_V1
    _flatten(recipe, spec, (), out)
    return out


def _ignored(path: tuple[str, ...]) -> bool:
    return any(path[: len(p)] == p for p in IGNORED)


def compare_recipes(ours: dict, theirs: dict) -> tuple[Difference, ...]:
    a, b = semantic(ours), semantic(theirs)
    diffs = []
    for path in sorted(set(a) | set(b)):
        va, vb = a.get(path, _ABSENT), b.get(path, _ABSENT)
        if va != vb:
            written_out = vb == _ABSENT and path in WRITTEN_OUT and WRITTEN_OUT[path][0] == va
            diffs.append(Difference(path=path, ours=va, theirs=vb, ignored=_ignored(path) or written_out))
    return tuple(diffs)


def _read(path: Path) -> dict:
    root = load(path)
    if not root.is_map:
        raise InputError(path, "", "a recipe must be a YAML mapping")
    return root.plain()


def _yaml_files(directory: Path) -> dict[str, Path]:
    if not directory.is_dir():
        raise InputError(directory, "", "not a directory of recipes")
    return {p.name: p for p in sorted(directory.iterdir()) if p.suffix in (".yaml", ".yml") and p.is_file()}


def compare_dirs(ours_dir: Path, theirs_dir: Path) -> list[FileComparison]:
    """Every recipe file of either directory, matched by file name, with its differences."""
    ours, theirs = _yaml_files(Path(ours_dir)), _yaml_files(Path(theirs_dir))
    out = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        diffs = compare_recipes(_read(a), _read(b)) if a is not None and b is not None else ()
        out.append(FileComparison(name=name, ours=a, theirs=b, differences=diffs))
    return out


def closest_set(recipe_sets: list[Path], theirs_dir: Path) -> Path:
    """Of our rendered sets, the one sharing the most file names with `theirs_dir`."""
    names = set(_yaml_files(Path(theirs_dir)))
    scored = sorted(((len(names & set(_yaml_files(d))), str(d), d) for d in recipe_sets), reverse=True)
    if not scored or scored[0][0] == 0:
        raise InputError(theirs_dir, "", "no committed recipe set has any of these file names: name ours with --against DIR")
    if len(scored) > 1 and scored[1][0] == scored[0][0]:
        raise InputError(theirs_dir, "", f"{scored[0][2]} and {scored[1][2]} match equally: choose one with --against DIR")
    return scored[0][2]


def _show(value: Any) -> str:
    if value == _ABSENT:
        return value
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


def format_comparisons(comparisons: list[FileComparison]) -> str:
    lines = []
    for c in comparisons:
        if c.ours is None:
            lines.append(f"{c.name}: only in theirs ({c.theirs})")
            continue
        if c.theirs is None:
            lines.append(f"{c.name}: only in ours ({c.ours})")
            continue
        real = [d for d in c.differences if not d.ignored]
        ignored = sorted({".".join(next(p for p in IGNORED if d.path[: len(p)] == p)) for d in c.differences
                          if d.ignored and _ignored(d.path)})
        note = f" (differs as intended in: {', '.join(ignored)})" if ignored else ""
        lines.append(f"{c.name}: {'same' if not real else f'{len(real)} difference(s)'}{note}")
        for d in c.differences:
            if d.ignored and d.path in WRITTEN_OUT and not _ignored(d.path):
                lines.append(f"  {d.key}: ours {_show(d.ours)}, theirs unset (written out: {WRITTEN_OUT[d.path][1]})")
        for d in real:
            lines.append(f"  {d.key}: ours {_show(d.ours)}, theirs {_show(d.theirs)}")
    return "\n".join(lines)
