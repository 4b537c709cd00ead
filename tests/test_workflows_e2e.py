"""The workflows' jobs run for real on this machine, step by step, as a self-hosted runner runs them.

build.yml's `image` job (dev-cpu leg) runs in a fresh checkout of this commit: bootstrap, the tool
venv, build + image + smoke, publish with a signing key, then `nox -s outputs` (once per session,
conftest's `build_job`: its smoke step is also the README main job, test_main_job_e2e). Its job outputs
are what gb200.yml gets as inputs, exactly as build.yml's `gb200` job passes them. gb200.yml's
`pipeline` job then pulls and verifies the bundle by digest with the public key, runs the dev-cpu
pipeline through the srtctl runner (real srtctl, pyxis and enroot on this machine's Slurm),
publishes the results as another referrer of the digest with the pulled records, and writes the
report to the step summary. Cancelled mid-run, it leaves nothing in squeue.

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

from servestack.imageref import ImageRef
from servestack.proc import run
from servestack.runners.driver import recorded_jobs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS, STACK, RUN_ID = workflow_jobs.WORKFLOWS, workflow_jobs.STACK, workflow_jobs.RUN_ID
_runner, _workspace = workflow_jobs.runner, workflow_jobs.workspace


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


@pytest.fixture(scope="module")
def gb200_job(build_job, cancelled_run, runner_root, workflow_sha, keys):
    runner = _runner(runner_root, workflow_sha, keys, attempt=2)  # "Re-run jobs": a new attempt, a new run id
    timer = threading.Timer(3600, runner.cancel)
    timer.start()
    try:
        result = runner.run_job(WORKFLOWS / "gb200.yml", "pipeline", inputs=_gb200_inputs(build_job),
                                workspace=_workspace(runner_root))
    finally:
        timer.cancel()
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
