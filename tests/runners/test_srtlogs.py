"""Where a job ran and what it advertised, read from srt-slurm's own logs (tests/data/srtctl-multinode:
the logs of a three-node disagg-multinode-acc job on this machine, trimmed to the lines read)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fixtures.paths import DATA
from servestack.runners.srtlogs import address_problems, placement
from servestack.stages.gates import placement_failures
from servestack.stages.stage_report import _placed

JOB = DATA / "srtctl-multinode"


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(JOB, tmp_path / "job")
    return tmp_path / "job"


def test_the_nodes_each_process_ran_on_the_addresses_and_the_transfers_between_them():
    where = placement(JOB)
    assert where["nodes"] == {"infra": "node1", "head": "node1", "frontend_0": "node1",
                              "prefill_w0": "node2", "decode_w0": "node3"}
    assert where["addresses"] == {"node1": "10.213.0.11", "node2": "10.213.0.12", "node3": "10.213.0.13"}
    given = {(a["role"], a["variable"]): a["value"] for a in where["advertised"]}
    assert given[("prefill_w0", "VLLM_NIXL_SIDE_CHANNEL_HOST")] == "10.213.0.12"
    assert given[("decode_w0", "ETCD_ENDPOINTS")] == "http://node1:2379"
    assert given[("decode_w0", "NATS_SERVER")] == "nats://node1:4222"
    assert address_problems(where) == []
    assert where["kv_transfers"] == {"successful": 16, "failed": 0, "from": ["node2"], "to": ["node3"]}
    assert _placed({"placement": where}) == ("node1: frontend_0, head, infra; node2: prefill_w0; node3: decode_w0; "
                                             "KV 16 transfers (0 failed) node2 -> node3")


def test_a_loopback_or_foreign_address_given_to_a_worker_is_named_and_fails_the_gate(tmp_path):
    job = _copy(tmp_path)
    sweep = job / "logs" / "sweep_25.log"
    text = sweep.read_text()
    text = text.replace("VLLM_NIXL_SIDE_CHANNEL_HOST=10.213.0.13", "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1", 1)
    text = text.replace("HEAD_NODE_IP=10.213.0.11", "HEAD_NODE_IP=192.0.2.2", 1)
    sweep.write_text(text)
    where = placement(job)
    problems = address_problems(where)
    assert "decode_w0 on node3: VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1: loopback" in problems
    assert any(p.startswith("prefill_w0 on node2: HEAD_NODE_IP=192.0.2.2: not the address of any of the job's nodes")
               for p in problems), problems
    failures = placement_failures([{"recipe": "disagg-multinode-acc", "attempts": [
        {"job_id": "25", "state": "COMPLETED", "placement": where}]}])
    assert {(f.gate, f.recipe, f.point) for f in failures} == {("addresses", "disagg-multinode-acc", "job 25")}


def test_a_completed_disaggregated_job_without_transfers_or_with_failed_ones_fails_the_gate(tmp_path):
    job = _copy(tmp_path)
    decode = job / "logs" / "node3_decode_w0.out"
    decode.write_text("")
    none = placement_failures([{"recipe": "r", "attempts": [{"job_id": "1", "state": "COMPLETED", "placement": placement(job)}]}])
    assert [f.message for f in none] == ["the decode workers counted no KV transfer from prefill"]
    decode.write_text("INFO KV Transfer metrics: Num successful transfers=3, Num failed transfers=2, Avg xfer time (ms)=1.0\n")
    failed = placement_failures([{"recipe": "r", "attempts": [{"job_id": "1", "state": "COMPLETED", "placement": placement(job)}]}])
    assert [f.message for f in failed] == ["2 failed NIXL transfers node2 -> node3"]


def test_a_job_without_srt_slurm_logs_has_no_placement(tmp_path):
    assert placement(tmp_path) == {}
    assert placement_failures([{"recipe": "r", "attempts": [{"job_id": "1", "state": "FAILED", "placement": {}}]}]) == []
