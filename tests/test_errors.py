"""Every failure a user can see is a class in `servestack/errors.py`, and its class says the exit code.

One module owns the errors so that a script reading our exit code, the README's table and the code
raising the error cannot drift apart: a new error is added there, with a code that means one thing.
"""

from __future__ import annotations

import ast
import builtins
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from servestack import cli, errors
from servestack.errors import PublishError, ServestackError, VerdictFailed

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "servestack"
ERRORS = PACKAGE / "errors.py"
# Run inside containers with the standard library only, and report to their caller, not to a user.
IN_IMAGE = ("probe", "clients")
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}


def _host_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if p.relative_to(PACKAGE).parts[0] not in IN_IMAGE]


def _base_names(node: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}


def _exception_classes() -> dict[str, list[tuple[Path, ast.ClassDef]]]:
    """Every class that derives from an exception, by name: from a builtin one, a third-party one
    (named `...Error`), or one of these, found by repeating until nothing new is found."""
    classes = [(path, node) for path in _host_modules() for node in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(node, ast.ClassDef)]
    known = set(BUILTIN_EXCEPTIONS)
    while True:
        more = {node.name for _, node in classes if node.name not in known
                and any(b in known or b.endswith("Error") for b in _base_names(node))}
        if not more:
            break
        known |= more
    found: dict[str, list[tuple[Path, ast.ClassDef]]] = {}
    for path, node in classes:
        if node.name in known - BUILTIN_EXCEPTIONS:
            found.setdefault(node.name, []).append((path, node))
    return found


def _user_errors() -> list[type[ServestackError]]:
    return [value for value in vars(errors).values()
            if isinstance(value, type) and issubclass(value, ServestackError)]


def test_every_exception_class_of_the_library_is_defined_in_errors_py():
    """Outside errors.py, an exception class may only be a module's private control flow: named with a
    leading underscore and raised and caught in that one module, so no user ever sees it."""
    elsewhere = []
    for name, places in _exception_classes().items():
        for path, node in places:
            if path == ERRORS:
                continue
            private = name.startswith("_") and not any(
                re.search(rf"\b{name}\b", other.read_text()) for other in _host_modules() if other != path)
            if not private:
                elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}: class {name}")
    assert not elsewhere, "define these in src/servestack/errors.py and import them from there:\n" + "\n".join(elsewhere)


def test_errors_py_imports_nothing_of_ours():
    """Every module raises these, so errors.py stands below all of them."""
    imported = [node for node in ast.walk(ast.parse(ERRORS.read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                and any(name.startswith("servestack") for name in
                        ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]))]
    assert imported == []


def _exit_code_assignments() -> dict[str, ast.expr]:
    """class name -> the expression its body assigns to `exit_code`."""
    out = {}
    for node in ast.parse(ERRORS.read_text()).body:
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                        and getattr(statement.targets[0], "id", None) == "exit_code"):
                    out[node.name] = statement.value
    return out


def test_each_error_owns_its_exit_code_or_borrows_one_by_name():
    """A class owns a code (a number no other class writes) or says it means the same as another
    (`exit_code = InputError.exit_code`); VerdictFailed's code is its verdict's."""
    assigned = _exit_code_assignments()
    owned: dict[int, str] = {}
    for error in _user_errors():
        if error is VerdictFailed:
            assert error.__name__ not in assigned
            continue
        value = assigned.get(error.__name__)
        assert value is not None, f"{error.__name__} says no exit_code of its own"
        if isinstance(value, ast.Constant):
            assert value.value not in owned, f"{error.__name__} and {owned.get(value.value)} both own {value.value}"
            owned[value.value] = error.__name__
        else:
            assert isinstance(value, ast.Attribute) and value.attr == "exit_code", ast.unparse(value)
            assert error.exit_code == getattr(errors, ast.unparse(value.value)).exit_code
    assert not set(owned) & set(errors.VERDICT_EXIT_CODES.values()), "a verdict's code is only a verdict's"
    assert {VerdictFailed(v, v).exit_code for v in errors.VERDICT_EXIT_CODES} == set(errors.VERDICT_EXIT_CODES.values())
    assert all(0 < code < 126 for code in owned), "126 and up are the shell's and the signals'"


def _readme_exit_codes() -> dict[int, set[str]]:
    section = (ROOT / "README.md").read_text().split("### Exit codes\n", 1)[1].strip().split("\n\n", 1)[0]
    table: dict[int, set[str]] = {}
    for row in section.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for code in cells[0].split(","):
            table[int(code)] = set(re.findall(r"`(\w+)`", cells[2]))
    return table


def test_the_readme_and_the_docstring_table_say_what_errors_py_does():
    table = _readme_exit_codes()
    for error in _user_errors():
        failing = [code for code in errors.VERDICT_EXIT_CODES.values() if code]
        codes = failing if error is VerdictFailed else [error.exit_code]
        for code in codes:
            assert error.__name__ in table.get(code, set()), f"README: {error.__name__} under code {code}"
        assert error.__name__ in (errors.__doc__ or ""), f"errors.py's docstring table lacks {error.__name__}"
    named = set().union(*table.values())
    assert named == {e.__name__ for e in _user_errors()}, "README names a class errors.py does not define"
    assert set(table) == {e.exit_code for e in _user_errors()} | set(errors.VERDICT_EXIT_CODES.values()) | {130, 143}


class _NoSuchImage(BaseHTTPRequestHandler):
    """A registry that has nothing: every GET and HEAD is 404."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def empty_registry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoSuchImage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_pulling_an_image_the_registry_lacks_exits_with_the_publish_error_code(tmp_path, empty_registry, capsys):
    """The code comes from the class raised deep in the library, turned into an exit code in cli.main."""
    (tmp_path / "pins").mkdir()
    key = tmp_path / "servestack.pub"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    image = f"{empty_registry}/servestack/dev-cpu@sha256:{'0' * 64}"
    code = cli.main(["--project", str(tmp_path), "pull", image, "--key", str(key), "--out", str(tmp_path / "out")])
    assert code == PublishError.exit_code == 10
    assert capsys.readouterr().err.startswith(f"servestack pull: {image}: no such manifest in {empty_registry}")
    assert not (tmp_path / "out").exists()
