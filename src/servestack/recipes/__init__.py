"""srt-slurm recipes: families rendered to recipe files, validated, and bound to an image digest.

Public API (cli.py wires these to `servestack render` and friends):

    render_recipes(project, stack, image_ref, lock=None, *, lock_sha256=None, out_dir=None) -> list[Path]
    render_committed(project, stacks=None) -> list[Path]
    check_rendered(project, stacks=None) -> list[InputError]
    validate_paths(paths, engine=None, *, require_digest=None) -> list[InputError]
    validate_committed(project) -> list[InputError]
    engine.describe() -> dict ; load_engine(path) -> EngineSpec
"""

from __future__ import annotations

from ..errors import InputError
from ..project import Project
from .engine import EngineSpec, describe, load_engine
from .render import Family, check_rendered, families, load_family, render_committed, render_family, render_recipes
from .validate import UNBOUND_IMAGE, image_ref_problem, validate_paths, validate_text


def engine_file(project: Project, stack: str):
    return project.pins / f"{stack}.engine.json"


def validate_committed(project: Project) -> list[InputError]:
    """Validate every committed family's recipes against the engine its stack locks."""
    errors: list[InputError] = []
    for fpath in families(project):
        family = load_family(fpath)
        eng = engine_file(project, family.stack)
        errors += validate_paths([project.recipes / family.name], eng if eng.exists() else None, require_digest=True)
    return errors


__all__ = [
    "EngineSpec", "Family", "InputError", "UNBOUND_IMAGE", "check_rendered", "describe", "engine_file",
    "image_ref_problem", "load_engine", "load_family", "render_committed", "render_family", "render_recipes",
    "validate_committed", "validate_paths", "validate_text",
]
