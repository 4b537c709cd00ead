"""What CI steps rely on: live jobs recorded on disk and cancelled by another process; digests as step outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.records import write_image_record, write_smoke_record
from servestack import ci as workflow
from servestack.errors import ServestackError
from servestack.records.smokefile import Check
from servestack.runners.driver import cancel_recorded, process_started, recorded_jobs, run_job
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait
from servestack.util.project import Project


class RecordingRunner(PollingWait):
    name = "fake"

    def __init__(self, seen_live: list | None = None):
        self.cancelled: list[str] = []
        self.poll_seconds = 0.0
        self.seen_live = seen_live

    def submit(self, job: JobSpec) -> JobHandle:
        return JobHandle(runner=self.name, job_id="77", spec=job)

    def state(self, handle: JobHandle) -> JobState:
        if self.seen_live is not None:  # what another process would find while the job runs
            self.seen_live.extend(recorded_jobs(handle.spec.out_dir))
        for p in handle.spec.points:
            handle.spec.point_file(p).write_text("{}")
        return JobState.COMPLETED

    def cancel(self, handle: JobHandle) -> None:
        self.cancelled.append(handle.job_id)

    def collect(self, handle: JobHandle) -> Path:
        return handle.spec.out_dir


def test_a_live_job_is_on_disk_while_it_runs_and_gone_after(tmp_path):
    seen: list = []
    spec = JobSpec(name="throughput-agg", points=("1",), out_dir=tmp_path / "run" / "throughput" / "agg", command=("true",))
    spec.out_dir.mkdir(parents=True)
    assert run_job(RecordingRunner(seen), spec).complete
    assert [(j.runner, j.job_id, j.name) for j in seen] == [("fake", "77", "throughput-agg")]
    assert seen[0].path.parent == spec.jobs_dir / "live"
    assert recorded_jobs(tmp_path / "run") == []


def _record(run: Path, job_id: str, pid: int, started: int | None = None) -> Path:
    path = run / "accuracy" / "agg-acc" / ".jobs" / "live" / f"fake-{job_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runner": "fake", "job_id": job_id, "name": "accuracy-agg-acc", "pid": pid,
                                "pid_started": started}))
    return path


OWNER = """
import os, signal, sys, time
def on_term(_s, _f):
    os.unlink(sys.argv[1])  # the owner cancels its own job and forgets it
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[2], "w").write("ready")
while True:
    time.sleep(0.05)
"""


def test_backstop_stops_the_owner_then_cancels_what_is_left(tmp_path):
    run = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = _record(run, "11", dead.pid, started=1)  # its process was killed: nobody will cancel job 11
    owned = _record(run, "12", 0)
    ready = tmp_path / "ready"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(owned), str(ready)])
    try:
        _record(run, "12", owner.pid, started=process_started(owner.pid))
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        runner = RecordingRunner()
        assert cancel_recorded(run, lambda kind: runner, grace_s=10) == ["11"]
        assert owner.wait(timeout=5) == 143  # it got SIGTERM and handled its own job
        assert runner.cancelled == ["11"] and not orphan.exists() and recorded_jobs(run) == []
    finally:  # a failure above must not leave the owner looping (kill is a no-op once it has exited)
        owner.kill()
        owner.wait()


def test_backstop_does_not_signal_a_process_that_reused_a_recorded_pid(tmp_path):
    run = tmp_path / "run"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # The recorded owner started at another time: this pid now belongs to someone else.
        _record(run, "13", other.pid, started=process_started(other.pid) - 1)
        runner = RecordingRunner()
        assert cancel_recorded(run, lambda kind: runner, grace_s=1) == ["13"]
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait()


def _project(tmp_path: Path, stack: str = "dev-cpu") -> Project:
    d = tmp_path / "build" / stack
    d.mkdir(parents=True)
    write_image_record(d / "image.json", f"127.0.0.1:5000/servestack/dev-cpu@sha256:{'c' * 64}")
    write_smoke_record(d / "smoke.json", f"127.0.0.1:5000/servestack/dev-cpu@sha256:{'c' * 64}", stack,
                       tuple(Check(probe="static", name=f"c{i}", status="pass") for i in range(30))
                       + (Check(probe="serving", name="ready", status="not_run", detail="--no-serve"),
                          Check(probe="disagg", name="ready", status="not_run")))
    report = d / "runs" / "gha-1-1" / "accuracy" / "report.md"
    report.parent.mkdir(parents=True)
    report.write_text("### accuracy: PASS\n")
    (report.parent / "accuracy.png").write_bytes(b"png")
    return Project(root=tmp_path)


def test_outputs_and_summary_go_to_the_files_github_reads(tmp_path):
    project = _project(tmp_path)
    report = tmp_path / "build" / "dev-cpu" / "runs" / "gha-1-1" / "accuracy" / "report.md"
    outputs = workflow.step_outputs(project, "dev-cpu")
    assert outputs == {"dev-cpu-image": f"127.0.0.1:5000/servestack/dev-cpu@sha256:{'c' * 64}"}
    text = workflow.summary(project, "dev-cpu", "gha-1-1")
    assert "**PASS** (30 pass, 0 fail, 2 not run)" in text and "### accuracy: PASS" in text
    assert "`accuracy/accuracy.png`" in text and "bundle: `not published`" in text
    (report.parent.parent / "report.md").write_text("# servestack pipeline report\n")  # the run's own, once it ends
    assert "### accuracy" not in workflow.summary(project, "dev-cpu", "gha-1-1")
    out, summ = tmp_path / "out", tmp_path / "summary"
    workflow.write_step(outputs, text, {"GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summ)})
    assert out.read_text() == f"dev-cpu-image={outputs['dev-cpu-image']}\n" and summ.read_text() == text + "\n"


def test_a_tag_or_a_forged_line_never_becomes_an_output(tmp_path):
    project = _project(tmp_path)
    (tmp_path / "build" / "dev-cpu" / "image.json").write_text(json.dumps({"reference": "registry/dev-cpu:latest"}))
    with pytest.raises(ServestackError):
        workflow.step_outputs(project, "dev-cpu")
    with pytest.raises(ServestackError, match="one line"):
        workflow.write_step({"dev-cpu-image": "x\ndev-cpu-image=evil"}, "", {"GITHUB_OUTPUT": str(tmp_path / "o")})
    assert not (tmp_path / "o").exists()
