"""tests/fixtures/children.py: an e2e test's child never outlives it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from fixtures.children import stop, stopped_on_exit

SLEEP = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]


def test_a_child_that_ignores_sigterm_is_killed_once_the_grace_runs_out() -> None:
    # SIG_IGN is set before exec and survives it, so the child ignores SIGTERM from its first instruction.
    child = subprocess.Popen(SLEEP, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    assert child.stdout.readline() == "started\n"
    out, err = stop(child, grace_s=0.5)  # SIGTERM then communicate(timeout) alone raised TimeoutExpired here
    assert child.returncode == -signal.SIGKILL
    assert (out, err) == ("", "")


def test_a_child_gets_sigterm_first() -> None:
    child = subprocess.Popen(SLEEP, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout.readline() == "started\n"
    stop(child, grace_s=30)
    assert child.returncode == -signal.SIGTERM


def test_an_interrupted_wait_stops_the_child() -> None:
    child = subprocess.Popen(SLEEP, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout.readline() == "started\n"
    with pytest.raises(KeyboardInterrupt), stopped_on_exit(child, grace_s=30):
        raise KeyboardInterrupt  # as a Ctrl-C during communicate() would
    assert child.returncode == -signal.SIGTERM
