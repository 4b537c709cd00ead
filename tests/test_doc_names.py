"""Every module path the prose names exists: README.md, ARCHITECTURE.md, docs/ (when there is one), .ci/,
and the comments and docstrings of the noxfile and of every module under src/.

What counts as a module path, chosen to catch a renamed or moved module and to leave other projects' names
alone:
- a file path with at least one folder, `[\\w.-]+(/[\\w.-]+)*/name.py` (no `*`, `<...>` or `{...}` in it, and not
  the tail of a longer path or an absolute one): it names a file of this repository, found as the end of one's
  path (`stages/plan.py` matches src/servestack/stages/plan.py, `tests/test_x.py` only tests/test_x.py), unless
  it starts with a top folder of another project's tree (OTHER_TREES). A bare `name.py` is not judged: in
  prose it names vLLM's files as often as ours.
- a dotted name `servestack.a.b...`: it starts with a module of src/servestack/, and the name after the
  longest such start, if any, is defined at that module's top level (or is a module inside it). A name
  whose part after `servestack.` is a file's extension (`servestack.key`) is a file, not a module.
- a dotted name that ends in a constant, `module.NAME` or `package.module.NAME`: when the part before NAME is
  the end of a module's dotted name (`registry.RUNNERS`, `smoke.serving.DEFAULT_READY_TIMEOUT`), one such
  module defines NAME. Lowercase `module.name` in prose is as often an object's attribute, so it is not judged.

probe/prebuild.py is not read: its bytes key the prebuilt layer of the images, so its prose changes only with
a change that rebuilds that layer.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from fixtures.paths import ROOT

SRC = ROOT / "src"
NOT_READ = {SRC / "servestack" / "probe" / "prebuild.py"}

# The top folders of other projects' files that the prose names, each with whose tree it is.
OTHER_TREES = {
    "vllm": "vLLM", "v1": "vLLM", "engine": "vLLM", "config": "vLLM", "compilation": "vLLM",
    "torch": "PyTorch", "runtime": "Triton", "backends": "Triton",
    "flashinfer": "FlashInfer", "jit": "FlashInfer",
    "srtctl": "srt-slurm", "src/srtctl": "srt-slurm", "frontends": "srt-slurm",
    "dynamo": "Dynamo", "nixl": "NIXL", "aiohttp": "aiohttp",
    "a": "util/source_closure.py's example package a.b",
}
FILE_EXTENSIONS = {"key", "pub", "lock", "json", "yaml", "yml", "py", "toml", "md", "txt", "log", "sh", "whl"}

PATH = re.compile(r"(?<![\w./*<>{}$-])((?:[\w.-]+/)+[\w.-]*\.py)(?![\w/*])")
DOTTED = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w/(])")
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


def prose_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of what PATH says in words: a Python file's comments and docstrings, any other file whole."""
    text = path.read_text()
    if path.suffix != ".py":
        yield 1, text
        return
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


def prose_files() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "noxfile.py"]
    docs += sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file())
    docs += sorted(p for p in (ROOT / ".ci").rglob("*") if p.is_file())
    return docs + sorted(p for p in SRC.rglob("*.py") if p not in NOT_READ)


@cache
def project_files() -> tuple[str, ...]:
    """Every file of the checkout as a path from its root, hidden folders (.git, .nox) and build/ aside."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        at = Path(folder).relative_to(ROOT)
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and (at, d) != (Path("."), "build")]
        found += [f"/{(at / name).as_posix()}" for name in files]
    return tuple(found)


@cache
def modules() -> dict[str, Path]:
    """Every module of servestack by its dotted name, a package by its __init__.py."""
    found = {}
    for path in (SRC / "servestack").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def top_level_names(module: str) -> frozenset[str]:
    """What MODULE defines or imports at its top level (inside if/try too), and its submodules."""
    names = {sub.removeprefix(module + ".") for sub in modules() if sub.startswith(module + ".")}
    body = list(ast.parse(modules()[module].read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            body += node.body + node.orelse + getattr(node, "finalbody", [])
            body += [s for h in getattr(node, "handlers", []) for s in h.body]
    return frozenset(names)


def path_is_missing(path: str) -> bool:
    if any(path.startswith(folder + "/") for folder in OTHER_TREES):
        return False
    return not any(f.endswith("/" + path) for f in project_files())


def dotted_is_missing(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "servestack":
        if parts[1] in FILE_EXTENSIONS:
            return False
        known = [i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules()]
        if not known:
            return True
        module, rest = ".".join(parts[:known[-1]]), parts[known[-1]:]
        return bool(rest) and rest[0] not in top_level_names(module)
    if not CONSTANT.fullmatch(parts[-1]):
        return False
    owner = "." + ".".join(parts[:-1])
    candidates = [m for m in modules() if ("." + m).endswith(owner)]
    return bool(candidates) and not any(parts[-1] in top_level_names(m) for m in candidates)


def missing_names(path: Path, shown_as: str) -> list[str]:
    """Each name PATH's prose gives that does not exist, as `SHOWN_AS:line: name`."""
    missing = []
    for line, text in prose_of(path):
        for offset, chunk in enumerate(text.split("\n")):
            names = [p for p in PATH.findall(chunk) if path_is_missing(p)]
            names += [d for d in DOTTED.findall(chunk) if dotted_is_missing(d)]
            missing += [f"{shown_as}:{line + offset}: {name}" for name in names]
    return missing


def test_the_prose_names_only_module_paths_that_exist() -> None:
    missing = [name for path in prose_files() for name in missing_names(path, str(path.relative_to(ROOT)))]
    assert missing == [], "\n".join(missing)


def test_a_stale_name_is_found_and_another_project_s_or_a_file_s_is_not(tmp_path: Path) -> None:
    stale = ["stages/plan.py", "base/scripts.py", "servestack/foo.py", "tests/test_x.py", "src/servestack/foo.py",
             "registry.RUNNERS", "servestack.stages.plan", "servestack.runners.selection.NOT_THERE"]
    fine = ["stages/jobs.py", "src/servestack/debian/scripts.py", "tests/test_layout.py", "selection.RUNNERS",
            "runners.selection.RUNNERS", "servestack.runners.selection.RUNNERS", "servestack.util.fsutil",
            "servestack.key", "vllm/platforms/cuda.py", "tests/*_e2e.py", "/opt/venv/bin/python.py", "lock.check",
            "plan.py", "image.json", "build/dev-cpu/image.json"]
    doc = tmp_path / "doc.md"
    doc.write_text("".join(f"`{name}`, and {name}.\n" for name in stale + fine))
    assert missing_names(doc, "doc.md") == [f"doc.md:{line}: {name}" for line, name in enumerate(stale, 1)
                                            for _ in range(2)]
    module = tmp_path / "module.py"
    module.write_text('"""Planned in stages/plan.py."""\n\nX = "stages/plan.py"  # but registry.RUNNERS\n')
    assert missing_names(module, "module.py") == ["module.py:3: registry.RUNNERS", "module.py:1: stages/plan.py"]
