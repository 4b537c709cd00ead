"""qemu-aarch64 through binfmt_misc: the kernel runs linux/arm64 binaries (arm64 rootfs builds, arm64 probes)."""

from __future__ import annotations

from pathlib import Path

from servestack.errors import CommandError, ServestackError
from servestack.services.daemons import BOOTSTRAP_HINT, exclusive, require
from servestack.util.proc import run

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


def _qemu_aarch64_enabled() -> bool:
    try:
        return (BINFMT_DIR / "qemu-aarch64").read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        return False


def ensure_binfmt_aarch64() -> None:
    """The kernel runs linux/arm64 binaries through qemu-aarch64 (for arm64 rootfs builds).

    Registered with the F (fix-binary) flag by Debian's qemu-user-static, so it also works
    inside containers whose filesystem has no qemu.
    """
    if _qemu_aarch64_enabled():
        return
    with exclusive("binfmt"):
        if _qemu_aarch64_enabled():
            return
        if not (BINFMT_DIR / "register").exists():
            try:
                run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], timeout=10)
            except CommandError as e:
                raise ServestackError(f"cannot mount binfmt_misc at {BINFMT_DIR} (needs root/privileges): {e}") from e
        update = require("update-binfmts")
        if not Path("/usr/share/binfmts/qemu-aarch64").exists():
            raise ServestackError(f"qemu-user-static's binfmt entry is missing; {BOOTSTRAP_HINT}")
        # --import registers in the admin db (/var/lib/binfmts) and the kernel; --enable covers
        # an entry that was imported before binfmt_misc was mounted (e.g. during apt install).
        run([update, "--import", "qemu-aarch64"], check=False, timeout=10)
        if not _qemu_aarch64_enabled():
            run([update, "--enable", "qemu-aarch64"], timeout=10)
        if not _qemu_aarch64_enabled():
            raise ServestackError(f"qemu-aarch64 not enabled in {BINFMT_DIR} after update-binfmts --enable")
