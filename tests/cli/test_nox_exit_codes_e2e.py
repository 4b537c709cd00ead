"""`nox -s <session>` ends with servestack's own exit code (README, "Exit codes"), not nox's 1 for every
failure: a script running the README's commands can tell bad input (2) from a check that failed (1).

One session's virtualenv (lock: the package alone), reused when it is there; each command is refused
before it reads a lock, so the test costs the install and a few seconds."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fixtures.paths import ROOT
from servestack.errors import InputError, ServestackError


def _nox(*args: str) -> subprocess.CompletedProcess:
    assert shutil.which("nox"), "nox is not on PATH (.ci/bootstrap installs it)"
    return subprocess.run(["nox", "-s", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)


@pytest.mark.e2e
def test_nox_ends_with_the_code_servestack_exits_with():
    typo = _nox("lock", "--", "--check", "--stack", "qwen35-gb20")
    assert typo.returncode == InputError.exit_code == 2, typo.stdout[-3000:]
    assert "no such stack (did you mean qwen35-gb200?); stacks are: dev-cpu, qwen35-gb200" in typo.stdout
    assert "Traceback" not in typo.stdout

    misuse = _nox("lock", "--", "--online")  # a check of the options that fails: 1, not bad input
    assert misuse.returncode == ServestackError.exit_code == 1, misuse.stdout[-3000:]
    assert "--online goes with --check" in misuse.stdout

    # The sessions after a failed one do not run: they need its records.
    chain = _nox("lock", "build", "--", "--stack", "qwen35-gb20")
    assert chain.returncode == 2, chain.stdout[-3000:]
    assert "Running session build" not in chain.stdout
