"""The GB200-shaped cluster tooling on one CPU node: enroot, pyxis and srtctl, built on demand.

A GB200 cluster runs a stage as `srtctl apply` -> `sbatch` -> `srun --container-image` (pyxis)
-> `enroot import` of the image by digest. This module makes that chain real on this machine,
the way `services` makes dockerd and Slurm real: each `ensure_*` is idempotent, fast when its
tool is in place, and otherwise builds it from the vendored source snapshot.

Sources: `git archive` snapshots of NVIDIA/enroot, NVIDIA/pyxis and NVIDIA/srt-slurm
(Apache-2.0) are inputs of the test environment, not project code. They are found in the
directory `$SERVESTACK_VENDOR` (configuration: the project knows no machine's layout; `.ci/run`
sets it where CI keeps them); when it is unset or they are missing, `ClusterToolsMissing` says
so (the cluster e2e tests skip on it). Each build lives under `state_home()/cluster/<tool>-<sha256 of the
archive and of this module's build steps>/`, so a new snapshot or new steps rebuild and an
unchanged one is reused in milliseconds.

On a real cluster none of this runs: the admins install srtctl, pyxis and enroot
(>= ENROOT_MIN_VERSION); the project only needs them on PATH and in plugstack.conf.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from servestack.errors import ServestackError
from servestack.recipes.srtslurm import SRT_SLURM
from servestack.runners.slurm import ENROOT_MIN_VERSION, parse_enroot_version
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import run
from servestack.util.project import state_home

VENDOR_ENV = "SERVESTACK_VENDOR"
PYTHON312_ENV = "SERVESTACK_PYTHON312"
# Bump when a build step below changes: the cache key includes it.
_STEPS_VERSION = "1"


class ClusterToolsMissing(ServestackError):
    """A vendored source (or a tool the chain needs) is not on this machine."""


def vendor_dir() -> Path:
    """$SERVESTACK_VENDOR: the directory holding the vendored enroot, pyxis and srt-slurm snapshots."""
    configured = os.environ.get(VENDOR_ENV)
    if not configured:
        raise ClusterToolsMissing(f"{VENDOR_ENV} is not set (the directory holding the vendored enroot, pyxis "
                                  "and srt-slurm snapshots)")
    return Path(configured)


def vendor_archive(tool: str) -> Path:
    """The one `<tool>-<commit>.tar.gz` in the vendor directory."""
    where = vendor_dir()
    found = sorted(where.glob(f"{tool}-*.tar.gz"))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise ClusterToolsMissing(
            f"{what} {tool}-<commit>.tar.gz in {where} (set {VENDOR_ENV} to the directory holding the "
            f"vendored enroot, pyxis and srt-slurm snapshots)"
        )
    return found[0]


def _cache_key(*parts: Path | str) -> str:
    h = hashlib.sha256(_STEPS_VERSION.encode())
    for part in parts:
        h.update(Path(part).read_bytes() if isinstance(part, Path) else part.encode())
    return h.hexdigest()[:16]


def _unpack(archive: Path, dest: Path) -> Path:
    """Extract a `git archive` tarball; returns its single top-level directory."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")
    [top] = [p for p in dest.iterdir() if p.is_dir()]
    return top


def _built(tool: str, key: str, build) -> Path:
    """state_home()/cluster/<tool>-<key>: built once by `build(tmpdir) -> None`, renamed into place."""
    from servestack.services.daemons import exclusive

    home = state_home() / "cluster"
    final = home / f"{tool}-{key}"
    if (final / ".complete").exists():
        return final
    with exclusive(f"cluster-{tool}"):
        if (final / ".complete").exists():
            return final
        home.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(final, ignore_errors=True)
        # Built in place (paths get baked into venvs and configs), marked complete last.
        final.mkdir()
        try:
            build(final)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        (final / ".complete").write_text(key + "\n")
    return final


def _executable(path: Path, text: str) -> None:
    atomic_write_text(path, text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _link(target: str | Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


# --------------------------------------------------------------------------- python 3.12


def find_python312() -> Path:
    """A working Python 3.12 for srt-slurm's jobs (`uv sync --python 3.12` in its batch script).

    $SERVESTACK_PYTHON312, else the first of `python3.12` on PATH, a pyenv version, or one that
    uv manages, that really runs (a pyenv shim for an inactive version does not).
    """
    candidates: list[str] = []
    if os.environ.get(PYTHON312_ENV):
        candidates.append(os.environ[PYTHON312_ENV])
    for d in os.environ.get("PATH", "").split(os.pathsep):
        candidates.append(os.path.join(d, "python3.12"))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv_root.glob("versions/3.12*/bin/python3.12"), reverse=True)]
    uv = shutil.which("uv")
    if uv:
        found = run([uv, "python", "find", "--managed-python", "3.12"], check=False, timeout=30)
        if found.returncode == 0 and found.stdout.strip():
            candidates.append(found.stdout.strip().splitlines()[-1])
    for c in candidates:
        if not os.access(c, os.X_OK):
            continue
        probe = run([c, "-c", "import sys; print(sys.executable, sys.version_info[:2] == (3, 12))"],
                    check=False, timeout=30)
        words = probe.stdout.split()
        if probe.returncode == 0 and words[-1:] == ["True"]:
            return Path(words[0])
    raise ClusterToolsMissing(
        f"no working Python 3.12 (srt-slurm's jobs run `uv sync --python 3.12`); install one and put "
        f"it on PATH or set {PYTHON312_ENV}"
    )


# --------------------------------------------------------------------------- srtctl


@dataclass(frozen=True)
class Srtctl:
    """An installed srtctl: the command, its source tree (the job runs from it) and the
    environment every call needs (SRTSLURM_CONFIG, PATH with its uv)."""

    executable: Path
    source: Path
    config: Path
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [str(self.executable), *args]


def _build_srtctl(archive: Path, python312: Path):
    def build(home: Path) -> None:
        tree = _unpack(archive, home / "src")
        venv = home / "venv"
        uv = shutil.which("uv") or sys.executable + " -m uv"
        run([*uv.split(), "venv", "--quiet", "--python", sys.executable, str(venv)], timeout=300)
        # uv from PyPI goes into the venv too: srt-slurm's job puts <tree>/bin first on PATH and
        # needs a real uv there (a shim or a login node's uv may not run on the compute node).
        run([*uv.split(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(tree), "uv"],
            timeout=900)
        # What srt-slurm's `make setup` downloads from GitHub, from this machine instead:
        # NATS and etcd from Debian (run inside the job's container from /configs), uv from PyPI.
        for name, tool in (("nats-server", "nats-server"), ("etcd", "etcd")):
            found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin")
            if not found:
                raise ClusterToolsMissing(f"`{tool}` is not installed (srt-slurm's jobs start it); run .ci/bootstrap")
            shutil.copy2(found, tree / "configs" / name)
        _link(venv / "bin" / "uv", tree / "bin" / "uv")
        _link(python312, tree / "bin" / "python3.12")
        # Tachometer (GPU telemetry) is off unless a recipe asks for it; apply only checks the file.
        _executable(tree / "bin" / "tachometer-scraper",
                    "#!/bin/sh\necho 'tachometer-scraper is not installed on this cluster' >&2\nexit 1\n")
        # The job's environment (`uv sync --python 3.12`), made once here rather than by the
        # first job (it needs the package index; a job should not).
        run([str(tree / "bin" / "uv"), "sync", "--quiet", "--python", str(python312), "--no-dev"], cwd=tree,
            env={"UV_PROJECT_ENVIRONMENT": str(tree / ".venv-compute")}, timeout=900)

    return build


# srt-slurm's per-recipe hook (`setup_script: <name>`, a file in the tree's configs/) that this
# cluster adds, as a site adds its own scripts to its srt-slurm checkout. srtctl runs it inside
# each worker's container, with that worker's environment (prefill_environment, ...), as a child
# of the shell that then starts the worker. srt-slurm has no per-worker CPU setting (its
# srun_options are the same for every step of a job), so the pinning is done here, with the same
# affinity mask `srun --cpu-bind` or `taskset` would give; vLLM's CPU backend then runs on the
# CPUs the mask allows (get_allowed_cpu_list reads sched_getaffinity).
# The variable is a slice of the CPUs the step may use, not a CPU list: the step's cpuset (Slurm's,
# the container's) need not hold any particular host CPU, and taskset fails with EINVAL on one it lacks.
PIN_WORKER_CPUS_SCRIPT = "pin-worker-cpus.sh"
PIN_WORKER_CPUS_ENV = "PIN_WORKER_CPUS"
_PIN_WORKER_CPUS = r"""#!/bin/bash
# srt-slurm setup_script, written by servestack (cluster.py). With PIN_WORKER_CPUS in a worker's
# environment, the shell srtctl starts the worker from, and so the worker with every process it
# starts, may run only on that slice of the CPUs this shell may run on (Cpus_allowed_list), as
# Python slices a list: "-N:" the last N, ":-N" all but the last N. Two workers sharing a node
# split it that way, so neither engine's OpenMP threads share a CPU with the other's busy-polling
# (vLLM's "auto" binding reserves CPUs for other processes only where it has more than it
# reserves: on 2 CPUs an unpinned engine computes on both). Too few CPUs for the slice: it says
# so and pins to what there is. Without it, nothing changes.
set -euo pipefail
slice="${PIN_WORKER_CPUS:-}"
[ -n "$slice" ] || exit 0
if ! [[ "$slice" =~ ^(-[1-9][0-9]*:|:-[1-9][0-9]*)$ ]]; then
    echo "pin-worker-cpus.sh: PIN_WORKER_CPUS=\"$slice\": expected \"-N:\" (the last N CPUs) or \":-N\" (all but the last N)" >&2
    exit 1
fi
allowed_list=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
allowed=()
IFS=, read -ra ranges <<< "$allowed_list"
for range in "${ranges[@]}"; do
    for ((cpu = ${range%-*}; cpu <= ${range#*-}; cpu++)); do allowed+=("$cpu"); done
done
n=${slice//[:-]/}
if [[ "$slice" == -* ]]; then
    if (( n > ${#allowed[@]} )); then
        echo "pin-worker-cpus.sh: PIN_WORKER_CPUS=$slice, but only ${#allowed[@]} CPU(s) are allowed here ($allowed_list): pinning to those" >&2
        n=${#allowed[@]}
    fi
    chosen=$(IFS=,; echo "${allowed[*]: -n}")
else
    if (( n >= ${#allowed[@]} )); then
        echo "pin-worker-cpus.sh: PIN_WORKER_CPUS=$slice leaves none of the ${#allowed[@]} CPU(s) allowed here ($allowed_list): left on all" >&2
        exit 0
    fi
    chosen=$(IFS=,; echo "${allowed[*]:0:${#allowed[@]}-n}")
fi
taskset --pid --cpu-list "$chosen" "$PPID"
"""


def _install_setup_scripts(tree: Path) -> None:
    from servestack.runners import preflight

    for name, text in ((PIN_WORKER_CPUS_SCRIPT, _PIN_WORKER_CPUS), (preflight.SCRIPT_NAME, preflight.SCRIPT)):
        script = tree / "configs" / name
        if not script.is_file() or script.read_text() != text:
            _executable(script, text)


def srtslurm_config(source: Path, *, partition: str, account: str,
                    model_paths: dict[str, str] | None = None) -> str:
    """srt-slurm's cluster config for this one-node cluster.

    Slurm 22.05 (Debian 12) knows neither --segment nor, without GRES, --gpus-per-node: both
    directives are off. srtctl_root is the unpacked tree the job `cd`s into.
    """
    import yaml

    return yaml.safe_dump(
        {
            "default_account": account,
            "default_partition": partition,
            "default_time_limit": "01:00:00",
            "use_gpus_per_node_directive": False,
            "use_segment_sbatch_directive": False,
            "use_exclusive_sbatch_directive": True,  # one server per node: never two on 2 cores
            "srtctl_root": str(source),
            "model_paths": dict(model_paths or {}),
        },
        sort_keys=False,
    )


def ensure_srtctl(root: Path | None = None, *, partition: str = "main", account: str = "servestack",
                  model_paths: dict[str, str] | None = None) -> Srtctl:
    """Real srtctl installed from the vendored srt-slurm tree (about 90 s the first time).

    Also writes its cluster config (srtslurm.yaml) for this machine's Slurm; returns the command
    and the environment to call it with.
    """
    archive = vendor_archive("srt-slurm")
    SRT_SLURM.check_snapshot(archive)
    python312 = find_python312()
    home = _built("srtctl", _cache_key(archive, str(python312)), _build_srtctl(archive, python312))
    [tree] = [p for p in (home / "src").iterdir() if p.is_dir()]
    # Outside the cached build: a new script reaches existing installs without rebuilding them.
    _install_setup_scripts(tree)
    wanted = srtslurm_config(tree, partition=partition, account=account, model_paths=model_paths)
    # One file per content: callers with other settings (parallel tests) never rewrite it under us.
    config = home / f"srtslurm-{hashlib.sha256(wanted.encode()).hexdigest()[:12]}.yaml"
    if not config.exists():
        atomic_write_text(config, wanted)
    env = {
        "SRTSLURM_CONFIG": str(config),
        "PATH": os.pathsep.join([str(home / "venv" / "bin"), os.environ.get("PATH", "")]),
    }
    return Srtctl(home / "venv" / "bin" / "srtctl", tree, config, env)


# --------------------------------------------------------------------------- enroot


@dataclass(frozen=True)
class Enroot:
    """An enroot install: its command, version and the directories it keeps images in."""

    prefix: Path
    version: tuple[int, ...]

    @property
    def binary(self) -> Path:
        return self.prefix / "bin" / "enroot"

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"


def enroot_settings(state: Path) -> dict[str, str]:
    """enroot.conf for this node.

    - ENROOT_ALLOW_HTTP: the test registry is plain HTTP on loopback (production: HTTPS).
    - ENROOT_LOGIN_SHELL no: Debian's /etc/profile resets PATH and drops the image's /opt/venv/bin.
    - ENROOT_SQUASH_OPTIONS: lz4, fast to write and to read back through squashfuse; the dev-cpu
      image is 4 GB unpacked, and a shared CI disk does not hold many of those uncompressed.
    - ENROOT_CACHE_PATH holds the downloaded layers while an import runs; the importer empties
      it afterwards (the squashfs, cached by digest, is what jobs reuse).
    """
    return {
        "ENROOT_RUNTIME_PATH": str(state / "runtime"),
        "ENROOT_CACHE_PATH": str(state / "cache"),
        "ENROOT_DATA_PATH": str(state / "data"),
        "ENROOT_TEMP_PATH": str(state / "tmp"),
        "ENROOT_ALLOW_HTTP": "yes",
        "ENROOT_LOGIN_SHELL": "no",
        "ENROOT_SQUASH_OPTIONS": "-comp lz4 -no-xattrs",
        "ENROOT_MOUNT_HOME": "no",
        "ENROOT_REMAP_ROOT": "no",
        "ENROOT_ROOTFS_WRITABLE": "yes",
    }


def _build_enroot(archive: Path):
    def build(home: Path) -> None:
        tree = _unpack(archive, home / "src")
        # The archive's git submodules are empty: glibc instead of musl, Debian's makeself (the
        # version enroot pins) and the system's kernel headers.
        makeself = shutil.which("makeself") or shutil.which("makeself.sh")
        if not makeself:
            raise ClusterToolsMissing("`makeself` is not installed (enroot's build needs it); run .ci/bootstrap")
        (tree / "deps" / "makeself").mkdir(parents=True, exist_ok=True)
        shutil.copy2(makeself, tree / "deps" / "makeself" / "makeself.sh")
        (tree / "deps" / "linux-headers").mkdir(parents=True, exist_ok=True)
        (tree / "deps" / "linux-headers" / ".stamp").touch()
        run(["make", "-C", str(tree), "FORCE_GLIBC=1", f"prefix={home / 'prefix'}", "install"], timeout=900)
        shutil.rmtree(tree.parent)

    return build


def ensure_enroot(root: Path | None = None) -> Enroot:
    """enroot built from the vendored snapshot (a few seconds once), configured for this node."""
    archive = vendor_archive("enroot")
    home = _built("enroot", _cache_key(archive), _build_enroot(archive))
    prefix = home / "prefix"
    state = state_home() / "enroot"
    for sub in ("runtime", "cache", "data", "tmp"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    conf = prefix / "etc" / "enroot" / "enroot.conf"
    wanted = "".join(f"{k} {v}\n" for k, v in enroot_settings(state).items())
    if not conf.exists() or conf.read_text() != wanted:
        atomic_write_text(conf, wanted)
    for tool in sorted((prefix / "bin").iterdir()):  # enroot and its helpers (enroot-nsenter, ...)
        _install_command(tool)
    out = run([str(prefix / "bin" / "enroot"), "version"], timeout=30).stdout.strip()
    return Enroot(prefix, parse_enroot_version(out))


SYSTEM_BIN = Path("/usr/local/bin")


def _install_command(binary: Path) -> None:
    """Put `binary` on the system PATH, as a package would: pyxis runs `enroot start` (and enroot
    its helpers) from slurmstepd, whose PATH is slurmd's, not the job's. Only a link of ours is
    ever replaced."""
    link = SYSTEM_BIN / binary.name
    if link.is_symlink() and Path(os.readlink(link)) == binary:
        return
    if link.exists() and not (link.is_symlink() and str(os.readlink(link)).startswith(str(state_home()))):
        raise ClusterToolsMissing(f"{link} exists and is not servestack's; remove it (enroot is installed "
                                  f"under {state_home() / 'cluster'} and linked there)")
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(binary)
    tmp.replace(link)


# --------------------------------------------------------------------------- pyxis


IMPORTER = """#!/bin/bash
# pyxis importer (written by servestack.cluster): `get docker://URI` imports the image once per digest
# into a squashfs under CACHE and prints its path; later jobs reuse it. Images are referenced by
# digest everywhere past the build, so the digest in the URI is the cache key.
set -euo pipefail
export PATH=@ENROOT_BIN@:$PATH
cache=@CACHE@
case "$1" in
    get)
        uri=$2
        digest=${uri##*@}
        [[ $digest == sha256:* && ${#digest} -eq 71 ]] || { echo "pyxis importer: $uri is not an image by digest" >&2; exit 1; }
        out=$cache/${digest#sha256:}.sqsh
        mkdir -p "$cache"
        if [[ ! -e $out ]]; then
            exec 9>"$out.lock"
            flock 9
            if [[ ! -e $out ]]; then
                tmp=$out.$$.tmp
                trap 'rm -f "$tmp"' EXIT
                enroot import --output "$tmp" "$uri" >&2
                mv "$tmp" "$out"
                # Bounded disk: the layers are in the squashfs now, and only the newest
                # @KEEP@ images stay (a rerun of the same digest reuses its file).
                rm -rf "${ENROOT_CACHE_PATH:-@LAYERS@}"/* 2>/dev/null || true
                ls -1t "$cache"/*.sqsh | tail -n +$((@KEEP@ + 1)) | while read -r old; do rm -f "$old" "$old.lock"; done
            fi
        fi
        touch "$out"
        echo "$out"
        ;;
    release) ;;
    *) echo "pyxis importer: unknown command $1" >&2; exit 1 ;;
esac
"""


@dataclass(frozen=True)
class Pyxis:
    plugin: Path
    plugstack_line: str
    image_cache: Path


IMAGES_KEPT = 2


def image_cache_dir() -> Path:
    """Squashfs images by digest, shared by every job on this node (and kept between CI runs)."""
    return state_home() / "enroot" / "images"


def _build_pyxis(archive: Path):
    def build(home: Path) -> None:
        tree = _unpack(archive, home / "src")
        run(["make", "-C", str(tree)], timeout=600)
        shutil.copy2(tree / "spank_pyxis.so", home / "spank_pyxis.so")
        shutil.rmtree(tree.parent)

    return build


def ensure_pyxis(root: Path | None = None, enroot: Enroot | None = None) -> Pyxis:
    """pyxis built against this machine's libslurm (4 s once), with an importer that caches by digest.

    Returns the plugstack.conf line; `services.ensure_slurm` includes it.
    """
    enroot = enroot or ensure_enroot(root)
    archive = vendor_archive("pyxis")
    home = _built("pyxis", _cache_key(archive), _build_pyxis(archive))
    importer = home / "importer.sh"
    cache = image_cache_dir()
    text = (IMPORTER.replace("@ENROOT_BIN@", str(enroot.bin_dir)).replace("@CACHE@", str(cache))
            .replace("@KEEP@", str(IMAGES_KEPT)).replace("@LAYERS@", str(state_home() / "enroot" / "cache")))
    if not importer.exists() or importer.read_text() != text:
        _executable(importer, text)
    runtime = state_home() / "enroot" / "pyxis"
    for d in (runtime, cache):
        d.mkdir(parents=True, exist_ok=True)  # pyxis creates <runtime>/<uid> only, not its parents
    line = (f"required {home / 'spank_pyxis.so'} runtime_path={runtime} "
            f"importer={importer} use_squashfuse=1 container_scope=job")
    return Pyxis(home / "spank_pyxis.so", line, cache)


# --------------------------------------------------------------------------- the whole chain


@dataclass(frozen=True)
class Cluster:
    """The one-node GB200-shaped cluster: Slurm with pyxis, enroot, and srtctl."""

    slurm_env: dict[str, str]
    enroot: Enroot
    pyxis: Pyxis
    srtctl: Srtctl

    @property
    def env(self) -> dict[str, str]:
        """For sbatch/srun/srtctl: the job inherits it, and pyxis finds `enroot` on its PATH."""
        path = os.pathsep.join([str(self.enroot.bin_dir), self.srtctl.env["PATH"]])
        return {**self.slurm_env, **self.srtctl.env, "PATH": path}


def ensure_cluster(root: Path | None = None, model_paths: dict[str, str] | None = None, nodes: int = 1) -> Cluster:
    """enroot, pyxis in Slurm's plugstack, Slurm itself (of `nodes` nodes: services.ensure_slurm) and
    srtctl; each reused when in place."""
    from servestack import services

    enroot = ensure_enroot(root)
    pyxis = ensure_pyxis(root, enroot)
    slurm_env = services.ensure_slurm(nodes=nodes)
    conf = Path(slurm_env["SLURM_CONF"]).parent / "plugstack.conf.d" / "pyxis.conf"
    if not conf.exists() or conf.read_text() != pyxis.plugstack_line + "\n":
        # Read by srun and each job step when they start: no daemon restart needed.
        atomic_write_text(conf, pyxis.plugstack_line + "\n")
    return Cluster(slurm_env, enroot, pyxis, ensure_srtctl(root, model_paths=model_paths))


__all__ = [
    "Cluster", "ClusterToolsMissing", "ensure_cluster", "ENROOT_MIN_VERSION", "Enroot", "Pyxis", "ensure_enroot", "ensure_pyxis", "PYTHON312_ENV", "Srtctl", "VENDOR_ENV", "ensure_srtctl",
    "find_python312", "srtslurm_config", "vendor_archive", "vendor_dir",
]
