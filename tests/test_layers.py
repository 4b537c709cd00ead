"""The package reads as the flow: foundations at the bottom, steps above them, the command line on top.

Imports are read from the source (module level and inside functions alike), so a cycle cannot hide
behind a lazy import, and a lower module never reaches up into a higher one.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "servestack"

# Modules every other module may use, and which use nothing of servestack above them. They stay small
# and know no step of the flow.
FOUNDATION = {"errors", "settings", "util.console", "util.fsutil", "util.proc", "util.project", "util.interrupts", "records.imageref",
              "util.vllm_command", "util.yamlfile"}
# Code that runs inside images with the standard library only: it imports nothing of servestack.
STANDALONE = ("probe", "clients")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith(PACKAGE):
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_init(module: str, other: str) -> bool:
    # A package's __init__ re-exports its own modules; that edge is not a layer violation.
    return other.startswith(module + ".")


def test_there_is_no_import_cycle():
    graph = import_graph()
    pruned = {m: {t for t in ts if not _is_package_init(m, t)} for m, ts in graph.items()}
    assert _cycles(pruned) == []


def test_foundations_import_no_step_of_the_flow():
    graph = import_graph()
    assert {f"{PACKAGE}.{m}" for m in FOUNDATION} <= set(graph)  # a moved foundation is named where it is
    allowed = {f"{PACKAGE}.{m}" for m in FOUNDATION} | {PACKAGE}
    problems = {m: sorted(ts - allowed) for m, ts in graph.items()
                if m.removeprefix(f"{PACKAGE}.") in FOUNDATION and ts - allowed}
    assert problems == {}


def test_code_that_runs_inside_images_imports_nothing_of_servestack():
    graph = import_graph()
    problems = {m: sorted(t for t in ts if not t.startswith(m.rpartition(".")[0] or m))
                for m, ts in graph.items() if m.split(".")[1:2] and m.split(".")[1] in STANDALONE}
    assert {m: ts for m, ts in problems.items() if ts} == {}


def test_nothing_imports_the_command_line():
    graph = import_graph()
    assert sorted(m for m, ts in graph.items() if f"{PACKAGE}.cli" in ts and m != f"{PACKAGE}.__main__") == []
