"""Drive one job to the end: skip finished points, retry what a fault interrupted, cancel on Ctrl-C.

- A point with `<out_dir>/<point>.json` on disk is never redone (resume across reruns).
- A job ending PREEMPTED, NODE_FAIL, TIMEOUT or CANCELLED (not by us) is resubmitted for its
  remaining points, up to `RetryPolicy.max_attempts` submissions in all.
- SIGINT/SIGTERM while a job is live: the job is cancelled (scancel for Slurm) before the
  process exits (KeyboardInterrupt for SIGINT, interrupts.Terminated for SIGTERM). A signal that
  arrives while a job is being submitted waits until its id is known, so no job is left behind.
- Whatever a job finished is collected even when it was interrupted, so a rerun skips it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from ..interrupts import raise_for
from .base import RETRYABLE, JobHandle, JobSpec, JobState, Runner

log = logging.getLogger("servestack.runners")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    retry_on: frozenset[JobState] = RETRYABLE
    backoff_s: float = 0.0


@dataclass
class Attempt:
    job_id: str
    points: tuple[str, ...]
    state: str
    seconds: float


@dataclass
class JobOutcome:
    spec: JobSpec
    attempts: list[Attempt] = field(default_factory=list)
    remaining: tuple[str, ...] = ()
    final_state: str = ""
    skipped: bool = False  # every point was already on disk

    @property
    def complete(self) -> bool:
        return not self.remaining

    def to_dict(self) -> dict:
        return {
            "name": self.spec.name,
            "recipe": self.spec.recipe_name,
            "points": list(self.spec.points),
            "attempts": [a.__dict__ for a in self.attempts],
            "remaining": list(self.remaining),
            "final_state": self.final_state,
            "skipped": self.skipped,
        }


class _Live:
    """The jobs this process has live, so a signal can cancel them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, tuple[Runner, JobHandle]] = {}
        self.deferring = 0  # > 0 while a submission is in flight (its job id is not known yet)
        self.pending: int | None = None  # a signal that arrived meanwhile

    @contextmanager
    def submitting(self) -> Iterator[None]:
        self.deferring += 1
        try:
            yield
        finally:
            self.deferring -= 1
            if not self.deferring and self.pending is not None:
                signum, self.pending = self.pending, None
                _on_signal(signum)

    def add(self, runner: Runner, handle: JobHandle) -> None:
        with self.lock:
            self.jobs[f"{runner.name}:{handle.job_id}"] = (runner, handle)

    def remove(self, runner: Runner, handle: JobHandle) -> None:
        with self.lock:
            self.jobs.pop(f"{runner.name}:{handle.job_id}", None)

    def cancel_all(self) -> list[str]:
        with self.lock:
            items = list(self.jobs.values())
            self.jobs.clear()
        done = []
        for runner, handle in items:
            try:
                handle.cancelled_by_us = True
                runner.cancel(handle)
                done.append(handle.job_id)
            except Exception as exc:  # keep cancelling the others
                log.error("could not cancel %s job %s: %s", runner.name, handle.job_id, exc)
        return done


LIVE = _Live()


def _on_signal(signum: int) -> None:
    ids = LIVE.cancel_all()
    if ids:
        log.warning("signal %s: cancelled job(s) %s", signum, ", ".join(ids))
    raise_for(signum)


@contextmanager
def cancel_on_signals() -> Iterator[None]:
    """While inside, SIGINT/SIGTERM cancel every live job first, then end the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        if LIVE.deferring:
            LIVE.pending = signum
            return
        _on_signal(signum)

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def run_job(runner: Runner, spec: JobSpec, policy: RetryPolicy = RetryPolicy(),
            timeout_s: float | None = None) -> JobOutcome:
    """Run `spec` until its points are on disk, or it ends in a non-retryable state, or attempts run out."""
    outcome = JobOutcome(spec)
    remaining = spec.remaining()
    if not remaining:
        outcome.skipped = True
        outcome.final_state = "SKIPPED"
        log.info("%s: every point already has a result, nothing to run", spec.name)
        return outcome
    with cancel_on_signals():
        for attempt in range(1, policy.max_attempts + 1):
            todo = spec.with_points(remaining)
            t0 = time.monotonic()
            with LIVE.submitting():
                handle = runner.submit(todo)
                LIVE.add(runner, handle)
            log.info("%s: attempt %d submitted as %s job %s for points %s",
                     spec.name, attempt, runner.name, handle.job_id, ",".join(remaining))
            interrupted = True
            try:
                state = runner.wait(handle, timeout=timeout_s)
                if not state.terminal:  # our own deadline passed
                    handle.cancelled_by_us = True
                    runner.cancel(handle)
                    state = JobState.TIMEOUT
                interrupted = False
            finally:
                LIVE.remove(runner, handle)
                try:
                    runner.collect(handle)  # keep what finished, interrupted or not
                except Exception as exc:
                    if not interrupted:
                        raise
                    log.warning("%s: could not collect job %s after the interruption: %s",
                                spec.name, handle.job_id, exc)
            outcome.attempts.append(Attempt(handle.job_id, remaining, state.value, round(time.monotonic() - t0, 2)))
            remaining = spec.remaining()
            outcome.final_state = state.value
            log.info("%s: job %s ended %s; %d point(s) remaining", spec.name, handle.job_id, state.value,
                     len(remaining))
            if not remaining:
                break
            retryable = state in policy.retry_on and not handle.cancelled_by_us
            if not retryable:
                break
            if attempt < policy.max_attempts and policy.backoff_s:
                time.sleep(policy.backoff_s)
    outcome.remaining = remaining
    return outcome
