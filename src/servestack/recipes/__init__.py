"""srt-slurm recipes: families rendered to recipe files, validated, compared, and bound to an image digest.

Public API (cli.py wires these to `servestack recipes ...`):

    render_recipes(project, stack, image_ref, lock=None, *, lock_sha256=None, out_dir=None) -> list[Path]
    render_committed(project, stacks=None) -> list[Path]
    check_rendered(project, stacks=None) -> list[InputError]
    validate_paths(paths, engine=None, *, require_digest=None) -> list[InputError]
    validate_files(project, paths, *, engine=None, stack=None) -> Validation   # the stack's engine, per file
    validate_committed(project) -> list[InputError]
    check_before_run(paths, project=None) -> warnings   # raises InputErrors: runners and pull call it
    compare_dirs(ours_dir, theirs_dir) -> list[FileComparison]
    engine.describe() -> dict ; load_engine(path) -> EngineSpec
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from servestack.errors import InputError, InputErrors
from servestack.recipes.engine_check import StandIn, judge_files
from servestack.recipes.engine_cli import EngineSpec, describe, load_engine
from servestack.recipes.render import (
    Family,
    check_rendered,
    committed_sets,
    families,
    load_family,
    render_committed,
    render_family,
    render_recipes,
)
from servestack.recipes.semantic_diff import FileComparison, closest_set, compare_dirs, format_comparisons
from servestack.recipes.validate import (
    UNBOUND_IMAGE,
    header_stack,
    image_ref_problem,
    recipe_files,
    validate_paths,
    validate_text,
)
from servestack.util.project import DEFAULT_STACK, Project, variant_of


def engine_file(project: Project, stack: str) -> Path:
    return project.pins / f"{variant_of(stack)[0]}.engine.json"


class _Engines:
    """Engine descriptions, each read once, chosen per recipe file."""

    def __init__(self, project: Project, engine: Path | None, stack: str | None):
        self.project, self.engine, self.stack = project, engine, stack
        self.cache: dict[Path, EngineSpec] = {}
        self.used: dict[Path, Path] = {}  # recipe file -> engine description
        self.stacks: dict[str, tuple[str, ...]] = {}  # stack -> its image's platforms

    def load(self, path: Path) -> EngineSpec:
        if path not in self.cache:
            self.cache[path] = load_engine(path)
        return self.cache[path]

    def __call__(self, recipe: Path, text: str) -> EngineSpec:
        if self.engine is not None:
            path = self.engine
        else:
            stack = self.stack or header_stack(text) or DEFAULT_STACK
            path = engine_file(self.project, stack)
            if not path.exists():
                raise InputError(recipe, "", f"no engine description for stack {stack!r} ({path} is missing): "
                                             "pass --stack or --engine, or generate it with servestack.recipes.engine_cli")
        spec = self.load(path)
        self.used[recipe] = path
        return spec

    def platforms(self, recipe: Path, text: str) -> tuple[str, ...]:
        """The platforms of the image a recipe runs: its stack's, when the recipe names its stack or the
        caller does (another's recipe, e.g. NVIDIA's, runs its own image: only its name can say)."""
        stack = self.stack or header_stack(text)
        file = self.project.pins / f"{stack}.yaml"
        if stack is None or not file.exists():
            return ()
        if stack not in self.stacks:
            from servestack.records.stack import load_stack

            self.stacks[stack] = tuple(load_stack(file).platforms)
        return self.stacks[stack]


@dataclass(frozen=True, kw_only=True)
class Validation:
    errors: list[InputError]
    engines: dict[Path, Path]  # each recipe file -> the engine description its flags were checked against
    notes: list[str]  # what was not checked, and why (e.g. an sglang backend against a vLLM description)
    warnings: list[InputError] = field(default_factory=list)  # what runs but costs (queued, outside CUDA graphs)


def validate_files(project: Project, paths: list[Path], *, engine: Path | None = None, stack: str | None = None,
                   require_digest: bool | None = None, judge: bool = True,
                   standin: StandIn | None = None,
                   prejudged: tuple[list[InputError], frozenset[Path], list[str]] | None = None) -> Validation:
    """Validate recipe files, every one against an engine description, never none.

    The description is `engine` when given, else the stack's pins/<stack>.engine.json, the stack
    being `stack` when given, else the one the recipe's header names (`# stack: S`, as servestack
    renders it), else the default stack.
    """
    engines = _Engines(project, engine, stack)
    notes: list[str] = []
    warnings: list[InputError] = []
    judged_errors: list[InputError] = []
    judged: frozenset[Path] = frozenset()
    if prejudged is not None:  # judged with other files already (validate_committed: every stack at once)
        mine = set(recipe_files(paths))
        judged_errors, judged = [e for e in prejudged[0] if Path(e.location.file) in mine], prejudged[1] & mine
        notes += prejudged[2]
    elif judge:  # srt-slurm and the stack's engine resolve and judge each role (engine_check.py), where the image is
        def engine_of(recipe: Path, text: str) -> EngineSpec | None:
            try:
                return engines(recipe, text)
            except InputError:
                return None

        def stack_of(recipe: Path, text: str) -> str:
            return stack or header_stack(text) or DEFAULT_STACK

        judged_errors, judged = judge_files(project, recipe_files(paths), stack_of, engine_of, standin, notes)
    errors = validate_paths(paths, engines, require_digest=require_digest, notes=notes, warnings=warnings,
                            platforms=engines.platforms, judged=judged)
    return Validation(errors=errors + judged_errors, engines=dict(engines.used), notes=notes, warnings=warnings)


def check_before_run(paths: list[Path], project: Project | None = None) -> list[InputError]:
    """Validate recipes about to run (a runner's, a pulled bundle's) as `recipes validate` does: raises
    InputErrors with every error, returns the warnings. A recipe whose stack has no engine description
    here (a bundle pulled outside a checkout) is still checked for everything but the engine's rules."""
    project = project or Project.find(Path(paths[0]).resolve().parent if paths else None)
    engines = _Engines(project, None, None)

    def choose(recipe: Path, text: str) -> EngineSpec | None:
        try:
            return engines(recipe, text)
        except InputError:
            return None

    warnings: list[InputError] = []
    errors = validate_paths(paths, choose, warnings=warnings, platforms=engines.platforms)  # type: ignore[arg-type]
    if errors:
        raise InputErrors(errors)
    return warnings


def validate_committed(project: Project, *, notes: list[str] | None = None, standin: StandIn | None = None,
                       judge: bool = True) -> list[InputError]:
    """Validate every committed family's recipes against the engine its stack locks (judged by srt-slurm and
    the engine where the stack's image is here); `notes` receives what was judged and what was not."""
    errors: list[InputError] = []
    sets = {project.recipes / load_family(fpath).name: load_family(fpath).stack for fpath in families(project)}
    prejudged = None
    if judge:  # every stack's recipes judged at once (a container per stack), then each set validated
        stack_of = {f: stack for d, stack in sets.items() for f in recipe_files([d])}
        engines = _Engines(project, None, None)

        def engine_of(recipe: Path, text: str) -> EngineSpec | None:
            return engines.load(engine_file(project, stack_of[recipe]))

        judge_notes: list[str] = []
        judged_errors, judged = judge_files(project, list(stack_of), lambda f, _: stack_of[f], engine_of, standin,
                                            judge_notes)
        prejudged = (judged_errors, judged, judge_notes)
    for directory, stack in sets.items():
        result = validate_files(project, [directory], stack=stack, require_digest=True, judge=judge, standin=standin,
                                prejudged=prejudged and (prejudged[0], prejudged[1], []))
        errors += result.errors
        if notes is not None:
            notes.extend(result.notes)
    if notes is not None and prejudged is not None:
        notes.extend(prejudged[2])
    return errors


__all__ = [
    "UNBOUND_IMAGE",
    "EngineSpec",
    "Family",
    "FileComparison",
    "InputError",
    "Validation",
    "check_before_run",
    "check_rendered",
    "closest_set",
    "committed_sets",
    "compare_dirs",
    "describe",
    "engine_file",
    "format_comparisons",
    "image_ref_problem",
    "load_engine",
    "load_family",
    "render_committed",
    "render_family",
    "render_recipes",
    "validate_committed",
    "validate_files",
    "validate_paths",
    "validate_text",
]
