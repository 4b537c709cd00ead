"""Ctrl-C and SIGTERM: both unwind the stack (so every `finally` removes its container or cancels
its job), and the command exits 130 for SIGINT and 143 for SIGTERM, as shells and CI runners expect."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like KeyboardInterrupt so the same cleanup runs."""


def exit_code(interrupt: KeyboardInterrupt) -> int:
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def raise_for(signum: int) -> None:
    raise Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While inside (main thread only: signals are delivered there), SIGINT raises KeyboardInterrupt
    and SIGTERM raises Terminated; the previous dispositions come back on the way out.

    SIGINT too, because Python raises KeyboardInterrupt only when it started with SIGINT at its
    default: a shell starts a background job (`cmd &` in a script) with SIGINT ignored, and then a
    SIGINT sent on purpose (a CI cancel, `kill -INT`, a test harness) did nothing at all while
    smoke's probe container stayed up until its readiness deadline, 300 s later. Whatever servestack
    started outside itself (containers, Slurm jobs) must go when it is told to stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: raise_for(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
