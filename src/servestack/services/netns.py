"""Cluster nodes on one machine: each a network namespace with its own host name and address.

A node is what a compute node of a GPU cluster is to the processes Slurm starts there: its own
host name (a UTS namespace), its own address on the cluster network (a network namespace with one
veth on the project's bridge) and its own local disk where enroot keeps containers (a mount
namespace binding node-local directories over the shared paths), while the file system as a
whole, like a cluster's shared one, is the same everywhere: the image cache, the job outputs,
srt-slurm's tree. The bridge holds only our veths and the host's cluster address and has no
route out, so no traffic between nodes leaves the namespaces made here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servestack.errors import ServestackError
from servestack.services.daemons import require
from servestack.util.proc import run

BRIDGE = "ssbr0"
NETWORK = ipaddress.ip_network("10.213.0.0/24")
HOST_ADDRESS = str(NETWORK.network_address + 1)  # the login node (this host) on the cluster network
NETNS_PREFIX = "servestack-"
_FIRST_NODE_HOST = 11  # node1 is .11, node2 .12, ...


@dataclass(frozen=True, kw_only=True)
class Node:
    name: str  # host name and Slurm NodeName
    address: str

    @property
    def netns(self) -> str:
        return NETNS_PREFIX + self.name

    @property
    def veth(self) -> str:
        return "ssv-" + self.name  # the host's end; the node's end is eth0

    @classmethod
    def numbered(cls, index: int) -> Node:
        return cls(name=f"node{index}", address=str(NETWORK.network_address + _FIRST_NODE_HOST + index - 1))


def nodes(count: int) -> list[Node]:
    if not 1 <= count <= 32:
        raise ServestackError(f"a local cluster of {count} nodes: expected 1 to 32")
    return [Node.numbered(i) for i in range(1, count + 1)]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([require("ip"), *args], check=check, timeout=30)


def _links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0]
            for line in _ip("-o", "link", "show").stdout.splitlines() if ":" in line}


def existing_netns() -> list[str]:
    return sorted(line.split()[0] for line in _ip("netns", "list").stdout.splitlines()
                  if line.startswith(NETNS_PREFIX))


def ensure_bridge() -> None:
    """The cluster network's bridge, with this host's cluster address and no route beyond it."""
    if BRIDGE not in _links():
        for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
            words = line.split()
            other = ipaddress.ip_interface(words[3])
            if other.network.overlaps(NETWORK) and words[1] != BRIDGE:
                raise ServestackError(f"the local cluster network {NETWORK} overlaps {other} on {words[1]}")
        _ip("link", "add", BRIDGE, "type", "bridge")
    _allow_between_nodes()
    wanted = f"{HOST_ADDRESS}/{NETWORK.prefixlen}"
    if wanted not in _ip("-o", "-4", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", wanted, "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


_BETWEEN_NODES = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]


def _allow_between_nodes() -> None:
    """Frames between two nodes cross the bridge, and with br_netfilter (dockerd loads it) they go
    through iptables' FORWARD chain, whose policy dockerd sets to DROP: accept what stays on the
    bridge, first in the chain (dockerd inserts its own jumps above; none of them drops it)."""
    iptables = require("iptables")
    if run([iptables, "-w", "-C", *_BETWEEN_NODES], check=False, timeout=30).returncode != 0:
        run([iptables, "-w", "-I", *_BETWEEN_NODES], timeout=30)


def _disallow_between_nodes() -> None:
    iptables = require("iptables")
    while run([iptables, "-w", "-C", *_BETWEEN_NODES], check=False, timeout=30).returncode == 0:
        run([iptables, "-w", "-D", *_BETWEEN_NODES], timeout=30)


def ensure_netns(node: Node) -> None:
    """The node's namespace: loopback and eth0 with its address, its veth on the bridge, up."""
    ensure_bridge()
    if node.netns not in existing_netns():
        _ip("netns", "add", node.netns)
    if node.veth in _links() and _ip("-n", node.netns, "link", "show", "eth0", check=False).returncode != 0:
        _ip("link", "del", node.veth, check=False)  # its peer went with an earlier namespace
    if node.veth not in _links():
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
    _ip("link", "set", node.veth, "master", BRIDGE, "up")
    inside = ("-n", node.netns)
    if f"{node.address}/" not in _ip(*inside, "-o", "-4", "addr", "show", "dev", "eth0").stdout:
        _ip(*inside, "addr", "add", f"{node.address}/{NETWORK.prefixlen}", "dev", "eth0")
    _ip(*inside, "link", "set", "lo", "up")
    _ip(*inside, "link", "set", "eth0", "up")


def pids(netns: str) -> list[int]:
    """Every process in the namespace (slurmd, job steps, workers, their containers)."""
    proc = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()] if proc.returncode == 0 else []


def kill_all(netns: str, timeout: float = 30.0) -> None:
    """SIGKILL everything in the namespace and wait until it is empty: a lost node runs nothing on."""
    deadline = time.monotonic() + timeout
    while left := [p for p in pids(netns) if p != os.getpid()]:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ServestackError(f"network namespace {netns}: processes {left} still running after SIGKILL")
        time.sleep(0.2)


def cut(node: Node) -> None:
    """The node's link to the cluster down: nothing it sends arrives, nothing reaches it."""
    _ip("link", "set", node.veth, "down", check=False)


def remove_netns(netns: str) -> None:
    """Kill what runs in it, then remove it (its veth goes with it)."""
    if netns in existing_netns():
        kill_all(netns)
        _ip("netns", "del", netns)


def remove_bridge() -> None:
    if BRIDGE in _links():
        _ip("link", "del", BRIDGE)
    _disallow_between_nodes()


def node_argv(node: Node, argv: Sequence[str], binds: Sequence[tuple[Path, Path]], hosts: Path) -> list[str]:
    """`argv` run as on the node: in its network namespace, under its host name, with node-local
    directories bound over the shared ones (`binds`: (local, shared)) and the cluster's hosts file.

    nsenter, not `ip netns exec`: that remounts /sys, which hides /sys/fs/cgroup from slurmd.
    """
    steps = [f"hostname {shlex.quote(node.name)}", f"mount --bind {shlex.quote(str(hosts))} /etc/hosts"]
    for local, shared in binds:
        steps += [f"mkdir -p {shlex.quote(str(local))} {shlex.quote(str(shared))}",
                  f"mount --bind {shlex.quote(str(local))} {shlex.quote(str(shared))}"]
    script = " && ".join(steps) + ' && exec "$@"'
    return [require("nsenter"), f"--net=/run/netns/{node.netns}", require("unshare"), "--uts", "--mount",
            "--propagation", "private", "--", "/bin/sh", "-c", script, "node", *argv]


def hosts_file(cluster_nodes: Sequence[Node], login_name: str) -> str:
    """/etc/hosts as every node sees it: localhost, the login node's cluster address, each node's."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{HOST_ADDRESS}\t{login_name}"]
    lines += [f"{n.address}\t{n.name}" for n in cluster_nodes]
    return "\n".join(lines) + "\n"
