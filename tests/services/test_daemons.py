"""A pidfile is trusted only while its pid runs the daemon's binary: after a crash or a reboot the
number may be any process's, and servestack must neither call that process the daemon nor signal it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from servestack.errors import ServestackError
from servestack.services.daemons import daemon_pid, kill_pidfile, pid_alive

SLEEP = shutil.which("sleep")
DAEMON = shutil.which("cat")  # stands for slurmctld: any binary that is not sleep's


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([SLEEP, "300"])
    yield proc
    proc.kill()
    proc.wait()


def _pending_signals(pid: int) -> int:
    """The signals sent to `pid` that it has not handled yet, shared and per-thread, as one mask."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


def _pidfile(tmp_path: Path, pid: int) -> Path:
    path = tmp_path / "daemon.pid"
    path.write_text(f"{pid}\n")
    return path


def test_a_pidfile_naming_an_unrelated_process_is_not_the_daemon_and_it_is_not_signalled(tmp_path, sleeper):
    pidfile = _pidfile(tmp_path, sleeper.pid)
    assert not pid_alive(pidfile, DAEMON)
    kill_pidfile(pidfile, DAEMON)
    # A signal sent is either pending still (a fatal one as SIGKILL to each thread) or acted on.
    assert sleeper.poll() is None and _pending_signals(sleeper.pid) == 0


def test_the_daemon_is_alive_and_stopped_by_its_pidfile(tmp_path, sleeper):
    pidfile = _pidfile(tmp_path, sleeper.pid)
    link = tmp_path / "sleep-link"  # as /usr/sbin/slurmctld is a link to slurmctld-wlm
    link.symlink_to(SLEEP)
    assert pid_alive(pidfile, SLEEP) and pid_alive(pidfile, str(link))
    kill_pidfile(pidfile, str(link))
    assert sleeper.wait(timeout=10) == -15


def test_an_exited_daemon_is_gone_before_it_is_reaped(tmp_path, sleeper):
    pidfile = _pidfile(tmp_path, sleeper.pid)
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie: not reaped
    os.kill(sleeper.pid, 0)  # the pid still answers signal 0 ...
    assert not pid_alive(pidfile, SLEEP)  # ... but it runs nothing


@pytest.mark.parametrize("content", [None, "", "not a pid\n", "0\n", "-1\n"])
def test_a_missing_or_unreadable_pidfile_names_no_daemon(tmp_path, content):
    pidfile = tmp_path / "daemon.pid"
    if content is not None:
        pidfile.write_text(content)
    assert not pid_alive(pidfile, SLEEP)
    kill_pidfile(pidfile, SLEEP)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to look as another user at root's process")
def test_another_users_process_in_the_pidfile_is_an_error_naming_pidfile_pid_and_binary(sleeper):
    # The sleeper is root's; a forked child that became nobody cannot read its /proc/<pid>/exe.
    directory = Path(tempfile.mkdtemp())
    try:
        directory.chmod(0o755)
        pidfile = _pidfile(directory, sleeper.pid)
        pidfile.chmod(0o644)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                try:
                    answer = f"pid {daemon_pid(pidfile, SLEEP)}"
                except ServestackError as error:
                    answer = f"error {error}"
                os.write(write, answer.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            answer = pipe.read()
        os.waitpid(child, 0)
    finally:
        shutil.rmtree(directory)
    assert answer.startswith(f"error {pidfile}: pid {sleeper.pid} may be {SLEEP}, but its executable cannot be read"), answer
