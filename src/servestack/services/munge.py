"""munged, the authentication Slurm uses: its key, its runtime directories, the daemon as the munge user."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from servestack.services.daemons import exclusive, require, spawn_detached, wait_until
from servestack.util.fsutil import atomic_write_bytes
from servestack.util.proc import TimeoutExpired, run
from servestack.util.project import state_home

MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def _munge_ok() -> bool:
    """munged answers: a credential round-trips through munge | unmunge."""
    if not MUNGE_SOCKET.exists():
        return False
    try:
        cred = run(["munge", "-n"], check=False, timeout=5)
        if cred.returncode != 0:
            return False
        return run(["unmunge"], input=cred.stdout.encode(), check=False, timeout=5).returncode == 0
    except TimeoutExpired:
        return False


def _ensure_munge_key() -> None:
    """1024 random bytes, mode 0400, owned by munge (munged refuses looser permissions).

    A key of another size (Debian's postinst writes a 128-byte one) is replaced, but only while
    munged is down: changing the key under a running munged would break every credential.
    """
    try:
        if MUNGE_KEY.stat().st_size == 1024:
            return
    except FileNotFoundError:
        pass
    user = pwd.getpwnam("munge")
    atomic_write_bytes(MUNGE_KEY, os.urandom(1024))
    os.chown(MUNGE_KEY, user.pw_uid, user.pw_gid)
    os.chmod(MUNGE_KEY, 0o400)


def ensure_munge(timeout: float = 15.0) -> None:
    if _munge_ok():
        return
    munged = require("munged")
    with exclusive("munge"):
        if _munge_ok():
            return
        user = pwd.getpwnam("munge")
        # No systemd here to create the runtime dirs (tmpfiles.d): make them, owned by munge.
        for d, mode in ((MUNGE_SOCKET.parent, 0o755), (Path("/var/log/munge"), 0o700), (Path("/var/lib/munge"), 0o711)):
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, user.pw_uid, user.pw_gid)
            os.chmod(d, mode)
        _ensure_munge_key()
        log_path = state_home() / "munged.log"
        # munged runs as the munge user, as its systemd unit does.
        # --force: remove a stale socket left by an earlier munged that died.
        proc = spawn_detached([munged, "--foreground", "--force"], log_path, user="munge")
        wait_until(_munge_ok, what="munged", timeout=timeout, log_path=log_path, proc=proc)
