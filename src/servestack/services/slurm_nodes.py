"""A Slurm cluster of several nodes on this machine, as a GPU cluster is laid out.

slurmctld runs on this host (the login node) on the cluster network's host address; each node is
a network namespace (`services.netns`) with its own host name and address, its own slurmd, spool
and log, and the host's CPUs and memory. What enroot keeps per container (its runtime, data and
temporary directories, pyxis's runtime) is node-local, bound over the shared paths in the node's
mount namespace; the squashfs images, cached by digest, are shared as on a cluster's shared file
system, so a digest is imported once for every node.

Its own ports (6917 for slurmctld; each slurmd listens in its own namespace), so it runs beside the
one-node cluster without touching it. `stop_nodes()` tears it down: every process in the nodes'
namespaces, the namespaces, the bridge, slurmctld.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from servestack.services import netns
from servestack.services.daemons import kill_pidfile, pid_alive, require, wait_until
from servestack.services.slurm_layout import Layout, common_conf, tail_conf
from servestack.util.fsutil import atomic_write_text
from servestack.util.project import state_home

CTLD_PORT = 6917


def nodes_dir() -> Path:
    return state_home() / "slurm-nodes"


def node_local(name: str) -> Path:
    """The node's own disk."""
    return nodes_dir() / name


def _login_name() -> str:
    return socket.gethostname().split(".")[0]


def _shared_enroot_paths() -> list[Path]:
    """What enroot and pyxis keep per node: their runtime, containers, temporary files and layers."""
    enroot = state_home() / "enroot"
    return [enroot / "runtime", enroot / "data", enroot / "tmp", enroot / "cache", enroot / "pyxis"]


def _conf(cluster: list[netns.Node], hardware: str) -> str:
    d = nodes_dir()
    return "\n".join(
        [
            "# Written by servestack.services.ensure_slurm(nodes=N); regenerated when it differs.",
            "ClusterName=servestack-nodes",
            f"SlurmctldHost={_login_name()}({netns.HOST_ADDRESS})",
            f"SlurmctldPort={CTLD_PORT}",
            *common_conf(d),
            "SlurmctldTimeout=30",
            # A node that stops answering is marked DOWN, and its jobs NODE_FAIL, after this long.
            "SlurmdTimeout=20",
            *tail_conf(d),
            f"SlurmdSpoolDir={d / '%n' / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / '%n' / 'slurmd.pid'}",
            f"PlugStackConfig={d / 'plugstack.conf'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / '%n' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            *(f"NodeName={n.name} NodeAddr={n.address} {hardware} State=UNKNOWN" for n in cluster),
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE DefaultTime=INFINITE State=UP",
            "",
        ]
    )


def _hosts() -> Path:
    return nodes_dir() / "hosts"


def layout(count: int, hardware: str) -> Layout:
    d = nodes_dir()
    conf = d / "slurm.conf"
    cluster = netns.nodes(count)
    by_name = {n.name: n for n in cluster}
    slurmd = require("slurmd")

    def prepare_cluster() -> None:
        # slurmctld listens on, and its clients reach it at, the bridge's address.
        netns.ensure_bridge()
        hosts = netns.hosts_file(cluster, _login_name())
        if not _hosts().exists() or _hosts().read_text() != hosts:
            atomic_write_text(_hosts(), hosts)

    def prepare_node(name: str) -> None:
        node = by_name[name]
        # A slurmd that died leaves its job steps running in the namespace, and a lost node its
        # containers on its disk: a node comes up empty, as after a reboot.
        netns.remove_netns(node.netns)
        shutil.rmtree(node_local(name) / "enroot", ignore_errors=True)
        netns.ensure_netns(node)
        (node_local(name) / "spool").mkdir(parents=True, exist_ok=True)

    slurmds = []
    for node in cluster:
        local = node_local(node.name)
        binds = [(local / "enroot" / shared.name, shared) for shared in _shared_enroot_paths()]
        argv = netns.node_argv(node, [slurmd, "-D", "-f", str(conf)], binds, _hosts())
        slurmds.append((node.name, local / "slurmd.pid", argv))
    return Layout(directory=d, conf_text=_conf(cluster, hardware), env={"SLURM_CONF": str(conf)}, slurmds=slurmds,
                   prepare_cluster=prepare_cluster, prepare_node=prepare_node, stop_nodes=_remove_namespaces)


def _remove_namespaces() -> None:
    for name in netns.existing_netns():
        netns.remove_netns(name)


def lose_node(name: str) -> None:
    """A node fails mid-job, as a machine that loses power: its link goes down, its slurmd and
    everything it ran stop. Slurm marks it DOWN after SlurmdTimeout, and its jobs NODE_FAIL. The next
    `ensure_slurm(nodes=N)` brings it back, empty (a node is power-cycled)."""
    node = netns.Node.numbered(int(name.removeprefix("node")))
    netns.cut(node)
    netns.kill_all(node.netns)


def stop_nodes(timeout: float = 30.0) -> None:
    """The whole multi-node cluster down: nodes, namespaces, bridge and slurmctld."""
    _remove_namespaces()
    slurmctld = require("slurmctld")
    kill_pidfile(nodes_dir() / "slurmctld.pid", slurmctld)
    wait_until(lambda: not pid_alive(nodes_dir() / "slurmctld.pid", slurmctld), what="slurmctld to stop",
               timeout=timeout, log_path=nodes_dir() / "slurmctld.log")
    netns.remove_bridge()
