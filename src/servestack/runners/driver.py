"""Drive one job to the end: skip finished points, retry what a fault interrupted, cancel on Ctrl-C.

- A point with `<out_dir>/<point>.json` on disk is never redone (resume across reruns).
- A job ending in a state of `RetryPolicy.retry_on` (default `interface.RETRYABLE`), unless we cancelled
  it, is resubmitted for its remaining points, up to `RetryPolicy.max_attempts` submissions in all.
- SIGINT/SIGTERM while a job is live (`interrupts.signals_unwind`, the project's one handling of
  them): the unwinding cancels the job (scancel for Slurm) before the process exits
  (KeyboardInterrupt for SIGINT, errors.Terminated for SIGTERM), and a second signal within
  UNWIND_GRACE_S does not cut that cancel short. A signal that arrives while a job is being
  submitted waits until its id is known (`interrupts.held`), so no job is left behind.
- Whatever a job finished is collected even when it was interrupted, so a rerun skips it.
- Every live job is also recorded on disk (`<jobs dir>/live/<runner>-<job id>.json`) until it
  ends, so another process can cancel what a killed one left behind (`cancel_recorded`: the CI
  backstop, since a runner that is not answered within seconds kills the process outright).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from servestack.errors import Terminated
from servestack.runners.interface import RETRYABLE, JobHandle, JobSpec, JobState, Runner
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_json
from servestack.util.interrupts import held, signals_unwind


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 3
    retry_on: frozenset[JobState] = RETRYABLE
    backoff_s: float = 0.0


@dataclass(kw_only=True)
class Attempt:
    job_id: str
    points: tuple[str, ...]
    state: str
    seconds: float
    # Where the job ran, from a runner that can tell (SrtctlRunner.placement): {"nodes": {role: node},
    # "kv_transfers": {...}}; empty otherwise.
    placement: dict = field(default_factory=dict)


@dataclass(kw_only=True)
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
            **({"preflight": self.spec.preflight.to_json()} if self.spec.preflight else {}),
        }


LIVE_DIR = "live"


def _record_live(runner: Runner, handle: JobHandle) -> None:
    try:
        atomic_write_json(_record_path(runner, handle), {
            "runner": runner.name, "job_id": handle.job_id, "name": handle.spec.name, "pid": os.getpid(),
            "pid_started": process_started(os.getpid())})
    except OSError as exc:  # the in-process cancel still works; only the backstop loses this job
        console.warning("servestack.runners", f"could not record live {runner.name} job {handle.job_id}: {exc}")


def _record_path(runner: Runner, handle: JobHandle) -> Path:
    return handle.spec.jobs_dir / LIVE_DIR / f"{runner.name}-{handle.job_id}.json"


@dataclass(frozen=True, kw_only=True)
class RecordedJob:
    """A job some process had live when it last looked (see `_record_live`)."""

    path: Path
    runner: str
    job_id: str
    name: str
    pid: int
    pid_started: int | None = None


def recorded_jobs(root: Path) -> list[RecordedJob]:
    """Every live-job record under `root` (a run directory), oldest job first."""
    found = []
    for path in sorted(root.rglob(f"{LIVE_DIR}/*.json")) if root.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            started = data.get("pid_started")
            found.append(RecordedJob(path=path, runner=str(data["runner"]), job_id=str(data["job_id"]), name=str(data.get("name", "")),
                                     pid=int(data.get("pid", 0)), pid_started=int(started) if started is not None else None))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            console.warning("servestack.runners", f"{path}: unreadable live-job record ({exc}); skipped")
    return found


def process_started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22); None if it is gone.

    A pid and its start time name one process for good: a pid reused by another process after the
    recorded owner died has another start time. A process that exited and waits for its parent to
    reap it (a zombie) runs no more: it is gone too, or the backstop would wait out its grace on it.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count from after it.
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _owner_alive(job: RecordedJob) -> bool:
    """The process that recorded `job` still runs (not a later process that got the same pid)."""
    return job.pid_started is not None and process_started(job.pid) == job.pid_started


def cancel_recorded(root: Path, runner_for: Callable[[str], Runner], grace_s: float = 10.0) -> list[str]:
    """Cancel every job recorded live under `root`; returns the job ids cancelled.

    The process that owns them, if it still runs, gets SIGTERM first and `grace_s` to cancel its
    own jobs and stop: otherwise it would read our cancel as someone else's and resubmit.
    """
    owners = {job.pid: job for job in recorded_jobs(root) if job.pid not in (0, os.getpid())}
    alive = {pid for pid, job in owners.items() if _owner_alive(job)}
    for pid in alive:
        console.warning("servestack.runners", f"stopping servestack process {pid}, which has live jobs under {root}")
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {pid for pid in alive if _owner_alive(owners[pid])}
    cancelled = []
    for job in recorded_jobs(root):  # what the owners did not get to
        runner = runner_for(job.runner)
        runner.cancel(JobHandle(runner=job.runner, job_id=job.job_id, spec=JobSpec(name=job.name, points=(), out_dir=job.path.parent,
                                                                                   command=())))
        job.path.unlink(missing_ok=True)
        cancelled.append(job.job_id)
        console.warning("servestack.runners", f"cancelled {job.runner} job {job.job_id} ({job.name})")
    return cancelled


def _cancel_for(signalled: KeyboardInterrupt, runner: Runner, handle: JobHandle) -> None:
    try:
        handle.cancelled_by_us = True
        runner.cancel(handle)
        signal_name = "SIGTERM" if isinstance(signalled, Terminated) else "SIGINT"
        console.warning("servestack.runners", f"{signal_name}: cancelled {runner.name} job {handle.job_id}")
    except Exception as exc:  # the signal still ends the process; the CI backstop may get the job
        console.error("servestack.runners", f"could not cancel {runner.name} job {handle.job_id}: {exc}")


def run_job(runner: Runner, spec: JobSpec, policy: RetryPolicy = RetryPolicy(),
            timeout_s: float | None = None) -> JobOutcome:
    """Run `spec` until its points are on disk, or it ends in a non-retryable state, or attempts run out."""
    outcome = JobOutcome(spec=spec)
    remaining = spec.remaining()
    if not remaining:
        outcome.skipped = True
        outcome.final_state = "SKIPPED"
        console.detail("servestack.runners", f"{spec.name}: every point already has a result, nothing to run")
        return outcome
    with signals_unwind():
        for attempt in range(1, policy.max_attempts + 1):
            todo = spec.with_points(remaining)
            t0 = time.monotonic()
            handle: JobHandle | None = None
            interrupted = True
            try:
                with held():  # a signal during the submission waits for the job id, to cancel the job
                    handle = runner.submit(todo)
                    _record_live(runner, handle)
                console.detail("servestack.runners", f"{spec.name}: attempt {attempt} submitted as {runner.name} job "
                                                    f"{handle.job_id} for points {','.join(remaining)}")
                state = runner.wait(handle, timeout=timeout_s)
                if not state.terminal:  # our own deadline passed
                    handle.cancelled_by_us = True
                    runner.cancel(handle)
                    state = JobState.TIMEOUT
                interrupted = False
            except KeyboardInterrupt as signalled:
                if handle is not None:
                    _cancel_for(signalled, runner, handle)
                raise
            finally:
                if handle is not None:
                    _record_path(runner, handle).unlink(missing_ok=True)
                    try:
                        runner.collect(handle)  # keep what finished, interrupted or not
                    except Exception as exc:
                        if not interrupted:
                            raise
                        console.warning("servestack.runners", f"{spec.name}: could not collect job {handle.job_id} "
                                                             f"after the interruption: {exc}")
            where = getattr(runner, "placement", None)
            outcome.attempts.append(Attempt(job_id=handle.job_id, points=remaining, state=state.value,
                                            seconds=round(time.monotonic() - t0, 2),
                                            placement=where(handle) if where else {}))
            remaining = spec.remaining()
            outcome.final_state = state.value
            console.detail("servestack.runners", f"{spec.name}: job {handle.job_id} ended {state.value}; "
                                                f"{len(remaining)} point(s) remaining")
            if not remaining:
                break
            retryable = state in policy.retry_on and not handle.cancelled_by_us
            if not retryable:
                break
            if attempt < policy.max_attempts and policy.backoff_s:
                time.sleep(policy.backoff_s)
    outcome.remaining = remaining
    return outcome
