"""How every machine service is started: detached, in the foreground, one starter at a time, with a deadline.

The one place servestack spawns a daemon (`spawn_detached`): each service module (dockerd,
registry, munge, slurm, and the cluster's pull registry) checks whether its daemon answers, and
only under `exclusive(name)` starts one and waits for it (`wait_until`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from servestack.errors import ServestackError
from servestack.util.project import state_home

BOOTSTRAP_HINT = "run .ci/bootstrap (as root) to install it"


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ServestackError(f"`{tool}` is not installed; {BOOTSTRAP_HINT}")
    return path


@contextlib.contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Serialise slow paths across processes: parallel tests/sessions must not start a
    service twice. Fast paths run without the lock and re-check under it."""
    path = state_home() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return f"last lines of {path}:\n" + "\n".join(text.strip().splitlines()[-lines:])


def spawn_detached(argv: Sequence[str], log_path: Path, user: str | None = None) -> subprocess.Popen[bytes]:
    """Start a long-lived daemon in its own session, stdout/stderr appended to log_path.

    Every daemon runs in the foreground (dockerd, registry, `munged -F`, `slurmctld -D`,
    `slurmd -D`): self-daemonising ones fork twice, and on machines whose PID 1 does not reap
    (containers, microVMs) each start would leave zombies behind. In the foreground the daemon
    is simply re-parented when we exit, and an early exit is visible to `wait_until`.
    Not through proc.run: that waits for the command to finish; a daemon must outlive us.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no controlling terminal, survives our exit/Ctrl-C
            close_fds=True,
            # A daemon outlives the checkout that started it: in a removed directory every process it
            # forks inherits a dangling cwd (slurmstepd then writes "Unable to get current working
            # directory" into each job's output).
            cwd="/",
            # A GitHub runner kills, at the end of each job, every process whose environment has the
            # job's RUNNER_TRACKING_ID: a shared daemon must not carry it, or each job restarts it.
            env={k: v for k, v in os.environ.items() if k != "RUNNER_TRACKING_ID"},
            user=user,
            group=pwd.getpwnam(user).pw_gid if user else None,
            extra_groups=[] if user else None,
        )


def wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    log_path: Path,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.1,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        # Our daemons stay in the foreground: any exit means they gave up.
        if proc is not None and proc.poll() is not None:
            raise ServestackError(f"{what} exited with {proc.returncode}\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ServestackError(f"{what} not ready after {timeout:.0f} s\n{log_tail(log_path)}")
        time.sleep(interval)
        interval = min(interval * 1.5, 1.0)


def daemon_pid(pidfile: Path, binary: str) -> int | None:
    """The pid in `pidfile` if that process runs `binary` now, else None.

    A pidfile outlives its daemon (a crash; a reboot, which keeps the state home but no process), and
    its number is then anyone's: only the process's executable says whether it is still our daemon.
    A zombie has none, so a daemon that has exited counts as gone before it is reaped. Another user's
    process does not show its executable: that is an error, not "gone", as the caller would start a
    second daemon or leave that one running.
    """
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        # A binary replaced since the daemon started (a package upgrade) reads "<path> (deleted)".
        running = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except PermissionError as error:
        raise ServestackError(f"{pidfile}: pid {pid} may be {binary}, but its executable cannot be read ({error}): "
                              "another user's process; stop it, or remove the pidfile if it is not the daemon") from error
    except OSError:
        return None
    return pid if running == os.path.realpath(binary) else None


def pid_alive(pidfile: Path, binary: str) -> bool:
    return daemon_pid(pidfile, binary) is not None


def kill_pidfile(pidfile: Path, binary: str) -> None:
    """SIGTERM to the daemon `pidfile` names, only if that pid still runs `binary`."""
    pid = daemon_pid(pidfile, binary)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)
