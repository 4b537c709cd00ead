"""A Slurm cluster of three nodes on this machine, as a GPU cluster's nodes are to a job.

Each node is a network namespace with its own host name, address, slurmd, spool and log; the
jobs' node-local directories (enroot's containers) are their own, the shared file system the same
for all. A node that loses power fails its job (NODE_FAIL) and comes back empty.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

import pytest

from servestack import services
from servestack.services import netns, slurm_nodes
from servestack.util.proc import run
from servestack.util.project import state_home

pytestmark = pytest.mark.e2e

NODES = 3


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    t0 = time.monotonic()
    env = services.ensure_slurm(nodes=NODES)
    print(f"three-node cluster up in {time.monotonic() - t0:.1f} s")
    return env


def _srun(env: dict[str, str], *argv: str, nodes: int = NODES, timeout: float = 60) -> list[str]:
    proc = run(["srun", "--quiet", f"-N{nodes}", "--ntasks-per-node=1", "-l", *argv], env=env, timeout=timeout)
    return sorted(proc.stdout.strip().splitlines())


def _job_state(env: dict[str, str], job: str) -> str:
    out = run(["scontrol", "show", "job", job, "-o"], env=env, check=False).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_each_node_has_its_own_name_and_cluster_address(cluster_env):
    seen = [line.split(": ", 1)[1].split() for line in _srun(cluster_env, "sh", "-c", "echo $(hostname) $(hostname -I)")]
    assert [name for name, *_ in seen] == ["node1", "node2", "node3"]
    for _name, *addresses in seen:
        [address] = addresses  # one address, never loopback, on the cluster network
        assert ipaddress.ip_address(address) in netns.NETWORK and address != netns.HOST_ADDRESS


def test_nodes_reach_each_other_by_name_and_nothing_outside(cluster_env, tmp_path: Path):
    # node2 listens on its own address; node1 reaches it by host name (the cluster's hosts file).
    script = tmp_path / "reach.sh"
    script.write_text(
        "#!/bin/bash\n"
        "srun -N1 -w node2 --overlap python3 -c 'import socket; s=socket.create_server((\"node2\", 7777)); "
        "c,_=s.accept(); c.sendall(b\"hello from \"+socket.gethostname().encode())' &\n"
        "sleep 2\n"
        "srun -N1 -w node1 --overlap python3 -c 'import socket; print(socket.create_connection((\"node2\", 7777)).recv(64).decode())'\n"
        "srun -N1 -w node1 --overlap sh -c 'ip route get 1.1.1.1 2>&1 || true'\n"
        "wait\n")
    out = tmp_path / "reach.out"
    job = run(["sbatch", "--parsable", "-N2", "-w", "node1,node2", "-o", str(out), str(script)],
              env=cluster_env).stdout.strip()
    _wait(lambda: _job_state(cluster_env, job) in ("COMPLETED", "FAILED"), 60, "the job")
    text = out.read_text()
    assert "hello from node2" in text, text
    assert "Network is unreachable" in text, text  # no route out of the cluster network


def test_enroot_keeps_containers_per_node_and_images_shared(cluster_env):
    data, images = state_home() / "enroot" / "data", state_home() / "enroot" / "images"
    lines = _srun(cluster_env, "sh", "-c", f"mkdir -p {images} && touch {data}/mine-$(hostname) && ls {data} | tr '\\n' ' '"
                  f" && test -d {images} && echo images-shared")
    for line in lines:
        task, listing = line.split(": ", 1)
        node = f"node{int(task) + 1}"
        assert f"mine-{node}" in listing and listing.count("mine-") == 1, lines  # its own, not the others'
        assert (slurm_nodes.node_local(node) / "enroot" / "data" / f"mine-{node}").exists()
    assert not list(data.glob("mine-*"))  # the host's (and the one-node cluster's) directory untouched


def test_a_node_that_loses_power_fails_its_job_and_comes_back_empty(cluster_env, tmp_path: Path):
    job = run(["sbatch", "--parsable", "-N3", "-o", str(tmp_path / "job.out"), "--wrap", "srun sleep 600"],
              env=cluster_env).stdout.strip()
    _wait(lambda: _job_state(cluster_env, job) == "RUNNING", 60, "the job to run")
    _wait(lambda: len(netns.pids(netns.Node.numbered(3).netns)) > 1, 30, "the job's step on node3")
    t0 = time.monotonic()
    slurm_nodes.lose_node("node3")
    state = _wait(lambda: _job_state(cluster_env, job) == "NODE_FAIL" and "NODE_FAIL", 120, "NODE_FAIL")
    print(f"NODE_FAIL {time.monotonic() - t0:.0f} s after node3 went down")
    assert state == "NODE_FAIL"
    assert netns.pids(netns.Node.numbered(3).netns) == []
    # The job's steps on the other nodes end with it.
    for i in (1, 2):
        _wait(lambda i=i: not [p for p in netns.pids(netns.Node.numbered(i).netns)
                               if "sleep" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")],
              60, f"the job's step on node{i} to end")
    services.ensure_slurm(nodes=NODES)  # the node is power-cycled
    assert _srun(cluster_env, "hostname", nodes=NODES) == ["0: node1", "1: node2", "2: node3"]


def test_torn_down_nothing_is_left_and_it_comes_back(cluster_env):
    slurm_nodes.stop_nodes()
    assert netns.existing_netns() == []
    assert netns.BRIDGE not in run(["ip", "-o", "link", "show"]).stdout
    t0 = time.monotonic()
    services.ensure_slurm(nodes=NODES)
    started = time.monotonic() - t0
    print(f"three-node cluster started from nothing in {started:.1f} s")
    assert _srun(cluster_env, "hostname") == ["0: node1", "1: node2", "2: node3"]
