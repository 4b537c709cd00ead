"""Ctrl-C and SIGTERM: both unwind the stack (so every `finally` removes its container or cancels
its job), and the command exits 130 for SIGINT and 143 for SIGTERM, as shells and CI runners expect."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

# Once a signal has started the unwinding (removing containers, cancelling jobs), the next one would
# abort that cleanup halfway, and one always comes: nox sends SIGTERM 0.5 s after the terminal's
# Ctrl-C, a GitHub runner 7.5 s after its SIGINT. Signals this soon after the first are absorbed; a
# later one still ends the process (a cleanup that hangs), and nox's or the runner's kill is the backstop.
UNWIND_GRACE_S = 10.0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like KeyboardInterrupt so the same cleanup runs."""


def exit_code(interrupt: KeyboardInterrupt) -> int:
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def raise_for(signum: int) -> None:
    raise Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While inside (main thread only: signals are delivered there), SIGINT raises KeyboardInterrupt
    and SIGTERM raises Terminated (the first one: see UNWIND_GRACE_S); the previous dispositions come
    back on the way out.

    SIGINT too, because Python raises KeyboardInterrupt only when it started with SIGINT at its
    default: a shell starts a background job (`cmd &` in a script) with SIGINT ignored, and then a
    SIGINT sent on purpose (a CI cancel, `kill -INT`, a test harness) did nothing at all while
    smoke's probe container stayed up until its readiness deadline, 300 s later. Whatever servestack
    started outside itself (containers, Slurm jobs) must go when it is told to stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def handler(signum: int, _frame) -> None:
        if first and time.monotonic() - first[0] < UNWIND_GRACE_S:
            # os.write, not print or logging: this runs between two bytecodes of whatever the main
            # thread is doing, which may be holding that very stream's lock.
            os.write(2, f"servestack: signal {signum} while cleaning up after the first; finishing the cleanup\n".encode())
            return
        first.append(time.monotonic())
        raise_for(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
