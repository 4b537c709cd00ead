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
def sigterm_unwinds() -> Iterator[None]:
    """While inside (main thread only: signals are delivered there), SIGTERM raises Terminated."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: raise_for(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
