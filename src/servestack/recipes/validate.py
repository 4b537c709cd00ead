"""Validate srt-slurm recipes (v1 layout and the 2.0 `schema: 2` layout) before they reach a cluster.

Checks, each reported as an InputError naming file:line:column and the key path:
  * keys: unknown or misspelled keys (with the closest known key suggested), required keys;
  * types: ints, bools, strings, mappings, lists where srt-slurm expects them;
  * arithmetic: workers x GPUs per worker fit nodes x GPUs per node; a worker spanning nodes uses
    whole nodes; the engine's tensor x pipeline x data parallel sizes equal the GPUs per worker;
    expert-parallel sizes divide them;
  * benchmark concurrencies: srt-slurm's "64x128x256" string or a list; positive integers,
    ascending, no duplicates;
  * engine flags: every vLLM flag and VLLM_* environment variable exists in the engine version the
    stack locks (pins/<stack>.engine.json), with the closest spelling suggested;
  * image binding: recipes rendered by servestack carry either the unbound placeholder or a
    `repo@sha256:<64 hex>` reference (never a tag), and a bound one names the same image in
    identity.container.image and records the stack's lock sha256 in its header.

Recipes in srt-slurm's override form (`base:` + `override_*` / `zip_override_*`) and sweep form
(`sweep:` with `{placeholder}` values) are understood: placeholders are not type-checked.

The flow of one file: parse with positions (yamlfile), structure (structure.py: keys, types,
required keys, concurrencies), the override variants (variants.py), then per complete recipe the
arithmetic (topology.py) and the engine's flags and environment (flags.py); last the image binding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from servestack.errors import InputError, Location
from servestack.recipes import schema as S
from servestack.recipes.engine_cli import EngineSpec, load_engine
from servestack.recipes.runnable import check_runnable
from servestack.recipes.structure import Checker
from servestack.recipes.topology import check_recipe
from servestack.recipes.variants import expand_overrides
from servestack.records.imageref import ImageRef
from servestack.util.yamlfile import Node, parse

UNBOUND_IMAGE = "servestack-unbound"
RENDER_MARK = "# Rendered by servestack"
_STACK_COMMENT = re.compile(r"^# stack: ([A-Za-z0-9_.-]+)\s*$", re.M)


image_ref_problem = ImageRef.problem


def header_stack(text: str) -> str | None:
    """The stack a rendered recipe names in its header comment (`# stack: S`), if any."""
    m = _STACK_COMMENT.search("".join(line + "\n" for line in text.splitlines() if line.startswith("#")))
    return m.group(1) if m else None


def _binding(c: Checker, root: Node, header: str) -> None:
    model = root.get("model")
    cont = model.get("container") if model is not None and model.is_map else None
    if cont is None:
        return
    ref = cont.value
    if ref == UNBOUND_IMAGE:
        return
    problem = image_ref_problem(ref)
    if problem:
        c.err(cont, ("model", "container"), problem)
        return
    ident = root.get("identity")
    image = None
    ident_container = ident.get("container") if ident is not None and ident.is_map else None
    if ident_container is not None and ident_container.is_map:
        image = ident_container.get("image")
    if image is None or image.value != ref:
        c.err(image or ident or cont, ("identity", "container", "image"), f"must name the same image as model.container ({ref})")
    if not re.search(r"^# lock-sha256: [0-9a-f]{64}$", header, re.M):
        c.err(None, ("lock-sha256",), "a bound recipe must record the stack's lock sha256 in its header ('# lock-sha256: <64 hex>')")


def validate_text(text: str, file: Path | str, engine: EngineSpec | None = None, *, require_digest: bool | None = None,
                  notes: list[str] | None = None, warnings: list[InputError] | None = None,
                  platforms: tuple[str, ...] = (), judged: bool = False) -> list[InputError]:
    """Every problem of one recipe; `notes`, when given, receives what could not be checked and why,
    `warnings` what runs but costs; `platforms` are the image's (linux/arm64, ...), when known; `judged`:
    the engine judges the resolved roles (judge.py), so the static cross-role rules stand down."""
    file = str(file)
    try:
        root = parse(text, file)
    except InputError as e:
        return [e]
    if not root.is_map:
        return [InputError(Location(file=file, line=root.line, column=root.column), "", "a recipe must be a YAML mapping")]
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    if require_digest is None:
        require_digest = text.startswith(RENDER_MARK)
    benchmark = root.get("benchmark")
    sweep = root.get("sweep") is not None or "zip_override_" in text or (
        benchmark is not None and benchmark.is_map and benchmark.get("sweep") is not None)
    c = Checker(file, engine, sweep)
    c.platforms = platforms
    c.judged = judged

    if "base" in root.value:
        base, spec, required, variants = expand_overrides(c, root)
        for name, variant in variants:
            c.variant = "" if name == "base" else f"[{name}]"
            c.walk(variant, spec, ())
            c.required(variant, required)
            check_recipe(c, variant)
            check_runnable(c, variant)
        c.variant = ""
        recipe = base
    else:
        schema_node = root.get("schema")
        if schema_node is not None and schema_node.value not in (1, 2):
            c.err(schema_node, ("schema",), f"unsupported recipe schema {schema_node.value!r} (srt-slurm knows 1 and 2)")
            return c.errors
        v2 = schema_node is not None and schema_node.value == 2
        spec = S.TOP_V2 if v2 else S.TOP_V1
        c.walk(root, spec, ())
        c.required(root, S.REQUIRED_V2 if v2 else S.REQUIRED_V1)
        check_recipe(c, root)
        check_runnable(c, root)
        recipe = root
    if require_digest and recipe.is_map:
        _binding(c, recipe, header)
    # de-duplicate (an override can re-report its base)
    seen: set[str] = set()
    out: list[InputError] = []
    for error in c.errors:
        if str(error) not in seen:
            seen.add(str(error))
            out.append(error)
    if notes is not None:
        notes.extend(n for n in c.notes if n not in notes)
    if warnings is not None:
        warnings.extend(w for w in c.warnings if str(w) not in {str(x) for x in warnings})
    return out


EngineChoice = Callable[[Path, str], EngineSpec]


_FAMILY = re.compile(r"^family:", re.M)


def is_family(text: str) -> bool:
    """A recipe family (recipes/families/*.yaml: `family:` + `configs:`), which renders recipes and is none."""
    return bool(_FAMILY.search(text)) and re.search(r"^configs:", text, re.M) is not None


def recipe_files(paths: Iterable[Path | str]) -> list[Path]:
    """The recipe files named or under the directories named; a directory's recipe families are not recipes
    (`recipes check` renders and checks them)."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and q.is_file())
            out.extend(q for q in found if not is_family(q.read_text(errors="replace")))
        else:
            out.append(p)
    return out


def validate_paths(paths: Iterable[Path | str], engine: EngineSpec | Path | str | EngineChoice | None = None, *,
                   require_digest: bool | None = None, notes: list[str] | None = None,
                   warnings: list[InputError] | None = None,
                   platforms: Callable[[Path, str], tuple[str, ...]] | None = None,
                   judged: frozenset[Path] = frozenset()) -> list[InputError]:
    """Validate recipe files (directories are searched for *.yaml/*.yml). Returns every error found.

    `engine` is an EngineSpec, the path of a pins/<stack>.engine.json, or a function choosing one per
    file from its path and text (raising InputError when it cannot); None checks no engine flags.
    `require_digest`: True demands an unbound placeholder or a digest in model.container; None (the
    default) demands it of files rendered by servestack only. `warnings` receives what runs but costs;
    `platforms` names the platforms of the image each file runs (its stack's), for the hardware check.
    """
    fixed = load_engine(engine) if isinstance(engine, (str, Path)) else engine
    errors: list[InputError] = []
    for f in recipe_files(paths):
        try:
            text = f.read_text()
        except OSError as e:
            errors.append(InputError(f, "", f"cannot read: {e}"))
            continue
        spec: EngineSpec | None
        if fixed is None or isinstance(fixed, EngineSpec):
            spec = fixed
        else:
            try:
                spec = fixed(f, text)
            except InputError as e:
                errors.append(e)
                continue
        errors.extend(validate_text(text, f, spec, require_digest=require_digest, notes=notes, warnings=warnings,
                                    platforms=platforms(f, text) if platforms else (), judged=f in judged))
    return errors
