"""Start the machine services servestack needs, on demand, so nobody starts anything by hand.

One small interface over platform details: `ensure_dockerd()`, `ensure_registry()`,
`ensure_slurm()` and `ensure_binfmt_aarch64()`. Each is idempotent, returns in well under a
second when its service already answers, and otherwise starts it detached (its own session, so
it outlives the caller), waits with a deadline and, on failure, raises ServestackError carrying
the end of the service's log. State and logs live under `project.state_home()`.

The packages come from `.ci/bootstrap` (Debian 12 plus docker from Debian 13). There is no
init system on these machines (containers, CI runners), so we do not use systemctl: we run the
daemons ourselves, as root.

GPUs and Slurm: the generated node is CPU-only. On a GPU machine one would add
`GresTypes=gpu` to slurm.conf, `Gres=gpu:<N>` to the NodeName line and a `gres.conf` with
`NodeName=<host> Name=gpu File=/dev/nvidia[0-N]` (or `AutoDetect=nvml`); without device
files, `Gres=gpu:N` plus `gres.conf` `Name=gpu Count=N` schedules GPUs by count only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import ServestackError
from .fsutil import atomic_write_bytes, atomic_write_text
from .proc import CommandError, run
from .project import state_home

DEFAULT_REGISTRY = "127.0.0.1:5000"
SNAPSHOTTER_DRIVER = "io.containerd.snapshotter.v1"
DOCKER_DAEMON_JSON = Path("/etc/docker/daemon.json")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")

_BOOTSTRAP_HINT = "run .ci/bootstrap (as root) to install it"


# --------------------------------------------------------------------------- helpers


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ServestackError(f"`{tool}` is not installed; {_BOOTSTRAP_HINT}")
    return path


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """Serialise slow paths across processes: parallel tests/sessions must not start a
    service twice. Fast paths run without the lock and re-check under it."""
    path = state_home() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return f"last lines of {path}:\n" + "\n".join(text.strip().splitlines()[-lines:])


def _spawn_detached(argv: Sequence[str], log_path: Path, user: str | None = None) -> subprocess.Popen[bytes]:
    """Start a long-lived daemon in its own session, stdout/stderr appended to log_path.

    Every daemon runs in the foreground (dockerd, registry, `munged -F`, `slurmctld -D`,
    `slurmd -D`): self-daemonising ones fork twice, and on machines whose PID 1 does not reap
    (containers, microVMs) each start would leave zombies behind. In the foreground the daemon
    is simply re-parented when we exit, and an early exit is visible to `_wait_until`.
    Not through proc.run: that waits for the command to finish; a daemon must outlive us.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no controlling terminal, survives our exit/Ctrl-C
            close_fds=True,
            # A GitHub runner kills, at the end of each job, every process whose environment has the
            # job's RUNNER_TRACKING_ID: a shared daemon must not carry it, or each job restarts it.
            env={k: v for k, v in os.environ.items() if k != "RUNNER_TRACKING_ID"},
            user=user,
            group=pwd.getpwnam(user).pw_gid if user else None,
            extra_groups=[] if user else None,
        )


def _wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    log_path: Path,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.1,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        # Our daemons stay in the foreground: any exit means they gave up.
        if proc is not None and proc.poll() is not None:
            raise ServestackError(f"{what} exited with {proc.returncode}\n{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ServestackError(f"{what} not ready after {timeout:.0f} s\n{_log_tail(log_path)}")
        time.sleep(interval)
        interval = min(interval * 1.5, 1.0)


def _pid_alive(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------- docker


def _docker_driver_status() -> dict[str, str] | None:
    """The daemon's DriverStatus, or None when no daemon answers."""
    docker = _require("docker")
    try:
        proc = run([docker, "info", "--format", "{{json .DriverStatus}}"], check=False, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    try:
        pairs = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return {str(k): str(v) for k, v in (pairs or [])}


def _check_snapshotter(status: dict[str, str]) -> None:
    driver = status.get("driver-type", "")
    if driver != SNAPSHOTTER_DRIVER:
        raise ServestackError(
            f"the running Docker daemon does not use the containerd image store "
            f"(driver-type {driver or 'unknown'!r}, need {SNAPSHOTTER_DRIVER!r}); OCI export with "
            f"rewrite-timestamp needs it. Stop that dockerd, set "
            f'{{"features": {{"containerd-snapshotter": true}}}} in {DOCKER_DAEMON_JSON} and start it '
            f"again (or let servestack start it)"
        )


def _write_daemon_json() -> None:
    """Turn the containerd snapshotter on, keeping every other key an admin may have set."""
    try:
        config = json.loads(DOCKER_DAEMON_JSON.read_text()) if DOCKER_DAEMON_JSON.exists() else {}
    except ValueError as e:
        raise ServestackError(f"{DOCKER_DAEMON_JSON}: not valid JSON ({e}); fix or remove it") from e
    if not isinstance(config, dict):
        raise ServestackError(f"{DOCKER_DAEMON_JSON}: expected a JSON object")
    features = config.setdefault("features", {})
    if features.get("containerd-snapshotter") is True:
        return
    features["containerd-snapshotter"] = True
    atomic_write_text(DOCKER_DAEMON_JSON, json.dumps(config, indent=2, sort_keys=True) + "\n")


def ensure_dockerd(timeout: float = 60.0) -> None:
    """A Docker daemon answers and uses the containerd snapshotter (starting one if needed)."""
    status = _docker_driver_status()
    if status is not None:
        _check_snapshotter(status)
        return
    dockerd = _require("dockerd")
    with _lock("dockerd"):
        status = _docker_driver_status()
        if status is None:
            _write_daemon_json()
            log_path = state_home() / "dockerd.log"
            proc = _spawn_detached([dockerd], log_path)

            def ready() -> bool:
                return _docker_driver_status() is not None

            _wait_until(ready, what="dockerd", timeout=timeout, log_path=log_path, proc=proc, interval=0.2)
            status = _docker_driver_status()
            if status is None:
                raise ServestackError(f"dockerd stopped answering right after start\n{_log_tail(log_path)}")
    _check_snapshotter(status)


# --------------------------------------------------------------------------- registry


def _registry_answers(address: str, timeout: float = 0.5) -> bool:
    """True when a Docker/OCI registry answers GET /v2/ (200, or 401 when it wants auth)."""
    # Never through an HTTP(S)_PROXY from the environment: the registry is on loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{address}/v2/", timeout=timeout) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError as e:
        return e.code == 401
    except (OSError, ValueError):
        return False


def _registry_config(address: str, storage: Path, http_extra: str = "", extra: str = "") -> str:
    # Plain YAML written by hand: no dependency for five keys. Paths are quoted in JSON style,
    # which is valid YAML.
    return (
        "version: 0.1\n"
        "log:\n"
        "  level: info\n"
        "storage:\n"
        "  filesystem:\n"
        f"    rootdirectory: {json.dumps(str(storage))}\n"
        "  delete:\n"
        "    enabled: true\n"
        "http:\n"
        f"  addr: {json.dumps(address)}\n"
        + http_extra
        + "health:\n"
        "  storagedriver:\n"
        "    enabled: false\n"
        + extra
    )


def ensure_registry(address: str = DEFAULT_REGISTRY, timeout: float = 30.0) -> str:
    """An OCI registry answers on http://ADDRESS/v2/ (Debian's docker-registry, filesystem
    storage under state_home()/registry, deletes allowed); returns ADDRESS (host:port).

    Whatever already answers /v2/ there is reused, ours or not.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ServestackError(f"registry address {address!r}: expected HOST:PORT, e.g. {DEFAULT_REGISTRY}")
    if _registry_answers(address):
        return address
    binary = _require("docker-registry")
    with _lock(f"registry-{port}"):
        if _registry_answers(address):
            return address
        home = state_home() / "registry" / port
        storage = home / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = home / "config.yml"
        atomic_write_text(config, _registry_config(address, storage))
        log_path = home / "registry.log"
        proc = _spawn_detached([binary, "serve", str(config)], log_path)
        _wait_until(
            lambda: _registry_answers(address),
            what=f"docker-registry on {address}",
            timeout=timeout,
            log_path=log_path,
            proc=proc,
        )
    return address


def _tls_registry_answers(address: str, ca: Path) -> bool:
    """True when a TLS registry answers GET /v2/ with 401 (it wants the htpasswd login) or 200."""
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(f"https://{address}/v2/", timeout=0.5) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError as e:
        return e.code == 401
    except (OSError, ValueError):
        return False


def ensure_tls_registry(address: str, home: Path, *, ca: Path, certificate: Path, key: Path, htpasswd: Path,
                        timeout: float = 30.0) -> Path:
    """Debian's docker-registry on ADDRESS behind TLS (CERTIFICATE/KEY, signed by CA) with htpasswd
    (bcrypt) logins, storage under HOME; what users publish to. Returns its pid file.

    Used by the publish tests: each gets its own, so one can be stopped halfway through a publish.
    """
    if _tls_registry_answers(address, ca):
        return home / "registry.pid"
    binary = _require("docker-registry")
    with _lock(f"tls-registry-{address.rpartition(':')[2]}"):
        if _tls_registry_answers(address, ca):
            return home / "registry.pid"
        storage = home / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = home / "config.yml"
        tls = (f"  tls:\n    certificate: {json.dumps(str(certificate))}\n    key: {json.dumps(str(key))}\n")
        auth = f"auth:\n  htpasswd:\n    realm: servestack\n    path: {json.dumps(str(htpasswd))}\n"
        atomic_write_text(config, _registry_config(address, storage, tls, auth))
        log_path = home / "registry.log"
        proc = _spawn_detached([binary, "serve", str(config)], log_path)
        atomic_write_text(home / "registry.pid", f"{proc.pid}\n")
        _wait_until(lambda: _tls_registry_answers(address, ca), what=f"docker-registry (TLS) on {address}",
                    timeout=timeout, log_path=log_path, proc=proc)
    return home / "registry.pid"


# --------------------------------------------------------------------------- munge + slurm


def _munge_ok() -> bool:
    """munged answers: a credential round-trips through munge | unmunge."""
    if not MUNGE_SOCKET.exists():
        return False
    try:
        cred = run(["munge", "-n"], check=False, timeout=5)
        if cred.returncode != 0:
            return False
        return run(["unmunge"], input=cred.stdout.encode(), check=False, timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _ensure_munge_key() -> None:
    """1024 random bytes, mode 0400, owned by munge (munged refuses looser permissions).

    A key of another size (Debian's postinst writes a 128-byte one) is replaced, but only while
    munged is down: changing the key under a running munged would break every credential.
    """
    try:
        if MUNGE_KEY.stat().st_size == 1024:
            return
    except FileNotFoundError:
        pass
    user = pwd.getpwnam("munge")
    atomic_write_bytes(MUNGE_KEY, os.urandom(1024))
    os.chown(MUNGE_KEY, user.pw_uid, user.pw_gid)
    os.chmod(MUNGE_KEY, 0o400)


def ensure_munge(timeout: float = 15.0) -> None:
    if _munge_ok():
        return
    munged = _require("munged")
    with _lock("munge"):
        if _munge_ok():
            return
        user = pwd.getpwnam("munge")
        # No systemd here to create the runtime dirs (tmpfiles.d): make them, owned by munge.
        for d, mode in ((MUNGE_SOCKET.parent, 0o755), (Path("/var/log/munge"), 0o700), (Path("/var/lib/munge"), 0o711)):
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, user.pw_uid, user.pw_gid)
            os.chmod(d, mode)
        _ensure_munge_key()
        log_path = state_home() / "munged.log"
        # munged runs as the munge user, as its systemd unit does.
        # --force: remove a stale socket left by an earlier munged that died.
        proc = _spawn_detached([munged, "--foreground", "--force"], log_path, user="munge")
        _wait_until(_munge_ok, what="munged", timeout=timeout, log_path=log_path, proc=proc)


def _slurm_dir() -> Path:
    return state_home() / "slurm"


def _node_hardware() -> str:
    """This host's real layout as slurmd sees it: `CPUs=.. Boards=.. ... RealMemory=..`."""
    out = run([_require("slurmd"), "-C"], timeout=10).stdout
    first = next((line for line in out.splitlines() if line.startswith("NodeName=")), None)
    if first is None:
        raise ServestackError(f"`slurmd -C` printed no NodeName line:\n{out}")
    return " ".join(field for field in first.split() if not field.startswith("NodeName="))


def _slurm_conf(node: str, hardware: str) -> str:
    d = _slurm_dir()
    fields = dict(f.split("=", 1) for f in hardware.split())
    cpus = max(int(fields.get("CPUs", "1")), 1)
    mem = int(fields.get("RealMemory", "1024"))
    return "\n".join(
        [
            "# Written by servestack.services.ensure_slurm; regenerated when it differs.",
            "ClusterName=servestack",
            f"SlurmctldHost={node}(127.0.0.1)",
            # Root runs everything: state lives under root's home, and benchmark jobs need root
            # (docker). DisableRootJobs is NO by default; say it so nobody has to look it up.
            "SlurmUser=root",
            "SlurmdUser=root",
            "DisableRootJobs=NO",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # No cgroup v2 delegation in containers/CI: track jobs by process group.
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            # Without a default, a job asking no memory gets the whole node and jobs serialise.
            f"DefMemPerCPU={max(mem // cpus, 1)}",
            # A node that was down (e.g. machine rebooted) comes back by itself.
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=10",
            # Tearing down a pyxis/enroot container (vLLM exiting, squashfuse unmounting) can take
            # minutes on a loaded 2-core node; past this Slurm drains the node ("Kill task failed").
            "UnkillableStepTimeout=300",
            "MinJobAge=300",
            f"StateSaveLocation={d / 'state'}",
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


def _node_state(env: dict[str, str], node: str) -> str:
    """The node's state as sinfo reports it ('idle', 'mixed', 'down*', ...), '' if unknown."""
    try:
        proc = run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], env=env, check=False, timeout=10)
    except subprocess.TimeoutExpired:
        return ""
    if proc.returncode != 0:
        return ""
    return proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""


_USABLE_NODE_STATES = ("idle", "mixed", "allocated", "completing")


def _kill_pidfile(pidfile: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pidfile.read_text().strip()), 15)


def ensure_slurm(timeout: float = 60.0) -> dict[str, str]:
    """One-node Slurm cluster (munged, slurmctld, slurmd) with this host's real CPUs and memory.

    Returns the environment Slurm clients need (SLURM_CONF); pass it to sbatch/sinfo/scancel.
    When slurm.conf is unchanged and the node is usable, nothing is touched.
    """
    slurmctld, slurmd = _require("slurmctld"), _require("slurmd")
    d = _slurm_dir()
    conf = d / "slurm.conf"
    env = {"SLURM_CONF": str(conf)}
    node = _node_name()
    wanted = _slurm_conf(node, _node_hardware())

    def up_to_date() -> bool:
        try:
            same = conf.read_text() == wanted
        except OSError:
            return False
        # sinfo marks a node that stopped answering with a trailing '*': not usable.
        return (
            same
            and _pid_alive(d / "slurmctld.pid")
            and _pid_alive(d / "slurmd.pid")
            and _node_state(env, node) in _USABLE_NODE_STATES
        )

    if up_to_date():
        return env
    ensure_munge()
    with _lock("slurm"):
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
            # A running daemon keeps its old config: restart both, keeping the saved job state.
            for name in ("slurmd", "slurmctld"):
                _kill_pidfile(d / f"{name}.pid")
            _wait_until(
                lambda: not _pid_alive(d / "slurmd.pid") and not _pid_alive(d / "slurmctld.pid"),
                what="old Slurm daemons to stop",
                timeout=20,
                log_path=d / "slurmctld.log",
            )
        if not _pid_alive(d / "slurmctld.pid"):
            # Both daemons fork into the background after start-up (no -D) and write pidfiles.
            proc = _spawn_detached([slurmctld, "-D", "-f", str(conf)], d / "slurmctld.out")
            _wait_until(
                lambda: "UP" in run(["scontrol", "ping"], env=env, check=False, timeout=10).stdout,
                what="slurmctld",
                timeout=timeout,
                log_path=d / "slurmctld.log",
                proc=proc,
            )
        if not _pid_alive(d / "slurmd.pid"):
            proc = _spawn_detached([slurmd, "-D", "-f", str(conf)], d / "slurmd.out")
            _wait_until(
                lambda: _pid_alive(d / "slurmd.pid"),
                what="slurmd",
                timeout=timeout,
                log_path=d / "slurmd.log",
                proc=proc,
            )
        state = ""

        def node_usable() -> bool:
            nonlocal state
            state = _node_state(env, node)
            if state.startswith(("down", "drain")) and not state.endswith("*"):
                # Registered but held down by an old reason (e.g. "Not responding" from a past
                # run): we have just started it, so put it back in service.
                run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env, check=False, timeout=10)
            return state in _USABLE_NODE_STATES

        try:
            _wait_until(node_usable, what=f"Slurm node {node} (idle)", timeout=timeout, log_path=d / "slurmd.log")
        except ServestackError as e:
            raise ServestackError(f"{e}\nnode state: {state!r}\n{_log_tail(d / 'slurmctld.log', 15)}") from None
    return env


# --------------------------------------------------------------------------- binfmt


def _qemu_aarch64_enabled() -> bool:
    try:
        return (BINFMT_DIR / "qemu-aarch64").read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        return False


def ensure_binfmt_aarch64() -> None:
    """The kernel runs linux/arm64 binaries through qemu-aarch64 (for arm64 rootfs builds).

    Registered with the F (fix-binary) flag by Debian's qemu-user-static, so it also works
    inside containers whose filesystem has no qemu.
    """
    if _qemu_aarch64_enabled():
        return
    with _lock("binfmt"):
        if _qemu_aarch64_enabled():
            return
        if not (BINFMT_DIR / "register").exists():
            try:
                run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], timeout=10)
            except CommandError as e:
                raise ServestackError(f"cannot mount binfmt_misc at {BINFMT_DIR} (needs root/privileges): {e}") from e
        update = _require("update-binfmts")
        if not Path("/usr/share/binfmts/qemu-aarch64").exists():
            raise ServestackError(f"qemu-user-static's binfmt entry is missing; {_BOOTSTRAP_HINT}")
        # --import registers in the admin db (/var/lib/binfmts) and the kernel; --enable covers
        # an entry that was imported before binfmt_misc was mounted (e.g. during apt install).
        run([update, "--import", "qemu-aarch64"], check=False, timeout=10)
        if not _qemu_aarch64_enabled():
            run([update, "--enable", "qemu-aarch64"], timeout=10)
        if not _qemu_aarch64_enabled():
            raise ServestackError(f"qemu-aarch64 not enabled in {BINFMT_DIR} after update-binfmts --enable")



def docker_client(timeout: int = 900):
    """The one Docker SDK client servestack uses, on a running dockerd (started if needed)."""
    import docker

    ensure_dockerd()
    return docker.from_env(timeout=timeout)


__all__ = [
    "DEFAULT_REGISTRY",
    "docker_client",
    "ensure_binfmt_aarch64",
    "ensure_dockerd",
    "ensure_munge",
    "ensure_registry",
    "ensure_slurm",
]
