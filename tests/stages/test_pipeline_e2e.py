"""The dev-cpu pipeline end to end on this machine: the real image by digest, real vLLM on CPU,
real Slurm (one node for the slurm runner, three in network namespaces for srtctl's jobs), through
the `servestack` command line.

  - slurm runner: throughput (three concurrency points), gates, results.json, report.md, two PNG
    plots, and the time spent inside the clients;
  - srtctl runner, the GB200 chain for real: srtctl (srt-slurm 0.3.0) -> sbatch -> srun
    --container-image (pyxis) -> enroot import of the image by digest, built from the vendored
    sources (skipped, with the reason, where they are missing); the aggregated sweep through it, its
    job losing its node mid-sweep, is the gb200 workflow job's (test_workflows_e2e);
  - the accuracy stage as dev-cpu gates it: the correctness oracle, the multi-node disaggregated
    recipe (Dynamo frontend, etcd and NATS on the head node, prefill and decode on a node each, KV
    cache and Gated DeltaNet state between nodes over NIXL), which the pipeline always sends to
    srtctl, held to the aggregated recipe's answers (the local runner);
  - a gate that cannot be met (baseline far above anything a CPU does), applied to the slurm run's
    points by rerunning it with its run id: nothing is measured again, and the verdict names the
    recipe, the point and the numbers;
  - A and B measured alongside (interleave.py): one session of three servers, an A/A and a capped
    batch; and the slurm run held to itself as a stored baseline, labelled "not measured alongside".
    (An operator's scancel mid-sweep is test_runners_slurm's;
    a job lost mid-sweep and retried for its remaining points, test_workflows_e2e's gb200 job.)

The image comes from build/dev-cpu/image.json; when that is missing it is built (cached: fast
when the registry already holds it). Every vLLM server runs inside a Slurm job with --exclusive,
so no two servers share the two cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fixtures.children import stop, stopped_on_exit
from fixtures.paths import ROOT
from servestack import services
from servestack.util.proc import run
from servestack.util.project import Project

pytestmark = pytest.mark.e2e

STACK = "dev-cpu"
PNG = b"\x89PNG\r\n\x1a\n"
# The runner tests run the aggregated throughput recipe; the accuracy oracle needs both shapes
# (the disaggregated one always through srtctl) and runs once, in its own test below.
AGGREGATED = "agg"


def _cli(*args: str, project: Path = ROOT) -> list[str]:
    return [sys.executable, "-m", "servestack", "--project", str(project), *args]


@pytest.fixture(scope="module")
def image_ref() -> str:
    services.ensure_dockerd()
    services.ensure_registry()
    from servestack import image, inputs

    # Always through build + image: seconds when the registry already holds this build.
    project = Project(root=ROOT)
    inputs.build(project, STACK)
    image.build_image(project, STACK)
    record = project.artifacts(STACK) / "image.json"
    ref = json.loads(record.read_text())["reference"]
    assert "@sha256:" in ref
    return ref


def _squeue_ids(env: dict[str, str]) -> set[str]:
    return set(run(["squeue", "-h", "-o", "%i"], env=env, check=False).stdout.split())


def _job_ids(stage_results: dict) -> list[str]:
    return [a["job_id"] for j in stage_results["jobs"] for a in j["attempts"]]


# ----------------------------------------------------------------------------- slurm runner


@pytest.fixture(scope="module")
def slurm_run(image_ref, slurm_env):
    run_id = f"e2e-slurm-{uuid.uuid4().hex[:8]}"
    run_dir = ROOT / "build" / STACK / "runs" / run_id
    t0 = time.monotonic()
    proc = subprocess.run(_cli("pipeline", "--stack", STACK, "--runner", "slurm", "--image", image_ref,
                               "--run-id", run_id, "--recipes", AGGREGATED), capture_output=True, text=True, timeout=1200)
    wall = time.monotonic() - t0
    yield {"proc": proc, "wall": wall, "dir": run_dir, "image": image_ref,
           "results": json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists()
           else None}
    if not os.environ.get("SERVESTACK_KEEP_E2E"):
        shutil.rmtree(run_dir, ignore_errors=True)


def test_slurm_pipeline_passes_with_real_numbers(slurm_run, slurm_env):
    proc, results = slurm_run["proc"], slurm_run["results"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "throughput: PASS" in proc.stdout
    assert results["passed"]
    [tput] = results["stages"]
    assert tput["runner"] == "slurm" and tput["image"] == slurm_run["image"]
    points = {p["concurrency"]: p for p in tput["throughput"]}
    assert sorted(points) == [1, 4, 16]
    for c, p in points.items():
        assert p["recipe"] == "agg" and p["completed"] == p["requested"] == max(8, 4 * c) and p["failed"] == 0
        assert p["output_tokens"] == p["requested"] * 32 and p["tokens_per_s_per_gpu"] > 0
    # Real Slurm jobs that ran the image by digest with docker.
    assert [a["state"] for j in tput["jobs"] for a in j["attempts"]] == ["COMPLETED"]
    scripts = list((slurm_run["dir"] / "throughput" / "agg" / ".jobs").glob("*.sbatch"))
    assert scripts and 'docker run --rm --name "servestack-${SLURM_JOB_ID}"' in scripts[0].read_text()
    assert slurm_run["image"] in scripts[0].read_text() and "#SBATCH --exclusive" in scripts[0].read_text()
    assert not (set(_job_ids(tput)) & _squeue_ids(slurm_env))


def test_slurm_pipeline_reports_plots_and_client_time(slurm_run):
    run_dir, results = slurm_run["dir"], slurm_run["results"]
    for name in ("throughput_vs_concurrency.png", "pareto.png"):
        data = (run_dir / "throughput" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    report = (run_dir / "report.md").read_text()
    assert "throughput/throughput_vs_concurrency.png" in report and "throughput/pareto.png" in report
    assert "| agg | 16 |" in report and "PASS" in report
    t = results["timing"]
    assert t["runner"] == "slurm" and 0 < t["client_seconds"] < t["wall_seconds"] <= slurm_run["wall"]
    assert t["server_startup_seconds"] > 0 and t["overhead_seconds"] == pytest.approx(
        t["wall_seconds"] - t["client_seconds"], abs=0.01)
    tput = next(s for s in results["stages"] if s["stage"] == "throughput")
    assert set(tput["timing"]["client_seconds_per_point"]) == {"agg/1", "agg/4", "agg/16"}
    assert "wall" in slurm_run["proc"].stdout and "overhead" in slurm_run["proc"].stdout


# ----------------------------------------------------------------------------- disaggregated recipes through srtctl


# The test runs the multi-node accuracy variant only (the oracle), on the three-node cluster: the
# production shape (the frontend, etcd and NATS on the head node, prefill and decode on a node each,
# the KV cache and the Gated DeltaNet state between nodes over NIXL). It covers what the one-node
# disaggregated recipe (`disagg-acc`) does, and the throughput sweeps (`disagg`, `disagg-multinode`,
# points 1 and 4) took 12-19 min at load 15-50, too long for CI's budget. `nox -s pipeline -- --stack
# dev-cpu` runs them all. Selecting disagg-multinode-acc runs its reference, agg-acc, too.
DISAGG_CI_RECIPES = "disagg-multinode-acc"
DISAGG_TIMEOUT_S = 1200


def _run_disaggregated(image_ref: str) -> dict:
    run_id = f"e2e-disagg-{uuid.uuid4().hex[:8]}"
    run_dir = ROOT / "build" / STACK / "runs" / run_id
    t0 = time.monotonic()
    argv = _cli("pipeline", "--stack", STACK, "--image", image_ref, "--run-id", run_id, "--recipes", DISAGG_CI_RECIPES)
    running = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with stopped_on_exit(running):
        try:
            out, err = running.communicate(timeout=DISAGG_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # A hung job (a lost response) must not hold the node for the rest of CI.
            out, err = stop(running)
            err += f"\n(test: no result after {DISAGG_TIMEOUT_S} s: stopped, exit status {running.returncode})"
    proc = subprocess.CompletedProcess(argv, running.returncode, out, err)
    wall = time.monotonic() - t0
    print(f"disaggregated pipeline through srtctl: {wall:.0f} s (load {os.getloadavg()[0]:.1f})")
    return {"proc": proc, "dir": run_dir, "wall": wall,
            "results": json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists()
            else None}


# Dynamo's own words for a worker its etcd lease let go: the machine starved the worker, etcd and the
# frontend together (in the fresh-clone run of e7c9cb3 every log of the job went silent for 4 minutes,
# the KV pull took 250 s and etcd answered a read in 11 s), not an answer that differs.
_STARVED = re.compile(r"Unable to maintain lease|Keep-alive lease expired")


def _starved(run_dir: Path) -> bool:
    return any(_STARVED.search(log.read_text(errors="replace"))
               for log in run_dir.glob("**/srtctl-outputs/*/logs/node*_*.out"))


@pytest.fixture(scope="module")
def disagg_run(image_ref, srtctl_cluster):
    """The dev-cpu pipeline as the acceptance runs it (its own runner: local), narrowed to the
    disaggregated accuracy recipe, which goes to srtctl: Dynamo's frontend, prefill and decode workers.
    Run again once, saying so, only when a failed run's logs show a worker lost to a starved etcd
    lease; the second run is the one judged, and it must not show that."""
    first = _run_disaggregated(image_ref)
    result = first
    if first["proc"].returncode != 0 and _starved(first["dir"]):
        print(f"the first run lost a worker to its etcd lease (starved machine), kept in {first['dir']}: once more")
        result = _run_disaggregated(image_ref)
    yield result
    # A failed run keeps srt-slurm's logs (infra, frontend, workers) for whoever reads the failure.
    for attempt in {id(first): first, id(result): result}.values():
        if not os.environ.get("SERVESTACK_KEEP_E2E") and attempt["proc"].returncode == 0:
            shutil.rmtree(attempt["dir"], ignore_errors=True)


def _srtctl_log_lines(run_dir: Path, most: int = 12) -> str:
    """What srt-slurm's logs of a failed run say about it: the warnings and errors of the frontend
    and each worker (CI shows a failing test's message, not the run directory it kept)."""
    wanted = re.compile(r"WARN|ERROR|Error|error|lease|Removed|Traceback|Killed|exit", re.ASCII)
    parts = []
    for log in sorted(run_dir.glob("**/srtctl-outputs/*/logs/*.out")):
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        lines = [line[:300] for line in text.splitlines() if wanted.search(line)]
        parts.append(f"--- {log.name}: {len(lines)} such lines, the last {min(most, len(lines))}\n"
                     + "\n".join(lines[-most:]))
    return "\n".join(parts)


def test_the_oracle_holds_the_multinode_disaggregated_recipe_to_the_aggregated_one(disagg_run, srtctl_cluster):
    proc, results = disagg_run["proc"], disagg_run["results"]
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-2000:] + "\n"
                                  + _srtctl_log_lines(disagg_run["dir"]))
    assert "accuracy: PASS" in proc.stdout
    assert results["passed"]
    [acc] = results["stages"]
    assert acc["stage"] == "accuracy" and acc["verdict"]["passed"]
    # The pipeline's runner is local: the aggregated reference ran there, the disaggregated recipe
    # was routed to srtctl by its shape.
    runners = {j["recipe"]: j["runner"] for j in acc["jobs"]}
    assert runners == {"agg-acc": "local", "disagg-multinode-acc": "srtctl"}, acc["jobs"]
    [a] = acc["accuracy"]
    assert a["recipe"] == "disagg-multinode-acc" and a["accuracy"] == 1.0 and a["errors"] == 0 and a["n"] >= 12
    [c] = acc["agreement"]
    assert c["reference"] == "agg-acc" and c["passed"] and c["compared_tokens"] > 0
    assert [row["length"] for row in c["rows"]][:2] == [1, 2]  # the one-token prefills on both sides
    [check] = acc["verdict"]["checks"]
    assert check["gate"] == "agreement" and check["measured"] == check["required"] == c["requests"]
    report = (disagg_run["dir"] / "report.md").read_text()
    assert "Agreement of `disagg-multinode-acc` with `agg-acc`" in report
    assert [a["state"] for j in acc["jobs"] for a in j["attempts"]] == ["COMPLETED", "COMPLETED"]
    # srt-slurm's own run: etcd and NATS, Dynamo's frontend, one prefill and one decode worker
    # (dynamo.vllm, NixlConnector with CPU KV buffers), the oracle's answers as a custom benchmark.
    job = next(j for j in acc["jobs"] if j["recipe"] == "disagg-multinode-acc")
    out = disagg_run["dir"] / "accuracy" / "disagg-multinode-acc" / ".jobs" / "srtctl-outputs" / job["attempts"][0]["job_id"]
    logs = out / "logs"
    # srtctl placed them as production's recipes are placed: the head node holds etcd, NATS and the
    # frontend; prefill and decode have a node each; every address a worker was given is a node's.
    where = job["attempts"][0]["placement"]
    assert where["nodes"] == {"infra": "node1", "head": "node1", "frontend_0": "node1",
                              "prefill_w0": "node2", "decode_w0": "node3"}, where
    assert where["addresses"] == {"node1": "10.213.0.11", "node2": "10.213.0.12", "node3": "10.213.0.13"}
    assert {a["variable"] for a in where["advertised"]} >= {"HEAD_NODE_IP", "ETCD_ENDPOINTS", "NATS_SERVER",
                                                           "VLLM_NIXL_SIDE_CHANNEL_HOST"}
    assert not [a for a in where["advertised"] if a.get("problem")], where["advertised"]
    kv = where["kv_transfers"]
    assert kv["from"] == ["node2"] and kv["to"] == ["node3"] and kv["successful"] > 0 and kv["failed"] == 0, kv
    assert "node1: frontend_0, head, infra; node2: prefill_w0; node3: decode_w0; KV " in report
    for name in ("infra.out", "node1_frontend_0.out", "node2_prefill_w0.out", "node3_decode_w0.out"):
        assert (logs / name).exists(), name
    sweep = next(logs.glob("sweep_*.log")).read_text()
    for mode in ("prefill", "decode"):
        assert f"--disaggregation-mode {mode}" in sweep
    assert "-m dynamo.vllm" in sweep and '"kv_buffer_device": "cpu"' in sweep and "NixlConnector" in sweep
    assert "--language-model-only" in sweep and "--mamba-ssm-cache-dtype bfloat16" in sweep
    # The cluster's setup script pinned the prefill worker to the last CPU and decode to the others
    # (srt-slurm's fingerprint of each worker, taken in its shell after the setup script).
    cpus = {mode: json.loads((logs / f"fingerprint_{mode}_w0.json").read_text())["cpu"] for mode in ("prefill", "decode")}
    assert cpus["prefill"]["affinity_list"] == str(os.cpu_count() - 1), cpus
    assert cpus["decode"]["affinity_cpus"] == cpus["decode"]["logical_cpus"] - 1, cpus
    # The KV cache moved: vLLM's NixlConnector on the decode side counts its pulls from prefill.
    decode = (logs / "node3_decode_w0.out").read_text()
    transfers = [int(n) for n in re.findall(r"KV Transfer metrics: Num successful transfers=(\d+)", decode)]
    assert transfers and sum(transfers) > 0
    assert not [int(n) for n in re.findall(r"Num failed transfers=(\d+)", decode) if int(n)]
    assert "GDN prefill kernel" in decode  # the hybrid's Gated DeltaNet layers ran on the decode side too
    # Dynamo's discovery kept both workers for the whole run (an etcd lease that lapsed under load
    # dropped the decode worker: "Removed worker set", then 404s), and every error the frontend sent
    # is one the oracle's answers record as a failed warm-up attempt or a refused, re-asked prompt.
    frontend = re.sub(r"\x1b\[[0-9;]*m", "", (logs / "node1_frontend_0.out").read_text())  # Dynamo colours its log
    answers = json.loads((logs / "accuracy" / "agreement.json").read_text())
    recorded = answers["warmup"]["failed_attempts"] + answers["refused_attempts"]
    assert "Removed worker set" not in frontend
    assert len(re.findall(r"http response sent status=5\d\d", frontend)) <= recorded, frontend[-3000:]
    assert not set(_job_ids(acc)) & _squeue_ids(srtctl_cluster.slurm_env)


# ----------------------------------------------------------------------------- a gate that cannot be met

IMPOSSIBLE_GATE = {"tolerance": 0.0, "baselines": {"agg": {1: 1e9}}}  # a billion tokens/s on two cores


@pytest.fixture(scope="module")
def gated_run(slurm_run, tmp_path_factory):
    """The slurm run's points held to a gate no CPU meets: the same pipeline with that gate, rerun
    with the run's own id, resumes it (every point has its file), so it measures nothing again and
    only the verdict changes, as for a team that tightens a gate after a run."""
    import yaml

    root = tmp_path_factory.mktemp("gated")
    (root / "pipelines").mkdir()
    for name in ("recipes", "data", "pins"):  # pins/: --stack names a stack the project has
        (root / name).symlink_to(ROOT / name)
    pipeline = yaml.safe_load((ROOT / "pipelines" / f"{STACK}.yaml").read_text())
    pipeline["runner"]["kind"] = "slurm"
    pipeline["stages"]["throughput"]["gate"] = IMPOSSIBLE_GATE
    (root / "pipelines" / "gate.yaml").write_text(yaml.safe_dump(pipeline))
    run_dir = root / "build" / STACK / "runs" / "gate"
    run_dir.mkdir(parents=True)
    shutil.copytree(slurm_run["dir"] / "throughput", run_dir / "throughput")
    events_before = (run_dir / "throughput" / "agg" / ".timing.jsonl").read_text().splitlines()
    proc = subprocess.run(_cli("throughput", "--stack", STACK, "--pipeline", "gate", "--image", slurm_run["image"],
                               "--run-id", "gate", "--recipes", AGGREGATED, project=root),
                          capture_output=True, text=True, timeout=600)
    out_dir = run_dir / "throughput" / "agg"
    return {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "out_dir": out_dir, "events_before": events_before,
            "measured": slurm_run["results"]["stages"][0]["throughput"],
            "results": json.loads((out_dir.parent / "results.json").read_text())}


def test_impossible_gate_fails_with_a_verdict_naming_recipe_point_and_numbers(gated_run):
    assert gated_run["rc"] == 1, gated_run["out"]
    results = gated_run["results"]
    assert not results["passed"]
    [failure] = results["verdict"]["failures"]
    measured = next(p for p in results["throughput"] if p["concurrency"] == 1)["tokens_per_s_per_gpu"]
    assert failure["gate"] == "throughput" and failure["recipe"] == "agg" and failure["point"] == "c=1"
    assert failure["measured"] == pytest.approx(measured) and failure["required"] == 1e9
    line = f"FAIL throughput    agg c=1: {measured:.1f} tok/s/GPU < 1000000000.0 (baseline 1000000000.0 - 0%)"
    assert line in gated_run["out"], gated_run["out"]
    assert "throughput: FAIL (1 failure)" in gated_run["out"]
    report = (gated_run["out_dir"].parent / "report.md").read_text()
    assert "**FAIL**" in report and line.strip() in report


def test_a_rerun_with_the_same_run_id_measures_nothing_again(gated_run):
    # The numbers judged are the slurm run's, point for point; no job was submitted, no server started.
    assert ({p["concurrency"]: p["tokens_per_s_per_gpu"] for p in gated_run["results"]["throughput"]}
            == {p["concurrency"]: p["tokens_per_s_per_gpu"] for p in gated_run["measured"]})
    events = (gated_run["out_dir"] / ".timing.jsonl").read_text().splitlines()
    new = [json.loads(line) for line in events[len(gated_run["events_before"]):]]
    assert not [e for e in new if e["event"] in ("server", "point")], new
    assert not [a for j in gated_run["results"]["jobs"] for a in j["attempts"]], gated_run["results"]["jobs"]


# ----------------------------------------------------------------------------- measured alongside

SESSION_PIPELINE = """
stack: dev-cpu
runner: {{kind: local, python: python3}}
model_paths: {{tiny-qwen35: /opt/servestack/models/servestack/tiny-qwen35}}
data_dir: {data}
server: {{port: 8000, startup_timeout: 10m, extra_flags: {flags}}}
stages:
  throughput:
    recipes: [agg]
    time_limit: 20m
    concurrencies: [1, 4]
    input_len: 64
    output_len: 16
    prompts_per_concurrency: 4
    min_prompts: 8
    gate: {{regression_threshold: 0.25, min_rounds: 3, max_rounds: 10}}
"""
# max_rounds: the fresh-clone CI run of bbb1ea7 (load 3.5 on 2 cores) left the A/A point at c=4
# undecided after 6 rounds, "about 9 rounds in all would decide it at this spread"; a decided point
# is measured no more, so the larger budget costs only where the spread needs it (about 20 s a round).


@pytest.fixture(scope="module")
def alongside(image_ref, tmp_path_factory):
    """One interleaved session of three servers, the server starts the stored A/A and A/B tests
    used: the image (a), the same image again (a2), and the image with its batch capped to one
    sequence (b: c=4 slows, c=1 not). Rounds A, A', B then B, A', A per point until decided."""
    from servestack.stages import interleave
    from servestack.stages.pipeline import load_pipeline

    root = tmp_path_factory.mktemp("alongside")
    (root / "pipelines").mkdir()
    (root / "recipes").symlink_to(ROOT / "recipes")
    data = ROOT / "data" / "gsm8k"
    for name, flags in (("reference", "{}"), ("capped", "{max-num-seqs: 1}")):
        (root / "pipelines" / f"{name}.yaml").write_text(SESSION_PIPELINE.format(data=data, flags=flags))
    project = Project(root=root)
    policy = load_pipeline(project.pipelines / "reference.yaml", root).stages.throughput.gate.policy()
    arms = (interleave.Arm(name="a", image=image_ref, pipeline="reference"),
            interleave.Arm(name="a2", image=image_ref, pipeline="reference"),
            interleave.Arm(name="b", image=image_ref, pipeline="capped"))
    out = root / "session"
    t0 = time.monotonic()
    session = interleave.measure(project, arms, out, policy=policy)
    print(f"session: {time.monotonic() - t0:.0f} s (load {os.getloadavg()[0]:.1f}): "
          + "; ".join(f"{d.arm} c={d.concurrency} {d.verdict} in {d.rounds} rounds, {d.seconds:.0f} s"
                      for d in session.decided))
    return {"session": session, "out": out, "policy": policy, "image": image_ref}


def test_an_a_a_measured_alongside_is_no_regression_at_every_point(alongside):
    from servestack.stages import interleave

    aa = interleave.compared(alongside["session"], STACK, ("A", "A again"), alongside["out"], alongside["policy"],
                             arms=("a", "a2"))
    assert aa.alongside and not aa.not_compared
    assert [(ch.concurrency, ch.verdict) for ch in aa.gated()] == [(1, "no regression"), (4, "no regression")], [
        ch.reason for ch in aa.gated()]
    # Each server was stopped in order, in vLLM's drain mode: its requests completed and its workers
    # exited gracefully, and nothing died before the shutdown began. (vLLM 0.31's AsyncLLM output
    # handler can still log EngineDeadError after a completed drain: 1 of 3 servers under CI's load.)
    for arm in ("a", "a2", "b"):
        log = (alongside["out"] / arm / "agg" / "server.log").read_text()
        assert "mode=drain" in log and "all workers exited gracefully" in log, arm
        assert "EngineDeadError" not in log.split("[shutdown] API server: shutdown triggered")[0], arm


def test_a_capped_batch_measured_alongside_is_a_regression_where_it_slows(alongside, tmp_path):
    from servestack.compare import comparisons
    from servestack.stages import interleave

    ab = interleave.compared(alongside["session"], STACK, ("A", "capped"), alongside["out"], alongside["policy"],
                             arms=("a", "b"))
    gated = {ch.concurrency: ch for ch in ab.gated()}
    assert gated[4].verdict == "regression" and gated[4].high < -0.25, gated[4]
    assert gated[1].verdict != "regression", gated[1]
    report = comparisons.write(ab, tmp_path, [d.__dict__ for d in alongside["session"].decided]).read_text()
    assert "FAIL agg c=4: regression: tokens_per_s_per_gpu -" in report and "measured alongside (interleaved)" in report
    assert (tmp_path / "comparison.png").read_bytes()[:8] == PNG


def test_a_change_of_the_thresholds_size_is_never_no_regression(alongside):
    """The capped batch's real pairs at c=4, judged against a threshold the size of the change they
    show: the interval straddles it, so the verdict is undecided (or regression), never a pass."""
    from dataclasses import replace

    from servestack.stages import interleave

    policy = alongside["policy"]
    ab = interleave.compared(alongside["session"], STACK, ("A", "capped"), alongside["out"], policy, arms=("a", "b"))
    [c4] = [ch for ch in ab.gated() if ch.concurrency == 4]
    at_its_size = replace(policy, threshold=abs(c4.change))
    again = interleave.compared(alongside["session"], STACK, ("A", "capped"), alongside["out"], at_its_size,
                                arms=("a", "b"))
    [judged] = [ch for ch in again.gated() if ch.concurrency == 4]
    assert judged.verdict in ("regression", "undecided"), judged


def test_a_stored_baseline_is_labelled_not_measured_alongside(slurm_run, tmp_path):
    """The slurm run held to itself as a stored baseline (no server started): one repeat a side is
    undecided (exit 5), and the report says the sides were not measured alongside."""
    proc = subprocess.run(_cli("compare", "--stack", STACK, str(slurm_run["dir"]), str(slurm_run["dir"]),
                               "--out", str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "**not measured alongside** (a stored baseline)" in proc.stdout
    assert "FAIL agg c=1: undecided: tokens_per_s_per_gpu" in proc.stdout
    assert json.loads((tmp_path / "comparison.json").read_text())["measured"] == "not measured alongside"
