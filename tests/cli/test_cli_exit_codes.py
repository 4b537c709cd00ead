"""The command line's exit code says what kind of failure it was, so scripts and CI can tell them apart:
1 a check failed, 2 bad input, 3 a remote service unreachable, 130 Ctrl-C, 143 SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servestack import cli
from servestack.errors import InputError, NetworkError, ServestackError


@pytest.fixture
def failing_command(monkeypatch):
    def install(exc: BaseException):
        def fail(args, project):
            raise exc
        monkeypatch.setitem(cli.COMMANDS, "lock", (cli.COMMANDS["lock"][0], cli.COMMANDS["lock"][1], fail))
    return install


@pytest.mark.parametrize(("exc", "code"), [
    (ServestackError("a check failed"), 1),
    (InputError("pins/x.yaml", "packages[0].version", "expected a version"), 2),
    (NetworkError("registry: could not reach 127.0.0.1:5000"), 3),
    (KeyboardInterrupt(), 130),
])
def test_each_kind_of_failure_has_its_exit_code(tmp_path, failing_command, capsys, exc, code):
    (tmp_path / "pins").mkdir()
    failing_command(exc)
    assert cli.main(["--project", str(tmp_path), "lock"]) == code
    assert capsys.readouterr().err.startswith("servestack lock: ")


@pytest.mark.parametrize(("sig", "inherited", "said"), [
    ("SIGTERM", signal.SIG_DFL, "terminated"),
    ("SIGINT", signal.SIG_DFL, "interrupted"),
    # A shell starts a background job (`cmd &` in a script) with SIGINT ignored; a SIGINT sent to it
    # on purpose (a CI cancel, a test harness) must still unwind: smoke's containers would stay up.
    ("SIGINT", signal.SIG_IGN, "interrupted"),
], ids=["SIGTERM", "SIGINT", "SIGINT-inherited-ignored"])
def test_a_signal_exits_128_plus_it_after_unwinding(tmp_path, sig, inherited, said):
    """A real signal to a real process: `finally` blocks run, and the exit code is 128 + the signal."""
    (tmp_path / "pins").mkdir()
    marker = tmp_path / "cleaned-up"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from servestack import cli
        def slow(args, project):
            try:
                os.kill(os.getpid(), signal.{sig})
                time.sleep(30)
            finally:
                open({str(marker)!r}, "w").close()
        cli.COMMANDS["lock"] = (cli.COMMANDS["lock"][0], cli.COMMANDS["lock"][1], slow)
        code = cli.main(["--project", {str(tmp_path)!r}, "lock"])
        after = signal.getsignal(signal.SIGINT)
        print("SIGINT after:", "ignored" if after == signal.SIG_IGN else getattr(after, "__name__", after))
        sys.exit(code)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert f"servestack lock: {said}" in proc.stderr
    assert marker.exists()
    # The disposition it started with is back once the command has unwound.
    expected = "ignored" if inherited == signal.SIG_IGN else "default_int_handler"
    assert f"SIGINT after: {expected}\n" in proc.stdout


@pytest.mark.parametrize(("grace", "cleaned_up", "code"), [(10.0, True, 130), (0.2, False, 143)],
                         ids=["within-the-grace", "after-the-grace"])
def test_a_second_signal_lets_the_cleanup_finish_unless_it_comes_late(tmp_path, grace, cleaned_up, code):
    """Ctrl-C under nox: the SIGINT starts the cleanup, nox's SIGTERM 0.5 s later must not cut it short
    (a container would stay up); a signal after the grace still ends a cleanup that hangs."""
    (tmp_path / "pins").mkdir()
    marker = tmp_path / "cleaned-up"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from servestack import cli
        from servestack.util import interrupts
        interrupts.UNWIND_GRACE_S = {grace}
        def slow(args, project):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            finally:
                time.sleep(0.4)  # removing a container takes a while
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.4)
                open({str(marker)!r}, "w").close()
        cli.COMMANDS["lock"] = (cli.COMMANDS["lock"][0], cli.COMMANDS["lock"][1], slow)
        sys.exit(cli.main(["--project", {str(tmp_path)!r}, "lock"]))
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == code, proc.stderr
    assert marker.exists() == cleaned_up
    assert ("finishing the cleanup" in proc.stderr) == cleaned_up
