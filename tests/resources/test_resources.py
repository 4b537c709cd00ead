"""The shell programs servestack ships are files that shellcheck reads, and each one is used by name."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack import resources

SCRIPTS = sorted(Path(resources.__file__).parent.glob("*.sh"))


def test_there_are_shell_programs_to_check():
    assert {p.name for p in SCRIPTS} >= {resources.PREFLIGHT, resources.PIN_WORKER_CPUS, resources.PYXIS_IMPORTER}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_shell_program_passes_shellcheck_as_the_shell_its_first_line_names(script: Path):
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not on PATH: it is the Debian package .ci/bootstrap installs")
    shell = re.match(r"#!/bin/(ba)?sh\b", script.read_text())
    assert shell, f"{script.name}: its first line names neither /bin/bash nor /bin/sh"
    found = subprocess.run([shellcheck, "-s", "bash" if shell.group(1) else "sh", str(script)],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, f"{script.name}:\n{found.stdout}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_shell_program_is_executable_and_read_by_some_module(script: Path):
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    readers = [p for p in (ROOT / "src" / "servestack").rglob("*.py") if script.name in p.read_text()]
    assert readers, f"no module of servestack names {script.name}: delete it, or read it with resources.script"
