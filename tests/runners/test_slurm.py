"""The Slurm runner: rendered batch scripts, and the real scheduler mechanics (e2e, no image)."""

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

from servestack.clients import CLIENTS_DIR
from servestack.errors import ClusterToolsMissing, ServestackError
from servestack.runners.driver import RetryPolicy, run_job
from servestack.runners.interface import JobSpec, JobState, Mount
from servestack.runners.preflight import NodePreflight
from servestack.runners.slurm import SlurmConfig, SlurmRunner, choose_container, format_time_limit, render_batch_script
from servestack.util.proc import run

IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32


def image_spec(tmp_path):
    return JobSpec(name="throughput-agg", points=("1", "4"), out_dir=tmp_path / "agg",
                   command=("python3", "/opt/servestack-clients/run_points.py", "--points", "{points}"),
                   image=IMAGE, mounts=(Mount(host=tmp_path / "agg", container="/results", read_only=False),
                                        Mount(host=Path("/srv/model"), container="/model")),
                   env={"HF_HUB_OFFLINE": "1"}, time_limit_s=5400, gpus=4)


def test_docker_batch_script(tmp_path):
    s = render_batch_script(image_spec(tmp_path), SlurmConfig(partition="batch", account="acct", container="docker"))
    assert "#SBATCH --time=01:30:00" in s and "#SBATCH --partition=batch" in s and "#SBATCH --gres=gpu:4" in s
    assert ("docker run --rm --name \"servestack-${SLURM_JOB_ID}\" --shm-size 2g --gpus all "
            f"-v {tmp_path}/agg:/results") in s
    assert "-v /srv/model:/model:ro" in s and "-e HF_HUB_OFFLINE" in s and "export HF_HUB_OFFLINE=1" in s
    assert f"{IMAGE} python3 /opt/servestack-clients/run_points.py --points 1,4" in s
    assert "trap 'docker kill \"servestack-${SLURM_JOB_ID}\"" in s


def test_pyxis_batch_script(tmp_path):
    s = render_batch_script(image_spec(tmp_path), SlurmConfig(container="pyxis"))
    assert "--container-image=127.0.0.1:5000#servestack/dev-cpu@sha256:" in s
    assert f"--container-mounts={tmp_path}/agg:/results,/srv/model:/model:ro" in s
    assert "--container-env=HF_HUB_OFFLINE" in s and "docker" not in s


PYXIS_HELP = "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"


def test_preflight_takes_pyxis_when_the_cluster_has_it_and_names_what_is_missing():
    assert choose_container("auto", srun_help=PYXIS_HELP, enroot_version="4.1.2\n", docker=False) == "pyxis"
    assert choose_container("auto", srun_help="--ntasks", enroot_version=None, docker=True) == "docker"
    assert choose_container("docker", srun_help=PYXIS_HELP, enroot_version="4.1.2", docker=True) == "docker"
    with pytest.raises(ServestackError, match="enroot 3.1.0 is older than 3.4.0"):
        choose_container("auto", srun_help=PYXIS_HELP, enroot_version="3.1.0", docker=True)
    with pytest.raises(ServestackError, match="`enroot` is not on PATH"):
        choose_container("auto", srun_help=PYXIS_HELP, enroot_version=None, docker=True)
    with pytest.raises(ServestackError, match="pyxis is not in this cluster's plugstack.conf"):
        choose_container("pyxis", srun_help="--ntasks", enroot_version="4.1.2", docker=True)
    with pytest.raises(ServestackError, match="srun has no --container-image .* `docker` is not on PATH"):
        choose_container("auto", srun_help="--ntasks", enroot_version=None, docker=False)


def test_pyxis_pulls_from_the_registry_the_nodes_use(tmp_path):
    s = render_batch_script(image_spec(tmp_path), SlurmConfig(container="pyxis",
                                                              registry_map={"127.0.0.1:5000": "127.0.0.1:5001"}))
    assert "--container-image=127.0.0.1:5001#servestack/dev-cpu@sha256:" in s


def test_small_helpers():
    assert format_time_limit(30) == "00:01:00" and format_time_limit(90061) == "1-01:01:01"


# ----------------------------------------------------------------------------- real Slurm

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


GB200_PREFLIGHT = NodePreflight(min_driver=580, gpus_per_node=4, nodes=2)


def test_the_preflight_runs_on_every_node_before_the_server(tmp_path):
    s = render_batch_script(replace(image_spec(tmp_path), preflight=GB200_PREFLIGHT), SlurmConfig(container="pyxis"))
    preflight, server = s.index("srun --ntasks-per-node=1 bash"), s.index("--container-image=")
    assert preflight < server and "export SERVESTACK_PREFLIGHT_MIN_DRIVER=580" in s and "exit 3" in s
    skipped = render_batch_script(replace(image_spec(tmp_path), preflight=replace(GB200_PREFLIGHT, skipped=True)),
                                  SlurmConfig(container="pyxis"))
    assert "servestack-preflight.sh" not in skipped


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
