"""A one-node Slurm cluster (slurmctld, slurmd) with this host's real CPUs and memory.

GPUs and Slurm: the generated node is CPU-only. On a GPU machine one would add
`GresTypes=gpu` to slurm.conf, `Gres=gpu:<N>` to the NodeName line and a `gres.conf` with
`NodeName=<host> Name=gpu File=/dev/nvidia[0-N]` (or `AutoDetect=nvml`); without device
files, `Gres=gpu:N` plus `gres.conf` `Name=gpu Count=N` schedules GPUs by count only.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from servestack.errors import ServestackError
from servestack.services.daemons import (
    exclusive,
    kill_pidfile,
    log_tail,
    pid_alive,
    require,
    spawn_detached,
    wait_until,
)
from servestack.services.munge import ensure_munge
from servestack.services.slurm_layout import Layout, common_conf, tail_conf
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import TimeoutExpired, run
from servestack.util.project import state_home


def _slurm_dir() -> Path:
    return state_home() / "slurm"


def _node_hardware() -> str:
    """This host's real layout as slurmd sees it: `CPUs=.. Boards=.. ... RealMemory=..`."""
    out = run([require("slurmd"), "-C"], timeout=10).stdout
    first = next((line for line in out.splitlines() if line.startswith("NodeName=")), None)
    if first is None:
        raise ServestackError(f"`slurmd -C` printed no NodeName line:\n{out}")
    return " ".join(field for field in first.split() if not field.startswith("NodeName="))


def _slurm_conf(node: str, hardware: str) -> str:
    d = _slurm_dir()
    return "\n".join(
        [
            "# Written by servestack.services.ensure_slurm; regenerated when it differs.",
            "ClusterName=servestack",
            f"SlurmctldHost={node}(127.0.0.1)",
            *common_conf(d),
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            *tail_conf(d),
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            # SPANK plugins (pyxis) are added by servestack.cluster as files in plugstack.conf.d,
            # so adding one never changes slurm.conf (and never restarts the daemons).
            f"PlugStackConfig={d / 'plugstack.conf'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # CPU-only node; see the module docstring for declaring GPUs (GresTypes/Gres).
            f"NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN",
            # Benchmark stages can run for hours: no time limit.
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE DefaultTime=INFINITE State=UP",
            "",
        ]
    )


def _node_name() -> str:
    # slurmd finds its own NodeName line by the short hostname.
    return socket.gethostname().split(".")[0]


def _node_states(env: dict[str, str]) -> dict[str, str]:
    """Every node's state as sinfo reports it ('idle', 'mixed', 'down*', ...); {} if sinfo cannot tell."""
    try:
        proc = run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, check=False, timeout=10)
    except TimeoutExpired:
        return {}
    if proc.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if len(line.split()) == 2)


def _node_state(env: dict[str, str], node: str) -> str:
    return _node_states(env).get(node, "")


_USABLE_NODE_STATES = ("idle", "mixed", "allocated", "completing")


def ensure_slurm(timeout: float = 60.0, nodes: int = 1) -> dict[str, str]:
    """A Slurm cluster on this machine (munged, slurmctld and a slurmd per node), started if needed.

    One node (the default): this host itself, with its real CPUs and memory. More: that many nodes,
    each in a network namespace of its own (`services.netns`), with its own host name, address,
    slurmd, spool and log, and the host's CPUs and memory; slurmctld on this host's cluster address
    (`slurm_nodes`). Returns the environment Slurm clients need (SLURM_CONF); pass it to
    sbatch/sinfo/scancel. When the config is unchanged and every node is usable, nothing is touched.
    """
    if nodes != 1:
        from servestack.services.slurm_nodes import layout

        return _ensure(layout(nodes, _node_hardware()), timeout)
    d = _slurm_dir()
    conf = d / "slurm.conf"
    slurmd = require("slurmd")
    node = _node_name()
    return _ensure(Layout(directory=d, conf_text=_slurm_conf(node, _node_hardware()), env={"SLURM_CONF": str(conf)},
                           slurmds=[(node, d / "slurmd.pid", [slurmd, "-D", "-f", str(conf)])]), timeout)


def _ensure(layout: Layout, timeout: float) -> dict[str, str]:
    slurmctld, slurmd = require("slurmctld"), require("slurmd")
    d = layout.directory
    conf = d / "slurm.conf"
    env = layout.env
    wanted = layout.conf_text

    def up_to_date() -> bool:
        try:
            same = conf.read_text() == wanted
        except OSError:
            return False
        if not (same and pid_alive(d / "slurmctld.pid", slurmctld)
                and all(pid_alive(pidfile, slurmd) for _, pidfile, _ in layout.slurmds)):
            return False
        # sinfo marks a node that stopped answering with a trailing '*': not usable.
        states = _node_states(env)
        return all(states.get(name, "") in _USABLE_NODE_STATES for name, _, _ in layout.slurmds)

    if up_to_date():
        return env
    ensure_munge()
    with exclusive(f"slurm-{d.name}"):
        if up_to_date():
            return env
        for sub in ("state", "spool", "plugstack.conf.d"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        plugstack = f"include {d / 'plugstack.conf.d'}/*.conf\n"
        if not (d / "plugstack.conf").exists() or (d / "plugstack.conf").read_text() != plugstack:
            atomic_write_text(d / "plugstack.conf", plugstack)
        # A `required` SPANK plugin whose runtime directory is gone (a cleared state dir) makes slurmd
        # refuse to start; the directories are ours to make, so make them before starting it.
        for drop_in in sorted((d / "plugstack.conf.d").glob("*.conf")):
            for runtime in re.findall(r"\bruntime_path=(\S+)", drop_in.read_text()):
                Path(runtime).mkdir(parents=True, exist_ok=True)
        changed = not conf.exists() or conf.read_text() != wanted
        if changed:
            atomic_write_text(conf, wanted)
            # A running daemon keeps its old config: restart them all, keeping the saved job state.
            for _, pidfile, _ in layout.slurmds:
                kill_pidfile(pidfile, slurmd)
            kill_pidfile(d / "slurmctld.pid", slurmctld)
            layout.stop_nodes()
            wait_until(
                lambda: not any(pid_alive(pidfile, slurmd) for _, pidfile, _ in layout.slurmds)
                and not pid_alive(d / "slurmctld.pid", slurmctld),
                what="old Slurm daemons to stop",
                timeout=20,
                log_path=d / "slurmctld.log",
            )
        layout.prepare_cluster()
        if not pid_alive(d / "slurmctld.pid", slurmctld):
            # Every daemon stays in the foreground (-D), so an exit shows in `proc`, in a session of its
            # own (spawn_detached) that outlives this process; they write the pidfiles slurm.conf names.
            proc = spawn_detached([slurmctld, "-D", "-f", str(conf)], d / "slurmctld.out")
            wait_until(
                lambda: "UP" in run(["scontrol", "ping"], env=env, check=False, timeout=10).stdout,
                what="slurmctld",
                timeout=timeout,
                log_path=d / "slurmctld.log",
                proc=proc,
            )
        started: dict[str, float] = {}
        for name, pidfile, argv in layout.slurmds:
            if pid_alive(pidfile, slurmd):
                continue
            layout.prepare_node(name)
            pidfile.parent.mkdir(parents=True, exist_ok=True)
            started[name] = time.time()
            proc = spawn_detached(argv, pidfile.parent / "slurmd.out")
            wait_until(
                lambda: pid_alive(pidfile, slurmd),  # noqa: B023 (called before the next iteration)
                what=f"slurmd of {name}",
                timeout=timeout,
                log_path=pidfile.parent / "slurmd.log",
                proc=proc,
            )
        for name, pidfile, _ in layout.slurmds:
            _wait_usable(env, name, timeout, d, pidfile.parent / "slurmd.log", started.get(name))
    return env


def _slurmd_registered_since(env: dict[str, str], node: str, since: float) -> bool:
    """The node's slurmd has registered with slurmctld since `since`: until then a restarted slurmctld
    shows the state it saved ("idle") and a job asking for the node waits for resources."""
    out = run(["scontrol", "-o", "show", "node", node], env=env, check=False, timeout=10).stdout
    started = next((w.split("=", 1)[1] for w in out.split() if w.startswith("SlurmdStartTime=")), "")
    try:
        return time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S")) >= int(since)
    except ValueError:
        return False


def _wait_usable(env: dict[str, str], node: str, timeout: float, d: Path, slurmd_log: Path,
                 started: float | None = None) -> None:
    state = ""

    def node_usable() -> bool:
        nonlocal state
        if started is not None and not _slurmd_registered_since(env, node, started):
            state = "not registered yet"
            return False
        state = _node_state(env, node)
        if state.startswith(("down", "drain")) and not state.endswith("*"):
            # Registered but held down by an old reason (e.g. "Not responding" from a past
            # run): we have just started it, so put it back in service.
            run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env, check=False, timeout=10)
        return state in _USABLE_NODE_STATES

    try:
        wait_until(node_usable, what=f"Slurm node {node} (idle)", timeout=timeout, log_path=slurmd_log)
    except ServestackError as e:
        raise ServestackError(f"{e}\nnode state: {state!r}\n{log_tail(d / 'slurmctld.log', 15)}") from None
