"""The Slurm runner on this machine's real Slurm: the scheduler's mechanics (no image), cancellation, the
node preflight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures.children import stopped_on_exit
from fixtures.paths import ROOT
from fixtures.runner_jobs import GB200_PREFLIGHT
from servestack.clients import CLIENTS_DIR
from servestack.errors import ClusterToolsMissing
from servestack.runners.driver import RetryPolicy, run_job
from servestack.runners.interface import JobSpec, JobState
from servestack.runners.slurm import SlurmConfig, SlurmRunner
from servestack.util.proc import run

POINT = textwrap.dedent("""
    import json, pathlib, sys, time
    time.sleep(float(sys.argv[3]))
    pathlib.Path(sys.argv[2]).write_text(json.dumps({"point": sys.argv[1]}))
""")


def command_spec(tmp_path: Path, points, seconds: float, name: str | None = None) -> JobSpec:
    """A container-free job: run_points.py on the node, each point a sleep then a file."""
    out = tmp_path / "agg"
    job = {"server": None, "out_dir": str(out),
           "point": {"argv": [sys.executable, "-c", POINT, "{point}", "{out}", str(seconds)]}}
    jf = tmp_path / "job.json"
    jf.write_text(json.dumps(job))
    return JobSpec(name=name or f"servestack-test-{uuid.uuid4().hex[:8]}", points=tuple(points), out_dir=out,
                   command=(sys.executable, str(CLIENTS_DIR / "run_points.py"), "--spec", str(jf),
                            "--points", "{points}"), time_limit_s=600)


@pytest.mark.e2e
def test_command_job_runs_to_completion(tmp_path, slurm_env):
    r = SlurmRunner(SlurmConfig(env=slurm_env, poll_seconds=0.5))
    out = run_job(r, command_spec(tmp_path, ["1", "2"], 0.2))
    assert out.complete and out.final_state == "COMPLETED", out.to_dict()
    assert json.loads((tmp_path / "agg" / "2.json").read_text()) == {"point": "2"}


@pytest.mark.e2e
def test_scancel_by_someone_else_retries_only_the_remaining_points(tmp_path, slurm_env):
    r = SlurmRunner(SlurmConfig(env=slurm_env, poll_seconds=0.5))
    spec = command_spec(tmp_path, ["1", "4", "16"], 2.0)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("o", run_job(r, spec, RetryPolicy(max_attempts=3))))
    t.start()
    first = spec.point_file("1")
    deadline = time.monotonic() + 60
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first point never finished"
    job_id = run(["squeue", "-h", "-n", spec.name, "-o", "%i"], env=slurm_env).stdout.split()[0]
    run(["scancel", job_id], env=slurm_env)  # an operator (not us) cancels the job
    t.join(120)
    out = result["o"]
    assert out.complete, out.to_dict()
    assert [a.state for a in out.attempts] == ["CANCELLED", "COMPLETED"]
    assert out.attempts[0].points == ("1", "4", "16")
    assert "1" not in out.attempts[1].points  # the finished point is not redone
    assert not list((tmp_path / "agg").glob(".*.partial"))


DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from servestack.runners.interface import JobSpec
    from servestack.runners.driver import run_job
    from servestack.runners.slurm import SlurmConfig, SlurmRunner
    spec = JobSpec(**{**json.loads(sys.argv[1]), "out_dir": Path(json.loads(sys.argv[1])["out_dir"])})
    spec = JobSpec(name=spec.name, points=tuple(spec.points), out_dir=spec.out_dir, command=tuple(spec.command))
    run_job(SlurmRunner(SlurmConfig(env=json.loads(sys.argv[2]), poll_seconds=0.5)), spec)
""")


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_cancel_our_jobs(tmp_path, slurm_env, sig):
    spec = command_spec(tmp_path, ["1", "2"], 60.0)
    arg = json.dumps({"name": spec.name, "points": list(spec.points), "out_dir": str(spec.out_dir),
                      "command": list(spec.command)})
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # However the test ends (the job never starts, the driver outlives the wait), the driver is stopped
    # (SIGTERM: it cancels its job) rather than left running with its job on the cluster.
    with stopped_on_exit(subprocess.Popen([sys.executable, "-c", DRIVER, arg, json.dumps(slurm_env)], env=env)) as child:
        job_id = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            q = run(["squeue", "-h", "-n", spec.name, "-o", "%i %T"], env=slurm_env, check=False).stdout.split()
            if len(q) == 2 and q[1] == "RUNNING":
                job_id = q[0]
                break
            time.sleep(0.3)
        assert job_id, "the job never started"
        child.send_signal(sig)
        rc = child.wait(60)
    assert rc != 0
    from servestack.runners.slurm import slurm_state

    deadline = time.monotonic() + 30
    while slurm_state(job_id, env=slurm_env) is not JobState.CANCELLED and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm_state(job_id, env=slurm_env) is JobState.CANCELLED


@pytest.mark.e2e
def test_preflight_finds_pyxis_and_enroot_on_the_gb200_shaped_node():
    from servestack import cluster
    from servestack.runners.slurm import ENROOT_MIN_VERSION, preflight

    try:
        node = cluster.ensure_cluster(ROOT)
    except ClusterToolsMissing as e:
        pytest.skip(str(e))
    assert node.enroot.version >= ENROOT_MIN_VERSION
    assert preflight(SlurmConfig(env=node.env)) == "pyxis"  # srun has --container-image, enroot is recent
    assert preflight(SlurmConfig(env=node.env, container="docker")) == "docker"


@pytest.mark.e2e
def test_the_preflight_ends_the_job_in_seconds_on_a_node_without_driver_or_gpus(tmp_path, slurm_env):
    r = SlurmRunner(SlurmConfig(env=slurm_env, poll_seconds=0.5))
    t0 = time.monotonic()
    out = run_job(r, replace(command_spec(tmp_path, ["1"], 0.1), preflight=GB200_PREFLIGHT), RetryPolicy(max_attempts=1))
    took = time.monotonic() - t0
    assert out.final_state == "FAILED" and out.remaining == ("1",), out.to_dict()
    assert took < 60, f"the preflight took {took:.0f} s"
    log = "".join(p.read_text() for p in (tmp_path / "agg" / ".jobs").glob("slurm-*.out"))
    assert "no NVIDIA driver: nvidia-smi is not on PATH (driver >= 580 needed)" in log, log
    assert "no GPUs: 0 of the 4 per node the recipe places" in log
    assert "no IMEX channel" in log
    assert out.to_dict()["preflight"] == {"min_driver": 580, "gpus_per_node": 4, "nodes": 2}
    skipped = run_job(r, replace(command_spec(tmp_path, ["1"], 0.1), preflight=replace(GB200_PREFLIGHT, skipped=True)))
    assert skipped.final_state == "COMPLETED" and skipped.to_dict()["preflight"]["skipped"] == "--skip-preflight"
