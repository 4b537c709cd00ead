"""Signals unwind the stack once: nested users share the outermost handlers (and so its grace for a
second signal), and a step that must not stop halfway holds a signal until it ends."""

from __future__ import annotations

import os
import signal
import time

import pytest

from servestack.util.interrupts import held, signals_unwind


def test_a_nested_unwind_keeps_the_grace_of_the_outer_one():
    """The CLI's signals_unwind around the job driver's (or smoke's): the first signal lands in the
    inner one, the second comes while the outer level still cleans up, and must not cut that short."""
    cleaned_up = []
    with pytest.raises(KeyboardInterrupt) as raised:
        with signals_unwind():
            try:
                with signals_unwind():
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(30)  # never reached: the handler raises at the next bytecode
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # nox's SIGTERM, 0.5 s after the Ctrl-C
                cleaned_up.append("container removed")
    assert type(raised.value) is KeyboardInterrupt
    assert cleaned_up == ["container removed"]


def test_a_signal_inside_held_is_raised_when_the_step_ends():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with signals_unwind():
            with held():
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("job submitted, id read")
            steps.append("after the step")
    assert steps == ["job submitted, id read"]


def test_the_first_signal_inside_held_is_the_one_raised():
    """Ctrl-C during a held step, then nox's SIGTERM: the command must still exit 130, not 143."""
    with pytest.raises(KeyboardInterrupt) as raised:
        with signals_unwind():
            with held():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
    assert type(raised.value) is KeyboardInterrupt


def test_the_previous_handlers_come_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with signals_unwind():
        with signals_unwind():
            pass
        assert signal.getsignal(signal.SIGINT) is not before[0]  # the outer one's handler stays
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
