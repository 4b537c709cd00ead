"""The layout says the flow: ARCHITECTURE.md's table is the tree, and no import reaches back up it.

Every import counts, the ones inside a function body included: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "servestack"
APART = "apart"  # the in-image packages: they import nothing of ours; anything may read them
MAX_LINES = 450


def _table() -> list[tuple[str, str]]:
    """(layer, package) from ARCHITECTURE.md, lowest first; `util/` and `errors.py` both as `util`, `errors`."""
    rows = re.findall(r"^\| (\w+) \| `([\w./]+?)/?` \|", (ROOT / "ARCHITECTURE.md").read_text(), re.M)
    return [(layer, name.removesuffix(".py")) for layer, name in rows]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> list[tuple[str, int, str]]:
    """(importer, line, imported module) for every import of ours anywhere in a module."""
    out = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                target = ".".join(base + ([node.module] if node.module else []))
                out += [(name, node.lineno, f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target)
                        for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "servestack":
                out += [(name, node.lineno, f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                         else node.module) for a in node.names]
            elif isinstance(node, ast.Import):
                out += [(name, node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "servestack"]
    return out


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_architecture_md_lists_every_package_and_top_level_module_once():
    listed = [name for _layer, name in _table()]
    on_disk = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert sorted(listed) == sorted(set(listed)), "ARCHITECTURE.md lists a package twice"
    assert set(listed) == on_disk, (f"in the tree, not in ARCHITECTURE.md: {sorted(on_disk - set(listed))}; "
                                    f"in ARCHITECTURE.md, not in the tree: {sorted(set(listed) - on_disk)}")


def test_no_import_reaches_a_later_package():
    rank = {name: i for i, (_layer, name) in enumerate(_table())}
    apart = {name for layer, name in _table() if layer == APART}
    modules = _modules()
    upward = []
    for importer, line, imported in _imports(modules):
        mine, theirs = _package(importer), _package(imported)
        if mine in apart:
            if theirs != mine:
                upward.append(f"{modules[importer].relative_to(ROOT)}:{line} imports {imported} (in-image code imports only itself)")
        elif theirs and theirs not in apart and rank[theirs] > rank[mine]:
            upward.append(f"{modules[importer].relative_to(ROOT)}:{line} imports {imported}, "
                          f"which ARCHITECTURE.md places after {mine}")
    assert not upward, "\n".join(upward)


def test_the_module_graph_has_no_cycles():
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, _line, imported in _imports(modules):
        if imported in modules and imported != importer:
            graph[importer].add(imported)
    # A package's __init__ importing its own submodules is how a step names its parts, not a cycle.
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_no_two_modules_of_the_library_share_a_name():
    apart = {name for layer, name in _table() if layer == APART}
    seen: dict[str, list[str]] = defaultdict(list)
    for module, path in _modules().items():
        if _package(module) not in apart and path.name not in ("__init__.py", "__main__.py"):
            seen[path.stem].append(str(path.relative_to(PACKAGE)))
    assert {stem: where for stem, where in seen.items() if len(where) > 1} == {}


def test_no_python_file_in_the_repository_is_over_450_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines"
            for p in sorted(ROOT.glob("**/*.py")) if not {".nox", ".venv", "build", ".git"} & set(p.relative_to(ROOT).parts)
            for n in [len(p.read_text().splitlines())] if n > MAX_LINES]
    assert not long, "\n".join(long)


def test_the_readme_names_the_steps_in_the_architecture_s_order():
    steps = [name for layer, name in _table() if layer == "step"]
    flow = re.search(r"^The steps, in order: (.*)$", (ROOT / "README.md").read_text(), re.M)
    assert flow, "README.md has no line `The steps, in order: ...`"
    assert re.findall(r"`(\w+)/`", flow.group(1)) == steps
