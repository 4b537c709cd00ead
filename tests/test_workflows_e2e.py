"""The workflows' jobs run for real on this machine, step by step, as a self-hosted runner runs them.

build.yml's `image` job (dev-cpu leg) runs in a fresh checkout of this commit: bootstrap, the tool
venv, build + image + smoke, publish with a signing key, then `nox -s outputs` (once per session,
conftest's `build_job`: its smoke step is also the README main job, test_main_job_e2e). Its job outputs
are what gb200.yml gets as inputs, exactly as build.yml's `gb200` job passes them. gb200.yml's
`pipeline` job then pulls and verifies the bundle by digest with the public key, runs the dev-cpu
pipeline through the srtctl runner (real srtctl, pyxis and enroot on this machine's Slurm),
publishes the results as another referrer of the digest with the pulled records, and writes the
report to the step summary. Cancelled mid-run, it leaves nothing in squeue. Re-run, its Slurm job
loses its node mid-sweep (NODE_FAIL) and the pipeline retries it for the points left, on another
node, with results read from srt-slurm's own files and nothing left on the nodes.

Both jobs use one workspace, as one machine registered with both label sets would: srtctl mounts
the model from the host, and on dev-cpu that is the directory `nox -s build` writes (on a GB200
cluster it is the weights' path the qwen35-gb200 pipeline names).

The image is the one the rest of the e2e suite builds: `nox -s image` finds it in the registry by
its input hash and builds nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fixtures import workflow_jobs
from servestack import services
from servestack.records.imageref import ImageRef
from servestack.runners.driver import recorded_jobs
from servestack.services import netns, slurm_nodes
from servestack.util.proc import run

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS, STACK, RUN_ID = workflow_jobs.WORKFLOWS, workflow_jobs.STACK, workflow_jobs.RUN_ID
_runner, _workspace = workflow_jobs.runner, workflow_jobs.workspace
PNG = b"\x89PNG\r\n\x1a\n"


def _gb200_inputs(build) -> dict[str, str]:
    # What build.yml's `gb200` job hands over (`with: image: ${{ needs.image.outputs.<stack>-image }}`).
    # The aggregated throughput recipe: dev-cpu's accuracy is the oracle, which needs the
    # disaggregated recipe too, and that goes through srtctl once per CI, in test_pipeline_e2e.
    return {"image": build.outputs[f"{STACK}-image"], "stack": STACK, "recipes": "agg"}


def test_build_job_publishes_and_outputs_the_digest(build_job):
    steps = {s.name: s.outcome for s in build_job.steps}
    assert build_job.result == "success", steps
    ref = ImageRef.parse(build_job.outputs[f"{STACK}-image"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", build_job.outputs[f"{STACK}-bundle"])
    assert str(ref) in build_job.summary and "smoke: **PASS**" in build_job.summary


def _squeue_ours(workspace: Path, seen: list[str], env: dict[str, str]) -> list[str]:
    """Jobs in squeue that are ours: seen live, or working inside `workspace` (others share this Slurm)."""
    out = run(["squeue", "-h", "-o", "%i|%Z"], env=env, check=False).stdout
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    return [i for i, wd in rows if i in seen or wd.startswith(str(workspace))]


def _run_dir(workspace: Path, attempt: int) -> Path:
    return workspace / "build" / STACK / "runs" / f"gha-{RUN_ID}-{attempt}"


@pytest.fixture(scope="module")
def cancelled_run(build_job, runner_root, workflow_sha, keys, srtctl_cluster):
    slurm_env = srtctl_cluster.slurm_env  # where the pipeline's srtctl jobs run
    runner = _runner(runner_root, workflow_sha, keys, attempt=1)
    workspace = _workspace(runner_root)
    seen: list[str] = []

    def a_job_is_queued() -> bool:
        live = [j.job_id for j in recorded_jobs(_run_dir(workspace, 1))]
        queued = set(run(["squeue", "-h", "-o", "%i"], env=slurm_env, check=False).stdout.split())
        seen.extend(j for j in live if j in queued and j not in seen)
        return bool(seen)

    timer = threading.Timer(1800, runner.cancel)
    timer.start()
    try:
        result = runner.run_job(WORKFLOWS / "gb200.yml", "pipeline", inputs=_gb200_inputs(build_job),
                                workspace=workspace, cancel_when=a_job_is_queued)
    finally:
        timer.cancel()
    deadline = time.monotonic() + 60  # scancel is asynchronous: give Slurm a moment to drop the job
    left = _squeue_ours(workspace, seen, slurm_env)
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = _squeue_ours(workspace, seen, slurm_env)
    return {"result": result, "seen": seen, "left": left}


def test_cancelling_the_gb200_job_leaves_nothing_in_squeue(cancelled_run):
    result = cancelled_run["result"]
    steps = {s.name: s.outcome for s in result.steps}
    assert cancelled_run["seen"], f"no Slurm job was ever queued: {steps}"
    assert result.result == "cancelled"
    assert steps["Pipeline through srtctl"] == "cancelled"
    assert steps["Cancel what is left on Slurm"] == "success"  # the backstop ran (and found nothing or cancelled it)
    assert steps["Publish the results as a referrer of the digest"] == "skipped"
    assert not cancelled_run["left"], f"still in squeue after the cancel: {cancelled_run['left']}"


def _leftovers() -> dict[str, list[str]]:
    """What still runs in each node of the srtctl cluster beside its slurmd, and the containers
    left on each node's disk: what a finished pipeline must not leave behind."""
    left: dict[str, list[str]] = {}
    for name in netns.existing_netns():
        for pid in netns.pids(name):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if Path(cmd.split(" ")[0]).name != "slurmd":
                left.setdefault(name, []).append(f"{pid} {cmd[:120]}")
    for data in slurm_nodes.nodes_dir().glob("node*/enroot/data"):
        containers = [p.name for p in data.iterdir() if p.name.startswith("pyxis_")]
        if containers:
            left.setdefault(data.parents[1].name, []).extend(containers)
    return left


@pytest.fixture(scope="module")
def node_loss() -> dict:
    """What gb200_job's node loss did: the job and node it took, the nodes' leftovers afterwards."""
    return {}


@pytest.fixture(scope="module")
def gb200_job(build_job, cancelled_run, runner_root, workflow_sha, keys, srtctl_cluster, node_loss):
    """The job re-run to the end, whose Slurm job loses its node (power, network and slurmd) once
    the first point has a result: as on a cluster, the workflow's step sees a pipeline that retries."""
    runner = _runner(runner_root, workflow_sha, keys, attempt=2)  # "Re-run jobs": a new attempt, a new run id
    outputs = _run_dir(_workspace(runner_root), 2) / "throughput" / "agg" / ".jobs" / "srtctl-outputs"
    finished = threading.Event()

    def lose_the_first_jobs_node() -> None:
        while not finished.wait(1):
            done = list(outputs.glob("*/logs/sa-bench_*/results_concurrency_1_gpus_1.json"))
            if done:
                job = done[0].parents[2].name
                nodes = run(["squeue", "-h", "-j", job, "-o", "%N"], env=srtctl_cluster.slurm_env, check=False).stdout
                node_loss.update(job=job, node=nodes.strip())
                if node_loss["node"]:
                    slurm_nodes.lose_node(node_loss["node"])
                    node_loss["at"] = time.monotonic()
                return

    watcher = threading.Thread(target=lose_the_first_jobs_node, name="node-loss", daemon=True)
    timer = threading.Timer(3600, runner.cancel)
    t0 = time.monotonic()
    watcher.start()
    timer.start()
    try:
        result = runner.run_job(WORKFLOWS / "gb200.yml", "pipeline", inputs=_gb200_inputs(build_job),
                                workspace=_workspace(runner_root))
    finally:
        finished.set()
        timer.cancel()
        watcher.join(timeout=60)
    node_loss["leftovers"] = _leftovers()
    services.ensure_slurm(nodes=workflow_jobs.srtctl_nodes())  # the lost node, power-cycled
    if "at" in node_loss:
        print(f"gb200 job with a lost node: {time.monotonic() - t0:.0f} s "
              f"({time.monotonic() - node_loss['at']:.0f} s after {node_loss['node']} was lost)")
    return result


def test_gb200_job_verifies_runs_publishes_and_summarizes(gb200_job, build_job, runner_root, keys):
    steps = {s.name: s.outcome for s in gb200_job.steps}
    assert gb200_job.result == "success", steps
    assert steps["Cancel what is left on Slurm"] == "skipped"
    run_dir = _run_dir(_workspace(runner_root), 2)
    results = json.loads((run_dir / "results.json").read_text())
    stages = {s["stage"]: s for s in results["stages"]}
    assert results["passed"] and set(stages) == {"throughput"}
    assert {s["runner"] for s in stages.values()} == {"srtctl"}
    assert {s["image"] for s in stages.values()} == {build_job.outputs[f"{STACK}-image"]}
    assert f"### run gha-{RUN_ID}-2" in gb200_job.summary and "# servestack pipeline report" in gb200_job.summary
    # The results are now a referrer of the same digest: a fresh pull with the trusted key finds them.
    image = build_job.outputs[f"{STACK}-image"]
    out = runner_root / "pulled-after"
    subprocess.run([sys.executable, "-m", "servestack", "--project", str(ROOT), "pull", image, "--key",
                    keys["SERVESTACK_TRUSTED_KEY_FILE"], "--out", str(out)], check=True, timeout=300)
    assert list(out.glob(f"runs/gha-{RUN_ID}-2/*/results.json")), sorted(p.name for p in out.rglob("*"))


def test_a_node_lost_mid_sweep_fails_the_job_and_the_retry_runs_only_what_did_not_finish(
        gb200_job, node_loss, runner_root, srtctl_cluster):
    """The job loses its node after point 1: Slurm marks it NODE_FAIL, the pipeline retries it under
    its policy for points 4 and 16 alone (on another node), and nothing is left behind."""
    assert node_loss.get("node"), f"no node was lost (the first point's job: {node_loss.get('job')})"
    run_dir = _run_dir(_workspace(runner_root), 2)
    results = json.loads((run_dir / "results.json").read_text())
    [tput] = results["stages"]
    [job] = tput["jobs"]
    assert [(a["state"], a["points"]) for a in job["attempts"]] == [("NODE_FAIL", ["1", "4", "16"]),
                                                                         ("COMPLETED", ["4", "16"])]
    assert job["attempts"][0]["job_id"] == node_loss["job"] and job["remaining"] == []
    retried_on = job["attempts"][1]["placement"]["nodes"]["agg_w0"]
    assert retried_on != node_loss["node"]
    assert sorted(p["concurrency"] for p in tput["throughput"]) == [1, 4, 16]  # each exactly once
    assert all(p["completed"] == p["requested"] and p["failed"] == 0 for p in tput["throughput"])
    assert tput["timing"]["client_seconds"] > 0  # sa-bench's own durations, for the points measured now
    # srt-slurm's own layout and batch script: the recipe bound to the digest, pyxis pulling it.
    out = run_dir / "throughput" / "agg" / ".jobs" / "srtctl-outputs" / job["attempts"][1]["job_id"]
    config = (out / "config.yaml").read_text()
    digest = tput["image"].split("@", 1)[1]
    assert f"#servestack/{STACK}@{digest}" in config and "- 16\n" in config
    assert "srtctl.cli.do_sweep" in (out / "sbatch_script.sh").read_text()
    assert (out / "logs" / "sa-bench_isl_128_osl_32" / "results_concurrency_16_gpus_1.json").exists()
    assert (run_dir / "throughput" / "pareto.png").read_bytes().startswith(PNG)
    queued = set(run(["squeue", "-h", "-o", "%i"], env=srtctl_cluster.slurm_env, check=False).stdout.split())
    assert not {a["job_id"] for a in job["attempts"]} & queued
    assert node_loss["leftovers"] == {}
