"""The source files that code runs, found from its imports: what a cache key made of code must cover.

A cache entry made by code (an image in the registry's cache, an assembled Debian base) is only reusable
by the same code. Naming that code by hand drifts: a module that starts to decide bytes (a table moved
into `platforms.py`) stays out of a hand-kept list, and a cached image made under the old table is taken
for the new one. So the code is the closure of a step's imports, read from the source, every import
counted (one inside a function, one only for type checking): a module it may run is one it may depend on.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from servestack.util.fsutil import canonical_json, sha256_bytes, sha256_file

PACKAGE = "servestack"
HOME = Path(__file__).resolve().parents[1]  # src/servestack


def module_file(name: str, *, home: Path = HOME) -> Path | None:
    """The file of module NAME (`servestack.image.build`) under HOME, or None where NAME is no module of ours."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = home.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(path: Path, name: str) -> set[str]:
    """Every dotted name PATH's imports may load: `from a import b` may load a, and a.b where b is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _with_parents(name: str) -> list[str]:
    """Importing a.b.c runs a/__init__.py and a/b/__init__.py first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(roots: Iterable[str], *, home: Path = HOME) -> dict[str, Path]:
    """Module name -> file for ROOTS and everything of ours they import, transitively."""
    seen: dict[str, Path] = {}
    pending = [parent for root in roots for parent in _with_parents(root)]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = module_file(name, home=home)
        if path is None:
            continue
        seen[name] = path
        pending.extend(parent for imported in _imported_names(path, name) for parent in _with_parents(imported))
    return dict(sorted(seen.items()))


def closure_hash(roots: Iterable[str], *, home: Path = HOME) -> str:
    """One sha256 naming the bytes of every file in the closure of ROOTS, by path under HOME."""
    files = {path.relative_to(home).as_posix(): sha256_file(path) for path in closure(roots, home=home).values()}
    return sha256_bytes(canonical_json(files).encode())
