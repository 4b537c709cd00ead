"""The tests mirror the tree: tests/<package>/test_<module>.py for src/servestack/<package>/, the slow path
in *_e2e.py files, and each test module standing alone.

Read from the source (the AST), not from a pytest run, so a file that fails to import is still judged."""

from __future__ import annotations

import ast
from pathlib import Path

from fixtures.paths import ROOT

TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "servestack"
# Beside the packages' folders: the command line's tests, the shared helpers, the recorded data.
NOT_A_PACKAGE = {"cli", "fixtures", "data"}


def modules_of_tests() -> list[Path]:
    """Every test module under tests/, the helpers' and data folders aside."""
    return sorted(p for p in TESTS.rglob("test_*.py") if not ({"fixtures", "data"} & set(p.relative_to(TESTS).parts)))


def marks_e2e(decorators: list[ast.expr]) -> bool:
    """Whether one of DECORATORS (or a pytestmark's value) is pytest.mark.e2e."""
    return any(ast.unparse(d).removeprefix("pytest.") == "mark.e2e" for d in decorators)


def module_marks(tree: ast.Module) -> list[ast.expr]:
    """The module's `pytestmark = ...` values, a list's items one by one."""
    values: list[ast.expr] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values.extend(node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value])
    return values


def e2e_marks(path: Path) -> dict[str, bool]:
    """Each test function of PATH (top level, or in a Test* class) by name: whether it is marked e2e."""
    tree = ast.parse(path.read_text(), filename=str(path))
    whole_module = marks_e2e(module_marks(tree))
    found: dict[str, bool] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            found[node.name] = whole_module or marks_e2e(node.decorator_list)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for method in node.body:
                if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and method.name.startswith("test"):
                    found[f"{node.name}.{method.name}"] = (whole_module or marks_e2e(node.decorator_list)
                                                           or marks_e2e(method.decorator_list))
    return found


def imported_modules(path: Path) -> list[str]:
    """Every module PATH imports, at any depth of its code, as written."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_every_folder_of_tests_names_a_package_of_servestack() -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - packages - NOT_A_PACKAGE == set()


def test_the_e2e_tests_and_only_they_are_in_e2e_files() -> None:
    misplaced = []
    for path in modules_of_tests():
        e2e_file = path.stem.endswith("_e2e")
        for name, e2e in e2e_marks(path).items():
            if e2e != e2e_file:
                misplaced.append(f"{path.relative_to(ROOT)}::{name} is {'' if e2e else 'not '}marked e2e")
    assert misplaced == []


def test_the_e2e_mark_is_read_where_it_is_written(tmp_path: Path) -> None:
    module = tmp_path / "test_marks.py"
    module.write_text("import pytest\nfrom pytest import mark\n\n"
                      "@pytest.mark.e2e\ndef test_decorated(): pass\n\n"
                      "@mark.e2e\n@pytest.mark.parametrize('x', [1])\ndef test_bare(x): pass\n\n"
                      "@pytest.mark.e2e\nclass TestAll:\n    def test_in_class(self): pass\n\n"
                      "@pytest.mark.slow\ndef test_fast(): pass\n")
    assert e2e_marks(module) == {"test_decorated": True, "test_bare": True,
                                                "TestAll.test_in_class": True, "test_fast": False}
    module.write_text("import pytest\npytestmark = [pytest.mark.usefixtures('x'), pytest.mark.e2e]\n\n"
                      "def test_one(): pass\n")
    assert e2e_marks(module) == {"test_one": True}


def test_no_test_module_imports_another() -> None:
    # What two test modules share lives in a conftest.py (fixtures) or in tests/fixtures/ (plain helpers):
    # an imported test module runs again under another name, and its helpers tie two files together.
    imports = []
    for path in modules_of_tests():
        imports += [f"{path.relative_to(ROOT)} imports {name}" for name in imported_modules(path)
                    if name.split(".")[-1].startswith("test_") or name.split(".")[-1] == "conftest"]
    assert imports == []
