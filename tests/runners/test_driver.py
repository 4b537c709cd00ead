"""The driver: resume from disk, retry remaining points after faults, never retry our own cancel."""

from __future__ import annotations

import json
from pathlib import Path

from servestack.runners.driver import RetryPolicy, run_job
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait


class ScriptedRunner(PollingWait):
    """In-process runner: each submission finishes the first `k` of its points, then ends in a state."""

    name = "scripted"

    def __init__(self, script: list[tuple[int, JobState]]):
        self.script = list(script)
        self.submitted: list[tuple[str, ...]] = []
        self.poll_seconds = 0.0
        self._end: dict[str, JobState] = {}

    def submit(self, job: JobSpec) -> JobHandle:
        self.submitted.append(job.points)
        k, end = self.script.pop(0)
        for p in job.points[:k]:
            job.out_dir.mkdir(parents=True, exist_ok=True)
            job.point_file(p).write_text(json.dumps({"point": p}))
        jid = str(len(self.submitted))
        self._end[jid] = end
        return JobHandle(runner=self.name, job_id=jid, spec=job)

    def state(self, handle):
        return self._end[handle.job_id]

    def cancel(self, handle):
        handle.cancelled_by_us = True

    def collect(self, handle) -> Path:
        return handle.spec.out_dir


def spec(tmp_path, points=("1", "4", "16")):
    return JobSpec(name="throughput-agg", points=tuple(points), out_dir=tmp_path / "agg", command=("true",))


def test_preempted_job_is_retried_for_its_remaining_points_only(tmp_path):
    r = ScriptedRunner([(1, JobState.PREEMPTED), (1, JobState.NODE_FAIL), (1, JobState.COMPLETED)])
    out = run_job(r, spec(tmp_path), RetryPolicy(max_attempts=3))
    assert r.submitted == [("1", "4", "16"), ("4", "16"), ("16",)]
    assert out.complete and [a.state for a in out.attempts] == ["PREEMPTED", "NODE_FAIL", "COMPLETED"]


def test_rerun_resumes_from_results_on_disk(tmp_path):
    s = spec(tmp_path)
    s.out_dir.mkdir(parents=True)
    s.point_file("4").write_text("{}")
    r = ScriptedRunner([(2, JobState.COMPLETED)])
    assert run_job(r, s).complete
    assert r.submitted == [("1", "16")]
    r2 = ScriptedRunner([])
    out = run_job(r2, s)
    assert out.skipped and r2.submitted == []  # nothing redone


def test_attempts_are_bounded(tmp_path):
    r = ScriptedRunner([(0, JobState.TIMEOUT)] * 5)
    out = run_job(r, spec(tmp_path), RetryPolicy(max_attempts=2))
    assert len(r.submitted) == 2 and out.remaining == ("1", "4", "16") and out.final_state == "TIMEOUT"


def test_failed_jobs_are_not_retried(tmp_path):
    r = ScriptedRunner([(1, JobState.FAILED), (3, JobState.COMPLETED)])
    out = run_job(r, spec(tmp_path))
    assert len(r.submitted) == 1 and out.remaining == ("4", "16")


def test_cancelled_by_someone_else_is_retried_but_not_by_us(tmp_path):
    r = ScriptedRunner([(1, JobState.CANCELLED), (3, JobState.COMPLETED)])
    assert run_job(r, spec(tmp_path)).complete and len(r.submitted) == 2

    class CancelsItself(ScriptedRunner):
        def submit(self, job):
            h = super().submit(job)
            h.cancelled_by_us = True
            return h

    r = CancelsItself([(1, JobState.CANCELLED), (3, JobState.COMPLETED)])
    out = run_job(r, spec(tmp_path / "b"))
    assert len(r.submitted) == 1 and out.remaining == ("4", "16")


def test_state_parsing_of_slurm_spellings():
    assert JobState.parse("CANCELLED by 0") is JobState.CANCELLED
    assert JobState.parse("CANCELLED+") is JobState.CANCELLED
    assert JobState.parse("COMPLETING") is JobState.RUNNING
    assert JobState.parse("NODE_FAIL") is JobState.NODE_FAIL
    assert JobState.parse("PD") is JobState.PENDING
    assert JobState.parse("") is JobState.UNKNOWN


def test_an_interrupted_job_is_still_collected(tmp_path):
    """Ctrl-C during wait: what the job finished is collected, so a rerun does not redo it."""
    import pytest

    class Interrupted(ScriptedRunner):
        collected = 0

        def wait(self, handle, timeout=None):
            raise KeyboardInterrupt

        def collect(self, handle):
            self.collected += 1
            return handle.spec.out_dir

    r = Interrupted([(1, JobState.RUNNING)])
    with pytest.raises(KeyboardInterrupt):
        run_job(r, spec(tmp_path))
    assert r.collected == 1


def test_a_signal_during_submit_waits_for_the_job_id_then_cancels(tmp_path):
    import os
    import signal

    import pytest

    class SignalledWhileSubmitting(ScriptedRunner):
        cancelled: list[str] = []

        def submit(self, job):
            os.kill(os.getpid(), signal.SIGINT)  # arrives before the job id is known
            return super().submit(job)

        def cancel(self, handle):
            self.cancelled.append(handle.job_id)

    r = SignalledWhileSubmitting([(0, JobState.RUNNING)])
    with pytest.raises(KeyboardInterrupt):
        run_job(r, spec(tmp_path))
    assert r.cancelled == ["1"]


def test_a_signal_while_the_job_runs_cancels_it_before_the_process_unwinds(tmp_path):
    import os
    import signal
    import time

    import pytest

    class SignalledWhileWaiting(ScriptedRunner):
        cancelled: list[str] = []

        def wait(self, handle, timeout=None):
            os.kill(os.getpid(), signal.SIGTERM)  # e.g. the CI runner cancelling the workflow
            time.sleep(30)  # never reached: the handler raises at the next bytecode
            return JobState.COMPLETED

        def cancel(self, handle):
            self.cancelled.append(handle.job_id)

    r = SignalledWhileWaiting([(0, JobState.RUNNING)])
    with pytest.raises(KeyboardInterrupt) as raised:
        run_job(r, spec(tmp_path))
    assert type(raised.value).__name__ == "Terminated"  # the exit code will say SIGTERM (143)
    assert r.cancelled == ["1"]


def test_a_second_signal_does_not_cut_the_cancel_short(tmp_path):
    """Ctrl-C under nox: SIGINT starts the cancel, nox's SIGTERM comes 0.5 s later, while scancel
    runs; the driver uses interrupts.signals_unwind, whose grace lets the cancel finish."""
    import os
    import signal

    import pytest

    class SignalledTwice(ScriptedRunner):
        cancelled: list[str] = []

        def wait(self, handle, timeout=None):
            os.kill(os.getpid(), signal.SIGINT)
            return JobState.COMPLETED

        def cancel(self, handle):
            os.kill(os.getpid(), signal.SIGTERM)  # arrives halfway through the cancel
            self.cancelled.append(handle.job_id)

    r = SignalledTwice([(0, JobState.RUNNING)])
    with pytest.raises(KeyboardInterrupt) as raised:
        run_job(r, spec(tmp_path))
    assert type(raised.value) is KeyboardInterrupt  # the first signal's, not the absorbed SIGTERM's
    assert r.cancelled == ["1"]
