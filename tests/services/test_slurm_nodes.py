"""The multi-node cluster's layout, read without starting it: names, addresses, config, node views."""

from __future__ import annotations

import ipaddress

import pytest

from servestack.errors import ServestackError
from servestack.services import netns, slurm_nodes
from servestack.services.pull_registry import _registry_conf


def test_nodes_are_numbered_with_addresses_on_the_cluster_network_only():
    nodes = netns.nodes(3)
    assert [(n.name, n.address, n.netns, n.veth) for n in nodes] == [
        ("node1", "10.213.0.11", "servestack-node1", "ssv-node1"),
        ("node2", "10.213.0.12", "servestack-node2", "ssv-node2"),
        ("node3", "10.213.0.13", "servestack-node3", "ssv-node3")]
    assert all(ipaddress.ip_address(n.address) in netns.NETWORK for n in nodes)
    assert netns.HOST_ADDRESS == "10.213.0.1"
    with pytest.raises(ServestackError, match="expected 1 to 32"):
        netns.nodes(0)


def test_every_node_resolves_every_other_and_the_login_node_on_the_cluster_network():
    text = netns.hosts_file(netns.nodes(2), "login")
    assert text.splitlines()[2:] == ["10.213.0.1\tlogin", "10.213.0.11\tnode1", "10.213.0.12\tnode2"]


def test_a_node_runs_its_command_in_its_namespace_under_its_name_with_its_own_disk(tmp_path):
    node = netns.Node.numbered(2)
    argv = netns.node_argv(node, ["slurmd", "-D"], [(tmp_path / "local", tmp_path / "shared")], tmp_path / "hosts")
    assert argv[1] == "--net=/run/netns/servestack-node2" and argv[3:7] == ["--uts", "--mount", "--propagation", "private"]
    script = argv[argv.index("-c") + 1]
    assert script.startswith("hostname node2 && mount --bind ")
    assert f"mount --bind {tmp_path / 'local'} {tmp_path / 'shared'}" in script and script.endswith('exec "$@"')
    assert argv[-2:] == ["slurmd", "-D"]


def test_the_cluster_config_names_each_node_by_its_address_and_fails_jobs_of_a_lost_node(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_STATE", str(tmp_path))
    conf = slurm_nodes._conf(netns.nodes(3), "CPUs=2 RealMemory=1000")
    lines = conf.splitlines()
    assert [line for line in lines if line.startswith("NodeName=")] == [
        f"NodeName=node{i} NodeAddr=10.213.0.1{i} CPUs=2 RealMemory=1000 State=UNKNOWN" for i in (1, 2, 3)]
    assert any(line.startswith("SlurmctldHost=") and line.endswith("(10.213.0.1)") for line in lines)
    # Its own controller port (beside the one-node cluster), per-node spool, pidfile and log.
    assert "SlurmctldPort=6917" in lines and f"SlurmdSpoolDir={tmp_path}/slurm-nodes/%n/spool" in lines
    assert f"SlurmdLogFile={tmp_path}/slurm-nodes/%n/slurmd.log" in lines
    # A lost node fails its job, and the pipeline's policy (not Slurm's requeue) retries it.
    assert "JobRequeue=0" in lines and "SlurmdTimeout=20" in lines


def test_the_pull_registry_listens_where_its_nodes_reach_it(tmp_path):
    conf = _registry_conf(tmp_path / "storage", tmp_path / "token.crt", netns.HOST_ADDRESS)
    assert 'addr: "10.213.0.1:5001"' in conf and 'realm: "http://10.213.0.1:5002/token"' in conf
    assert "127.0.0.1" not in conf
