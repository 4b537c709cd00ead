"""The console is the one way servestack talks to the user: progress and results on stdout, warnings,
errors and what `-v` adds on stderr, progress silent where a step runs inside another."""

from __future__ import annotations

import ast

from fixtures.paths import ROOT
from servestack.util.console import console

SRC = ROOT / "src" / "servestack"
OWNER = SRC / "util" / "console.py"


def _imports_servestack(tree: ast.Module) -> bool:
    return any((isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "servestack")
               or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "servestack" for a in node.names))
               for node in ast.walk(tree))


def _speaks_on_its_own(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"print() on line {node.lineno}")
        if isinstance(node, ast.Import) and any(a.name == "logging" for a in node.names):
            found.append(f"import logging on line {node.lineno}")
    return found


def test_nothing_in_servestack_prints_or_logs_but_the_console():
    # A file that imports nothing of servestack is a program of its own (the in-image probe and
    # clients, the engine's and srt-slurm's drivers): it runs in another interpreter and writes
    # its own output, which servestack reads.
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if path != OWNER and _imports_servestack(tree) and (found := _speaks_on_its_own(tree)):
            offenders[str(path.relative_to(SRC))] = found
    assert offenders == {}


def test_the_rule_sees_a_print_and_a_logger():
    tree = ast.parse("import logging\nfrom servestack import settings\nprint('hi')\n")
    assert _imports_servestack(tree) and _speaks_on_its_own(tree) == ["import logging on line 1", "print() on line 3"]


def test_progress_and_results_go_to_stdout_warnings_and_errors_to_stderr(capsys):
    console.progress("smoke s: pulling x ...")
    console.result("image s: sha256:ab reproduced the expected digest")
    console.warning("servestack.image", "push of sha256:cd failed")
    console.error("servestack lock", "no such stack")
    shown = capsys.readouterr()
    assert shown.out == "smoke s: pulling x ...\nimage s: sha256:ab reproduced the expected digest\n"
    assert shown.err == "servestack.image: push of sha256:cd failed\nservestack lock: no such stack\n"


def test_quiet_silences_progress_only(capsys):
    with console.quiet():
        console.progress("smoke s: pulling x ...")
        with console.quiet():
            console.progress("nested")
        console.progress("still quiet")
        console.result("said anyway")
        console.warning("servestack.smoke", "a container stopped")
    console.progress("heard again")
    shown = capsys.readouterr()
    assert shown.out == "said anyway\nheard again\n"
    assert shown.err == "servestack.smoke: a container stopped\n"


def test_details_are_shown_with_verbose_only(capsys, monkeypatch):
    console.detail("servestack.util.proc", "$ git status")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(console, "verbose", True)
    console.detail("servestack.util.proc", "$ git status")
    assert capsys.readouterr().err == "servestack.util.proc: $ git status\n"


def test_a_survived_failure_is_shown_with_its_traceback(capsys):
    try:
        raise OSError("disk full")
    except OSError as failure:
        console.warning("servestack.image", "writing layers early failed", failure=failure)
    first, *trace = capsys.readouterr().err.splitlines()
    assert first == "servestack.image: writing layers early failed"
    assert trace[0] == "Traceback (most recent call last):" and trace[-1] == "OSError: disk full"
