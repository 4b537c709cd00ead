"""proc, the one place for external commands: bytes out kept apart from error output, secrets never logged."""

from __future__ import annotations

import sys

import pytest

from servestack.errors import CommandError
from servestack.util.console import console
from servestack.util.proc import output_bytes

WRITE = "import sys; sys.stderr.write('noise'); sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1] + bytes([0, 255]))"


def test_output_bytes_returns_stdout_bytes_untouched_by_stderr_and_hides_secrets(monkeypatch, capsys):
    monkeypatch.setattr(console, "verbose", True)  # `-v`: every command is shown
    out = output_bytes([sys.executable, "-c", WRITE], input=b"\x01abc", env={"API_TOKEN": "hunter2", "MODE": "x"})
    assert out == b"cba\x01\x00\xff"
    shown = capsys.readouterr().err
    assert shown.startswith("servestack.util.proc: $ API_TOKEN=*** MODE=x ")
    assert "hunter2" not in shown


def test_output_bytes_failure_names_the_command_and_its_error_output():
    with pytest.raises(CommandError, match=r"exited with 3:\nbad key") as failed:
        output_bytes([sys.executable, "-c", "import sys; print('out'); sys.stderr.write('bad key'); sys.exit(3)"])
    assert failed.value.returncode == 3
