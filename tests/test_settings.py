"""Configuration has one owner: `servestack.settings` names every SERVESTACK_* variable the library reads.

README.md's configuration table is what users read, so it must say what settings.py says; and a
variable read anywhere else would be one the table cannot vouch for.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from servestack import settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "servestack"
# The in-image packages run with the standard library only, so they read their variables themselves.
NOT_HOST_SIDE = ("probe", "clients")
TABLE_HEADER = "| variable | default | meaning |"


def _readme_table() -> dict[str, tuple[str | None, str]]:
    """README.md's configuration table: variable -> (default, meaning); a default of `none` is None."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert TABLE_HEADER in lines, f"README.md has no configuration table (a header line `{TABLE_HEADER}`)"
    rows = {}
    for line in lines[lines.index(TABLE_HEADER) + 2:]:
        if not line.startswith("|"):
            break
        name, default, meaning = (cell.strip() for cell in line.strip("|").split(" | ", 2))
        rows[name.strip("`")] = (None if default == "none" else default.strip("`"), meaning)
    return rows


def test_the_readme_table_lists_every_setting_with_its_default_and_meaning():
    readme = _readme_table()
    ours = {s.name: (s.default, s.meaning) for s in settings.SETTINGS.values()}
    differences = [f"{name}: not in README.md's table" for name in ours.keys() - readme.keys()]
    differences += [f"{name}: in README.md's table, not in settings.py" for name in readme.keys() - ours.keys()]
    for name in sorted(ours.keys() & readme.keys()):
        for column, theirs, mine in zip(("default", "meaning"), readme[name], ours[name], strict=True):
            if theirs != mine:
                differences.append(f"{name}: README.md's {column} is {theirs!r}, settings.py's {mine!r}")
    assert not differences, "\n".join(sorted(differences))


def test_each_package_index_has_its_own_variable_under_one_row():
    assert settings.index_variable("pytorch-cpu") == "SERVESTACK_INDEX_PYTORCH_CPU"
    assert settings.setting("SERVESTACK_INDEX_PYTORCH_CPU").name == "SERVESTACK_INDEX_<NAME>"
    # The Debian archive is an index with a meaning of its own (an archive, not a PEP 503 index).
    assert settings.setting("SERVESTACK_INDEX_DEBIAN").name == "SERVESTACK_INDEX_DEBIAN"


def test_a_value_is_read_when_asked_for_and_a_default_starts_at_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SERVESTACK_CACHE", raising=False)
    assert settings.value("SERVESTACK_CACHE") == f"{tmp_path}/.cache/servestack"
    monkeypatch.setenv("SERVESTACK_CACHE", "/elsewhere")
    assert settings.value("SERVESTACK_CACHE") == "/elsewhere"
    monkeypatch.delenv("SERVESTACK_SRTCTL", raising=False)
    assert settings.value("SERVESTACK_SRTCTL") == ""  # no default: unset reads as empty


def test_an_override_lasts_for_its_block_only(monkeypatch):
    monkeypatch.delenv("SERVESTACK_CACHE", raising=False)
    with settings.overriding("SERVESTACK_CACHE", "/scratch"):
        assert settings.value("SERVESTACK_CACHE") == "/scratch"
    assert "SERVESTACK_CACHE" not in os.environ


def test_a_variable_missing_from_the_table_cannot_be_read():
    with pytest.raises(KeyError, match="SERVESTACK_UNDOCUMENTED is not in servestack.settings.SETTINGS"):
        settings.value("SERVESTACK_UNDOCUMENTED")


def _host_side_modules() -> list[Path]:
    skipped = NOT_HOST_SIDE
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if p.relative_to(PACKAGE).parts[0] not in skipped and p != PACKAGE / "settings.py"]


def _names_for_servestack_variables(trees: list[ast.Module]) -> set[str]:
    """Constants and functions anywhere in the library that stand for a SERVESTACK_* name
    (`SRTCTL_ENV = "SERVESTACK_SRTCTL"`, `def env_name(index): return "SERVESTACK_INDEX_" + ...`)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _names_a_variable(node.value):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.FunctionDef):
                returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
                if any(_names_a_variable(r) for r in returns):
                    names.add(node.name)
    return names


def _names_a_variable(expr: ast.AST) -> bool:
    """A string, or a string built from one, that starts with a SERVESTACK_ name (not a dict of them)."""
    while isinstance(expr, ast.BinOp):
        expr = expr.left
    if isinstance(expr, ast.JoinedStr) and expr.values:
        expr = expr.values[0]
    return isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value.startswith("SERVESTACK_")


def _mentions_servestack(expr: ast.AST, names: set[str]) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("SERVESTACK_"):
            return True
        if (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute) and node.attr in names):
            return True
    return False


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _environ_keys(tree: ast.Module) -> list[tuple[int, ast.AST]]:
    """(line, key) of each os.environ[key], os.environ.get/pop/setdefault(key), os.getenv(key), key in os.environ."""
    keys = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            keys.append((node.lineno, node.slice))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) and (
                (_is_environ(node.func.value) and node.func.attr in ("get", "pop", "setdefault"))
                or (node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os")):
            keys.append((node.lineno, node.args[0]))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            keys.append((node.lineno, node.left))
    return keys


def test_no_module_but_settings_reads_a_servestack_variable_from_the_environment():
    modules = _host_side_modules()
    trees = {path: ast.parse(path.read_text(), str(path)) for path in modules}
    aliases = _names_for_servestack_variables(list(trees.values()))
    found = [f"{path.relative_to(ROOT)}:{line}: a SERVESTACK_ variable in os.environ; go through servestack.settings"
             for path, tree in trees.items()
             for line, key in _environ_keys(tree) if _mentions_servestack(key, aliases)]
    assert not found, "\n".join(found)
