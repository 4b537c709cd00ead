"""qemu-aarch64 through binfmt_misc: the kernel runs linux/arm64 binaries (arm64 rootfs builds, arm64 probes,
the arm64 prebuilt layer's compile)."""

from __future__ import annotations

from pathlib import Path

from servestack.errors import CommandError, ServestackError
from servestack.services.daemons import BOOTSTRAP_HINT, exclusive
from servestack.util.proc import run

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
# Debian 13's qemu-user-binfmt, in systemd-binfmt's format (`:name:type:offset:magic:mask:interpreter:flags`).
# Nothing here runs systemd, so servestack writes it to the kernel itself.
CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")


def _registered() -> dict[str, str]:
    """The kernel's entry: {"state": "enabled", "interpreter": ..., "flags": ...}, or {} when there is none."""
    try:
        lines = (BINFMT_DIR / "qemu-aarch64").read_text().splitlines()
    except OSError:
        return {}
    entry = {"state": lines[0].strip()} if lines else {}
    for line in lines[1:]:
        key, _, value = line.replace(":", " ", 1).partition(" ")
        entry[key] = value.strip()
    return entry


def _wanted() -> tuple[str, str, str]:
    """(the whole registration line, its interpreter, its flags) from the installed qemu-user-binfmt."""
    try:
        line = CONF.read_text().strip()
    except OSError:
        raise ServestackError(f"qemu-user-binfmt's entry {CONF} is missing; {BOOTSTRAP_HINT}") from None
    fields = line.split(line[0])
    if len(fields) != 8:
        raise ServestackError(f"{CONF}: expected one `:name:type:offset:magic:mask:interpreter:flags` line, got {line!r}")
    return line, fields[6], fields[7]


def _current(wanted: tuple[str, str, str]) -> bool:
    entry = _registered()
    return (entry.get("state") == "enabled" and entry.get("interpreter") == wanted[1]
            and set(entry.get("flags", "")) == set(wanted[2]))


def ensure_binfmt_aarch64() -> None:
    """The kernel runs linux/arm64 binaries through the installed qemu-aarch64, with the F (fix-binary) flag, so
    it also works inside containers whose filesystem has no qemu.

    An entry registered by an older qemu is replaced: with F, the kernel keeps the binary it opened at
    registration, so an upgraded package alone leaves the old emulator running (Debian 12's 7.2 crashes in
    the arm64 image's `import torch`).
    """
    wanted = _wanted()
    if _current(wanted):
        return
    with exclusive("binfmt"):
        if _current(wanted):
            return
        if not (BINFMT_DIR / "register").exists():
            try:
                run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], timeout=10)
            except CommandError as e:
                raise ServestackError(f"cannot mount binfmt_misc at {BINFMT_DIR} (needs root/privileges): {e}") from e
        try:
            if _registered():
                (BINFMT_DIR / "qemu-aarch64").write_text("-1")
            (BINFMT_DIR / "register").write_text(wanted[0])
        except OSError as e:
            raise ServestackError(f"cannot register {CONF} in {BINFMT_DIR} (needs root/privileges): {e}") from e
        if not _current(wanted):
            raise ServestackError(f"qemu-aarch64 is not registered in {BINFMT_DIR} as {CONF} says, after writing it")
