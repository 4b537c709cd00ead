"""Ctrl-C and SIGTERM: both unwind the stack (so every `finally` removes its container or cancels
its job), and the command exits 130 for SIGINT and 143 for SIGTERM, as shells and CI runners expect."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

from servestack.errors import Terminated

# Once a signal has started the unwinding (removing containers, cancelling jobs), the next one would
# abort that cleanup halfway, and one always comes: nox sends SIGTERM 0.5 s after the terminal's
# Ctrl-C, a GitHub runner 7.5 s after its SIGINT. Signals this soon after the first are absorbed; a
# later one still ends the process (a cleanup that hangs), and nox's or the runner's kill is the backstop.
UNWIND_GRACE_S = 10.0


def exit_code(interrupt: KeyboardInterrupt) -> int:
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def raise_for(signum: int) -> None:
    raise Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt


@dataclass(kw_only=True)
class _Unwinding:
    """The one set of handlers installed by the outermost `signals_unwind`."""

    first_at: float | None = None  # when the signal that started the unwinding came
    holding: int = 0  # > 0 inside `held()`
    pending: int | None = None  # a signal that came while held

    def start(self, signum: int) -> None:
        self.first_at = time.monotonic()
        raise_for(signum)

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.first_at is not None and time.monotonic() - self.first_at < UNWIND_GRACE_S:
            # os.write, not print or logging: this runs between two bytecodes of whatever the main
            # thread is doing, which may be holding that very stream's lock.
            os.write(2, f"servestack: signal {signum} while cleaning up after the first; finishing the cleanup\n".encode())
            return
        if self.holding:
            # The first one decides the exit code: SIGINT then nox's SIGTERM still exits 130.
            if self.pending is None:
                self.pending = signum
            return
        self.start(signum)


_active: _Unwinding | None = None


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While inside (main thread only: signals are delivered there), SIGINT raises KeyboardInterrupt
    and SIGTERM raises Terminated (the first one: see UNWIND_GRACE_S); the previous dispositions come
    back on the way out. Nested uses (the CLI around smoke or the job driver) share the outermost
    one's handlers, so the grace holds however deep the first signal landed.

    SIGINT too, because Python raises KeyboardInterrupt only when it started with SIGINT at its
    default: a shell starts a background job (`cmd &` in a script) with SIGINT ignored, and then a
    SIGINT sent on purpose (a CI cancel, `kill -INT`, a test harness) did nothing at all while
    smoke's probe container stayed up until its readiness deadline, 300 s later. Whatever servestack
    started outside itself (containers, Slurm jobs) must go when it is told to stop."""
    global _active
    if threading.current_thread() is not threading.main_thread() or _active is not None:
        yield
        return
    _active = unwinding = _Unwinding()
    previous = {sig: signal.signal(sig, unwinding.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _active = None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A step that must not stop halfway: a signal that comes inside is raised when it ends.

    For submitting a job: interrupted before the scheduler's answer is read, the job would run on
    with nobody knowing its id to cancel it. Only inside `signals_unwind` (elsewhere Python's own
    SIGINT handler raises wherever it lands)."""
    unwinding = _active if threading.current_thread() is threading.main_thread() else None
    if unwinding is None:
        yield
        return
    unwinding.holding += 1
    try:
        yield
    finally:
        unwinding.holding -= 1
        if not unwinding.holding and unwinding.pending is not None:
            signum, unwinding.pending = unwinding.pending, None
            unwinding.start(signum)
