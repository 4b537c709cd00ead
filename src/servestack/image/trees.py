"""Wheels installed on the host into per-wheel trees, as the image's venv holds them.

Each tree is made once per (wheel hash, exact version of the compiling interpreter, bytecode recipe)
and cached; the trees of a build are made in parallel, two per core, and each is handed on as soon
as it is made (the image step writes its layer while the others are still being made). Installing
runs no code from the wheel (pypa/installer); bytecode is compiled by the host's interpreter of the
image's exact Python version where the host has one (`compiler`).

A tree is two files: its pack, every installed file's and pyc's bytes one after another, and its entry
list (paths in the image, modes, sizes, content hashes, and where in the pack each file's bytes are).
A layer is tarred straight from the packs, and its key computed from the lists without reading a
file. Installing into a directory cost a file creation per file, and that was most of the install:
200-700 us of kernel time each on this host's ext4, 41,597 files and 21,350 pycs for dev-cpu.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import logging
import os
import posixpath
import resource
import secrets
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from servestack.errors import CommandError, ServestackError
from servestack.image.bytecode import BytecodePool, Job, Module
from servestack.image.layers import Entry, load_entries, save_entries
from servestack.util import proc
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import cache_home

log = logging.getLogger("servestack.image.trees")

VENV = "opt/venv"
# Part of the installed trees' cache key: bump when the install or bytecode recipe, or the tree's
# layout, changes.
BYTECODE = 4
# Directories whose modules get no pyc: the test suites wheels ship (pandas/tests, sympy's and numba's
# tests: 3,548 of dev-cpu's 24,898 modules, 6.3 of its ~30 CPU-s of compiling) are never imported by
# what the image serves, and compile on first import if anyone runs them. As compile_dir with
# rx=r"/tests?/". Not `testing`: torch.testing and numpy.testing are public API that code imports.
UNCOMPILED_DIRECTORIES = frozenset({"test", "tests"})
PACK = "files.pack"
COPY_CHUNK = 1 << 20


def site_packages(python: str) -> str:
    return f"{VENV}/lib/python{python}/site-packages"


@dataclass(frozen=True, kw_only=True)
class Tree:
    path: Path
    entries: tuple[Entry, ...]
    made: bool  # False when it came from the cache
    install_seconds: float = 0.0
    bytecode_seconds: float = 0.0
    # CPU seconds of installing into the pack, hashing every file (this thread's): on a loaded machine
    # the wall seconds say little about the work. Bytecode's CPU: see install_all. Modules compile while
    # the wheel installs, so bytecode_seconds is the wait for the last of them after it, and their writing.
    install_cpu_seconds: float = 0.0

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)


@dataclass(frozen=True, kw_only=True)
class Compiler:
    """The interpreter that compiles a tree's bytecode: `executable` is None when the host has none."""

    executable: str | None
    version: str  # "3.11.2"; "none" without an interpreter (then the tree ships no bytecode)


# Run with -S, as the compilers are: the real binary (not a pyenv shim or a venv's link) and its version.
PROBE = "import os, sys; print(os.path.realpath(sys.executable)); print('%d.%d.%d' % sys.version_info[:3])"


def compiler(python: str, image_version: str | None) -> Compiler:
    """The host's python<X.Y> that compiles the trees' bytecode: the one of the image's exact version
    (`image_version`, image.interpreter_version) when PATH has it, else the first on PATH, with a warning.

    Patch releases compile some files differently: 42 of dev-cpu's 25,840 pycs differ between 3.11.2
    and 3.11.7 (3.11.4 fixed gh-104615, so `a, a = x, y` leaves y in a where 3.11.2's code leaves x,
    and it places some jumps otherwise in the position tables). Only the image's own version writes the
    pycs its interpreter would, and the same digest on every machine. The exact version is part of
    each tree's key: trees made by two patch releases never share a cache entry.
    The interpreter's state matters too: marshal flags an object for back-references by its refcount,
    so what site imports at start-up changed a pyc (aiohttp/multipart.py), and the hash seed orders
    frozensets of strings; the compilers run with -S and PYTHONHASHSEED=0 (bytecode.py).
    """
    return _compiler(python, image_version, os.environ.get("PATH", os.defpath))


@functools.lru_cache(maxsize=None)
def _compiler(python: str, image_version: str | None, path: str) -> Compiler:
    found = interpreters(python, path)
    if not found:
        return Compiler(executable=None, version="none")
    chosen = next((c for c in found if c.version == image_version), found[0])
    if chosen.version != image_version:
        wanted = (f"the image's interpreter is Python {image_version}, and no python{python} on PATH is" if image_version
                  else f"the exact version of the image's Python {python} is not known (none was given)")
        log.warning("bytecode: %s (found: %s); compiling with %s (%s), so some pycs, and the image digest, may "
                    "differ from the ones expected for this lock (pins/<stack>.image.json)", wanted,
                    ", ".join(f"{c.executable} ({c.version})" for c in found), chosen.executable, chosen.version)
    return chosen


def interpreters(python: str, path: str) -> list[Compiler]:
    """Every python<X.Y> on `path` (os.pathsep-separated), in its order, each real binary once: a pyenv
    shim or a venv's link counts as the interpreter it runs (each is run once to ask; a shim costs 0.2 s).
    One that does not run (a pyenv shim for a version without it) or is not X.Y is left out."""
    found: dict[str, Compiler] = {}
    asked: set[str] = set()
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, f"python{python}")
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)) or os.path.realpath(candidate) in asked:
            continue  # /bin/python3.11 is /usr/bin/python3.11 where /bin links to /usr/bin: asked once
        asked.add(os.path.realpath(candidate))
        try:
            # Standard output alone: a warning on stderr must not become the path or the version.
            executable, version = proc.output_bytes([candidate, "-S", "-c", PROBE], timeout=60).decode().split("\n")[:2]
        except (CommandError, OSError, subprocess.TimeoutExpired, ValueError) as error:
            log.info("%s is left out as a bytecode compiler: it did not say its version (%s)", candidate, error)
            continue
        if version.rsplit(".", 1)[0] != python:
            log.info("%s is left out as a bytecode compiler: it is Python %s, not %s", candidate, version, python)
            continue
        found.setdefault(executable, Compiler(executable=executable, version=version))
    return list(found.values())


def tree_path(sha256: str, compiled_by: str) -> Path:
    """Where the wheel's tree is cached, its bytecode compiled by Python `compiled_by` (X.Y.Z, or "none")."""
    return cache_home() / "installed" / f"{sha256}-py{compiled_by}-pyc{BYTECODE}"


def staging_path(tree: Path) -> Path:
    """Where `tree` is made before it is renamed into place: a name no other build uses, also one in another
    container sharing the cache (its pids are its PID namespace's, so a pid alone can repeat). Never a
    tree's name, so pruning removes one left behind (prune.py: no build records it as used)."""
    return tree.with_name(f"{tree.name}.tmp{os.getpid()}-{secrets.token_hex(4)}")


def installed_tree(wheel: Path, sha256: str, python: str, compiled_by: str, bytecode: BytecodePool | None) -> Tree:
    """The wheel installed as the image's venv would hold it, with its bytecode, cached by the wheel's hash.

    `bytecode` compiles the tree's modules with Python `compiled_by` (None, "none": the host has no
    python<X.Y>)."""
    tree = tree_path(sha256, compiled_by)
    if tree.exists():
        os.utime(tree)  # last used: cache pruning keeps what builds still use (prune.py)
        return Tree(path=tree, entries=tuple(load_entries(tree / "entries.json", tree)), made=False)
    started, cpu = time.monotonic(), time.thread_time()
    # Made under a name of its own and renamed into place whole, so no build sees half a tree.
    staging = staging_path(tree)
    job = None
    try:
        staging.mkdir(parents=True)
        job = bytecode.job() if bytecode is not None else None
        staged = staging / PACK
        with open(staged, "wb") as pack:
            def packed(path: str, file: _Packed) -> None:
                # A module goes to the compilers as soon as it is packed: they work while the rest installs.
                if job is None or not _is_module(path, python):
                    return
                if job.done.done():  # the pool failed or the build stopped: install no more of this wheel
                    job.done.result()
                pack.flush()  # they read it from the pack
                job.add(Module(pack=staged, offset=file.offset, size=file.size, path="/" + path))

            files = _install(wheel, pack, python, packed)
            installed, install_cpu = time.monotonic(), time.thread_time() - cpu
            for module, (pyc_path, pyc) in sorted(_bytecode(job, files, python, wheel).items()):
                files.claim(pyc_path, f"the pyc of {module}")
                # Never executable: py_compile writes a pyc with its source's mode & 0o666.
                files[pyc_path] = _Packed(offset=pack.tell(), size=len(pyc), sha256=hashlib.sha256(pyc).hexdigest(), executable=False)
                pack.write(pyc)
        compiled = time.monotonic()
        # The entries as they will be once the tree is in place, all sharing its pack's one Path (a Path
        # each, and reading them back from entries.json, cost 2 s of dev-cpu's cold build).
        in_place = tree / PACK
        entries = tuple(Entry(path=path, kind="file", mode=0o755 if f.executable else 0o644, size=f.size, sha256=f.sha256, source=in_place,
                              offset=f.offset) for path, f in sorted(files.items()))
        save_entries(staging / "entries.json", entries, tree)
        atomic_write_json(staging / "timing.json", {"install_seconds": round(installed - started, 2),
                                                    "bytecode_seconds": round(compiled - installed, 2),
                                                    "install_cpu_seconds": round(install_cpu, 2)})
    except BaseException as failure:
        # A wheel that does not install, bytecode that fails, an interrupt: the half-made tree is
        # nobody's (its name is this call's own), so it goes now rather than lying in the cache, and
        # its modules still queued are dropped, not read by a compiler from a pack that is gone.
        if job is not None:
            job.abandon(failure)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        staging.rename(tree)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not tree.exists():  # not another build's tree in the way: nothing was made
            raise
        # Another build made it meanwhile: its entries, which point into its pack, not ours.
        entries = tuple(load_entries(tree / "entries.json", tree))
    return Tree(path=tree, entries=entries, made=True, install_seconds=installed - started, bytecode_seconds=compiled - installed,
                install_cpu_seconds=install_cpu)


@dataclass(frozen=True, kw_only=True)
class _Packed:
    """An installed file's bytes in its tree's pack."""

    offset: int
    size: int
    sha256: str
    executable: bool


class _Files(dict[str, _Packed]):
    """A tree's files by path in the image, each path claimed before its file is packed: as installing
    into a directory would fail, a path is refused when a file is already there, a directory is (a file
    installed below it earlier), or a file is where one of its directories goes."""

    def __init__(self, wheel: Path):
        super().__init__()
        self.wheel = wheel
        self.directories: set[str] = set()

    def claim(self, path: str, what: str) -> None:
        clash = path if path in self or path in self.directories else None
        # Its directories, innermost first, up to the first one already claimed: that one's own were
        # checked when it was, and none has become a file since (a file there would have clashed).
        parent, new = path, []
        while clash is None and (cut := parent.rfind("/")) > 0 and (parent := parent[:cut]) not in self.directories:
            if parent in self:
                clash = parent
            new.append(parent)
        if clash is not None:
            raise ServestackError(f"{self.wheel.name}: {what} cannot be at {path}: "
                                  + (f"the wheel installs a file at {clash}" if clash in self else
                                     f"the wheel installs files below {clash}"))
        self.directories.update(new)


def _install(wheel: Path, pack: BinaryIO, python: str, packed: Callable[[str, _Packed], None]) -> _Files:
    """Install the wheel into `pack` (pypa/installer, no code from the wheel runs): every file it would
    write, by its path in the image, is appended to the pack instead, hashed as installer hashes it for
    RECORD, and handed to `packed` once it is there."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.records import Hash, RecordEntry
    from installer.scripts import Script
    from installer.utils import Scheme

    from servestack.wheels.zipread import open_wheel

    files = _Files(wheel)

    class Packing(SchemeDictionaryDestination):
        def write_to_fs(self, scheme: Scheme, path: str, stream: BinaryIO, is_executable: bool) -> RecordEntry:
            # Where installer would write it: normalized, and refused outside the scheme's directory.
            directory = self.scheme_dict[scheme]
            target = posixpath.normpath(posixpath.join(directory, path))
            # posixpath.commonpath's test (both are normalized) at a tenth of its cost
            if target != directory and not target.startswith(directory + "/"):
                raise ServestackError(f"{wheel.name}: {path} would be installed outside {directory}")
            target = target.lstrip("/")
            files.claim(target, "a file")
            offset, size = pack.tell(), 0
            # installer's copyfileobj_with_hashing, a MB at a time rather than 64 KB: a member's reads inflate
            # and copy its buffers once per read, and a GPU stack's libraries are GBs.
            hasher = hashlib.new(self.hash_algorithm)
            while chunk := stream.read(COPY_CHUNK):
                hasher.update(chunk)
                pack.write(chunk)
                size += len(chunk)
            hash_ = base64.urlsafe_b64encode(hasher.digest()).decode("ascii").rstrip("=")
            files[target] = _Packed(offset=offset, size=size, sha256=hasher.hexdigest(), executable=is_executable)
            packed(target, files[target])
            return RecordEntry(path, Hash(self.hash_algorithm, hash_), size)

        def write_script(self, name: str, module: str, attr: str, section: Literal["console", "gui"]) -> RecordEntry:
            script_name, data = Script(name, module, attr, section).generate(self.interpreter, self.script_kind)
            return self.write_to_fs(Scheme("scripts"), script_name, io.BytesIO(data), is_executable=True)

    scheme = {
        "purelib": "/" + site_packages(python),
        "platlib": "/" + site_packages(python),
        "headers": f"/{VENV}/include/site/python{python}",
        "scripts": f"/{VENV}/bin",
        "data": f"/{VENV}",
    }
    destination = Packing(scheme, interpreter=f"/{VENV}/bin/python", script_kind="posix", bytecode_optimization_levels=())
    # Some wheels ship __pycache__ files; installer skips them (we compile our own) and warns. One filter
    # for the process: warnings.catch_warnings in each install thread would restore the filters out of order.
    warnings.filterwarnings("ignore", message="Skip installing .*__pycache__", category=RuntimeWarning)
    with open_wheel(wheel) as source:
        install(source, destination, additional_metadata={"INSTALLER": b"servestack\n"})
    return files


def _is_module(path: str, python: str) -> bool:
    """Whether the file at `path` (in the image) gets a pyc: a `.py` file under site-packages, as
    compileall.compile_dir(site-packages) compiles, but not inside a `__pycache__` directory or a test
    suite (UNCOMPILED_DIRECTORIES)."""
    site = site_packages(python) + "/"
    return (path.startswith(site) and path.endswith(".py")
            and not any(d == "__pycache__" or d in UNCOMPILED_DIRECTORIES for d in path[len(site):].split("/")[:-1]))


def _bytecode(job: Job | None, files: _Files, python: str, wheel: Path) -> dict[str, tuple[str, bytes]]:
    """Ship bytecode, so no container compiles torch and vLLM again (read-only images cannot cache it):
    each module's pyc (its path in the image and bytes) by the module's path, once `job` has compiled
    them all (None: the host has no python<X.Y>).

    Unchecked-hash pycs carry no timestamps, and a fixed hash seed keeps constant sets in one order,
    so the bytes depend only on the sources and the interpreter's exact version (part of the tree's
    key, see `compiler`); bytecode is the same on every platform. The modules are compiled on all
    cores, with every other tree's (bytecode.py).
    """
    if job is None:
        if any(_is_module(path, python) for path in files):
            log.warning("no python%s on this host: the image ships no bytecode for %s", python, wheel.name)
        return {}
    return {module.lstrip("/"): (pyc_path.lstrip("/"), pyc) for module, (pyc_path, pyc) in job.close().result().items()}


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's finished subprocesses so far. Around install_all,
    the difference is the compiling interpreters' (the only subprocesses it runs; they end with it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a container's or Slurm job's cpuset), not
    the host's count, so the compilers and installs are not more than the cores that run them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def install_all(wheels: list[tuple[Path, str]], python: str, image_version: str | None, workers: int | None = None,
                on_tree: Callable[[str, Tree], None] | None = None) -> list[Tree]:
    """Every (wheel, sha256) as a tree, on `workers` cores (default: the usable CPUs): two trees in the
    making per core, their modules compiled one by one, as they are installed, by one compiling
    interpreter per core (bytecode.py): the host's python<python> of the image's exact version
    `image_version` where there is one (see `compiler`).

    `on_tree(sha256, tree)` is called as each tree is ready (cached ones first), from this thread.
    """
    # Largest first, so the long ones (torch) start at once and the pool drains evenly.
    order = sorted(range(len(wheels)), key=lambda i: -wheels[i][0].stat().st_size)
    cores = workers or usable_cpus()
    chosen = compiler(python, image_version)
    interpreter = chosen.executable
    made: dict[int, Tree] = {}
    # Leaving the stack ends the installs first, then the compiling interpreters (their CPU is then counted).
    with contextlib.ExitStack() as stack:
        bytecode = stack.enter_context(BytecodePool(interpreter, cores)) if interpreter else None
        # Two trees in the making per core: while one waits for the last of its modules to compile,
        # the other installs, so the compilers are never out of modules (measured: cold dev-cpu 57.5 s
        # with one per core, 52.6 s with two).
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=2 * cores))
        futures = {pool.submit(installed_tree, wheels[i][0], wheels[i][1], python, chosen.version, bytecode): i for i in order}
        try:
            for future in as_completed(futures):
                i = futures[future]
                made[i] = future.result()
                if on_tree:
                    on_tree(wheels[i][1], made[i])
        except BaseException:  # a failed tree or an interrupt: make no more trees, compile no more files
            if bytecode is not None:
                bytecode.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [made[i] for i in range(len(wheels))]
