"""The import closure: every module the serving entry points import at module level can be found.

Importing `dynamo.vllm` needs a GPU on a CUDA image, so in a CPU container the import section
reports `not run` and a missing dependency hides behind it (`redis`, imported at module level by
dynamo.vllm, was absent and only a GPU node found out). Reading the imports needs nothing: each
entry module's source is parsed, its module-level imports followed through the installed
packages, and each top-level module they name must be findable.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .report import FAIL, PASS, check, site_packages

GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True, kw_only=True)
class Unresolved:
    module: str
    imported_by: str  # file:line


def module_file(name: str, site: str) -> str | None:
    base = os.path.join(site, *name.split("."))
    for candidate in (os.path.join(base, "__init__.py"), base + ".py"):
        if os.path.isfile(candidate):
            return candidate
    return None


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    names = {getattr(h.type, "id", None) for h in handlers if h.type is not None}
    names |= {getattr(e, "id", None) for h in handlers if isinstance(h.type, ast.Tuple) for e in h.type.elts}
    return any(h.type is None for h in handlers) or bool(names & GUARDS)


def _type_checking(test: ast.AST) -> bool:
    return "TYPE_CHECKING" in ast.dump(test)


def module_level_imports(tree: ast.Module, package: str) -> list[tuple[str, int]]:
    """(absolute module, line) of each import that runs whenever the module loads: not in functions,
    not under an `if` (TYPE_CHECKING, a platform, a version), not in a `try` that catches the
    ImportError (an optional dependency)."""
    found: list[tuple[str, int]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                found.append((base, node.lineno))
                found.extend((f"{base}.{alias.name}", -node.lineno) for alias in node.names if alias.name != "*")
            elif isinstance(node, ast.If) and _type_checking(node.test):
                visit(node.orelse)  # `if TYPE_CHECKING: ... else: import X` runs the else
            elif isinstance(node, ast.Try) and not _guarded(node.handlers):
                visit(node.body)
            elif isinstance(node, ast.With):
                visit(node.body)
            # Any other `if` is a condition the scan cannot evaluate (a platform, a Python version, a
            # package being available): its imports are optional, as a guarded `try`'s are.

    visit(tree.body)
    return found


def default_available(site: str) -> Callable[[str], bool]:
    """A top-level module the interpreter can import: in site-packages, the standard library, or on its path."""
    def available(top: str) -> bool:
        if module_file(top, site) or os.path.isdir(os.path.join(site, top)) or top in sys.builtin_module_names:
            return True
        if top in getattr(sys, "stdlib_module_names", ()):
            return True
        return importlib.util.find_spec(top) is not None
    return available


def unresolved_imports(entries: list[str], site: str, available: Callable[[str], bool]) -> tuple[list[Unresolved], int]:
    """Follow module-level imports from the entry modules through the installed packages."""
    missing: dict[str, Unresolved] = {}
    seen: set[str] = set()
    queue = [(e, "the entry point") for e in entries]
    while queue:
        name, by = queue.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name, site)
        if path is None:
            top = name.split(".")[0]
            # setuptools and pip put their _vendor directory on sys.path before they import from it.
            vendored = os.path.exists(os.path.join(site, by.split("/")[0], "_vendor", top))
            if not vendored and not available(top) and top not in missing:
                missing[top] = Unresolved(module=top, imported_by=by)
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            try:
                tree = ast.parse(f.read())
            except SyntaxError:
                continue
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for imported, line in module_level_imports(tree, package):
            if line < 0 and module_file(imported, site) is None:
                continue  # `from X import name`: a name, not a submodule
            queue.append((imported, f"{os.path.relpath(path, site)}:{abs(line)}"))
    return sorted(missing.values(), key=lambda u: u.module), len(seen)


def check_import_closure(config: dict, available: Callable[[str], bool] | None = None) -> list[dict]:
    entries = config.get("import_closure") or []
    if not entries:
        return []
    site = site_packages(config)
    missing, walked = unresolved_imports(entries, site, available or default_available(site))
    label = "import-closure:" + ",".join(entries)
    if missing:
        return [check(label, FAIL, "imported at module level and not installed: " +
                      "; ".join(f"{u.module} (by {u.imported_by})" for u in missing))]
    return [check(label, PASS, f"{walked} modules reached from {', '.join(entries)}; every module-level import is installed")]
