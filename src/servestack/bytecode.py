"""Bytecode for the installed trees, compiled file by file on every core.

One compiling interpreter per core stays up for the whole build and is handed single files from a
queue that all trees share (the earliest submitted tree first, its largest files first). A tree's
bytecode used to be one `compileall.compile_dir` subprocess compiling one file at a time, so a large
tree (torch, vLLM, transformers: 5-8 CPU seconds each) held one core while the other idled.

The pycs are byte-identical to compile_dir's: every file goes through `compileall.compile_file` with
the arguments compile_dir gives it (its `ddir` becomes stripdir/prependdir), in an interpreter started
the same way (-S, PYTHONHASHSEED=0: see trees.compiler) with the same modules imported. What else is
alive in the compiling interpreter can matter (marshal flags an object for back-references by its
refcount; site's imports changed a pyc, see trees.compiler), so the worker imports nothing more than
compile_dir's script did, and reads the paths as hex so no codec is involved. Measured: all 25,840
pycs of dev-cpu are byte-identical to compile_dir's; tests/test_bytecode.py compares the two.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import select
import subprocess
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from . import proc
from .errors import ServestackError

# Each request line: stripdir, prependdir and the file, each as the hex of its filesystem bytes.
# Each answer line: 1 compile_file compiled it (or had nothing to do); S it wrote no pyc because the
# file does not compile (a syntax error, a null byte: compile_dir skips those the same way); 0 it
# wrote no pyc for a file that compiles (the write failed: disk full, a file where __pycache__ goes).
# The check runs only after a failure, in a namespace dropped at once, so nothing it names stays
# alive in the interpreter to change a later pyc (see the module docstring).
CHECK = (
    "skipped = False\n"
    "try:\n"
    "    with open(fullname, 'rb') as source:\n"
    "        compile(source.read(), fullname, 'exec', dont_inherit=True)\n"
    "except (SyntaxError, ValueError):\n"
    "    skipped = True\n"
    "except OSError:\n"
    "    pass\n"
    "sys.stdout.write('S\\n' if skipped else '0\\n')\n"
)
WORKER = (
    "import compileall, py_compile, sys\n"
    "while fullname := sys.stdin.readline():\n"
    "    stripdir, prependdir, fullname = map(compileall.os.fsdecode, map(bytes.fromhex, fullname.split()))\n"
    "    if compileall.compile_file(\n"
    "            fullname, quiet=2, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,\n"
    "            stripdir=stripdir, prependdir=prependdir):\n"
    "        sys.stdout.write('1\\n')\n"
    "    else:\n"
    f"        exec({CHECK!r}, {{'fullname': fullname, 'sys': sys}})\n"
    "    sys.stdout.flush()\n"
)
# What the compiling interpreter is started with: see trees.compiler for why each matters. Every
# other PYTHON* variable of the caller's is dropped: they change the pycs (PYTHONNODEBUGRANGES), their
# names (PYTHONOPTIMIZE), where they go (PYTHONPYCACHEPREFIX) or whether they are written at all
# (PYTHONWARNINGS=error), and they are not part of a tree's cache key. (-E or -I would drop them too,
# and PYTHONHASHSEED with them.)
WORKER_ENV = {"PYTHONHASHSEED": "0", "PYTHONPATH": ""}

# What one file may take: the build's old bound was 3600 s for a whole tree; a compiler that answers
# nothing about a single file for this long is wedged, and is killed rather than waited for.
ANSWER_TIMEOUT_S = 600.0


def worker_base_env() -> dict[str, str]:
    """This process's environment without its PYTHON* variables (WORKER_ENV then sets the two that count)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}


def sources(site: Path) -> list[Path]:
    """The files compile_dir(site) would compile: every `.py` under it, not inside `__pycache__` and not
    below a symlinked directory (compileall's walk; it compiles a symlinked file where the link is)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(site):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        found += [Path(dirpath, name) for name in sorted(filenames) if name.endswith(".py")]
    return found


@dataclass
class _Job:
    """One tree's files: `done` resolves when the last of them has been compiled."""

    left: int
    done: Future = field(default_factory=Future)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finished_one(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0 and not self.done.done():
                self.done.set_result(None)


class BytecodePool:
    """`workers` compiling interpreters (`executable -S`), fed one file at a time from one queue.

    Use as a context manager; leaving it ends the interpreters (their CPU seconds then count in
    RUSAGE_CHILDREN, as trees.children_cpu_seconds reads them). Each interpreter starts with the first
    file it is handed.
    """

    def __init__(self, executable: str, workers: int):
        self.executable, self.workers = executable, workers
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # ties: submission order
        self._jobs = itertools.count()
        self._failure: ServestackError | None = None
        self._threads: list[threading.Thread] = []
        self._running: list[subprocess.Popen] = []  # the compilers, killed by stop()
        self._running_lock = threading.Lock()

    def __enter__(self) -> BytecodePool:
        for n in range(self.workers):
            thread = threading.Thread(target=self._serve, name=f"bytecode-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is not None:
            self.stop()
        for _ in self._threads:
            self._queue.put(((float("inf"),), next(self._order), None, ""))
        for thread in self._threads:
            thread.join()

    def submit(self, site: Path, ddir: str, files: list[Path]) -> Future:
        """Compile `files` (under `site`) as compile_dir(site, ddir=ddir) would; the future resolves when
        all are written. Jobs are served in submission order, each one's largest files first."""
        job = _Job(len(files))
        if self._failure is not None:
            job.done.set_exception(self._failure)
            return job.done
        if not files:
            job.done.set_result(None)
            return job.done
        number = next(self._jobs)
        head = f"{os.fsencode(str(site)).hex()} {os.fsencode(ddir).hex()} "
        sized = sorted(((f.lstat().st_size, f) for f in files), key=lambda pair: -pair[0])
        for size, path in sized:
            self._queue.put(((number, -size), next(self._order), job, f"{head}{os.fsencode(str(path)).hex()}\n"))
        return job.done

    def stop(self) -> None:
        """Compile nothing more: every job still queued or under way fails (the build is stopping), and
        the compilers are killed, so a file under way (or a wedged compiler) is not waited for."""
        self._failure = self._failure or ServestackError("bytecode: the build stopped before these files were compiled")
        with self._running_lock:
            for worker in self._running:
                worker.kill()

    def _fail(self, job: _Job, failure: ServestackError) -> None:
        self._failure = self._failure or failure
        with job.lock:
            if not job.done.done():
                job.done.set_exception(self._failure)

    def _serve(self) -> None:
        """One compiling interpreter: started here, fed until the pool closes. Whatever goes wrong with
        a file (the compiler cannot start: EAGAIN, EMFILE; it dies or hangs; a bug here) fails that
        file's job, and after a failure every job still queued fails with it, so no caller waits for ever."""
        with tempfile.TemporaryFile() as errors:
            worker = None  # started with the first file: a build of cached trees compiles nothing
            closed = False
            try:
                while True:
                    _, _, job, line = self._queue.get()
                    if job is None:
                        closed = True
                        return
                    if self._failure is not None:
                        self._fail(job, self._failure)
                        continue
                    path = os.fsdecode(bytes.fromhex(line.split()[2]))
                    try:
                        if worker is None:
                            worker = self._start(errors)
                        failure = self._compile(worker, line, path, errors)
                    except BaseException as error:
                        failure = ServestackError(f"bytecode: compiling {path} with {self.executable} -S failed: {error!r}")
                    if failure is None:
                        job.finished_one()
                    else:
                        self._fail(job, failure)
            finally:
                if not closed:  # this thread is ending early: no job may be left waiting for it
                    self._fail_queued(ServestackError(f"bytecode: {threading.current_thread().name} ended early"))
                if worker is not None:
                    with contextlib.suppress(OSError):
                        worker.stdin.close()
                    worker.wait()

    def _start(self, errors) -> subprocess.Popen:
        worker = proc.pipe([self.executable, "-S", "-c", WORKER], env=WORKER_ENV, base_env=worker_base_env(),
                           stderr=errors)
        with self._running_lock:
            self._running.append(worker)
            if self._failure is not None:  # stop() came while it started
                worker.kill()
        return worker

    def _compile(self, worker: subprocess.Popen, line: str, path: str, errors) -> ServestackError | None:
        """Hand the worker one file; None when compile_file said it is done."""
        try:
            worker.stdin.write(line)
            worker.stdin.flush()
            # An answer is one line written at once, and nothing else is ever written: the text
            # stream's buffer is empty between answers, so the pipe's readiness is the answer's.
            answered = select.select([worker.stdout], [], [], ANSWER_TIMEOUT_S)[0]
            answer = worker.stdout.readline() if answered else None
        except OSError:  # the pipe broke: the interpreter is gone
            answer = ""
        if answer is None:
            worker.kill()
            return ServestackError(f"bytecode: {self.executable} -S gave no answer in {ANSWER_TIMEOUT_S:.0f} s "
                                   f"while compiling {path}; killed it")
        if answer in ("1\n", "S\n"):
            return None
        if answer == "0\n":
            return ServestackError(f"bytecode: no pyc was written for {path}, which compiles: compileall could not "
                                   "write it (disk full? a file where its __pycache__ directory goes?)")
        errors.seek(0)
        return ServestackError(f"bytecode: {self.executable} -S exited with {worker.wait()} while compiling {path}: "
                               f"{errors.read()[-2000:].decode(errors='replace')}")

    def _fail_queued(self, failure: ServestackError) -> None:
        """Fail every job still queued (the pool's closing markers go back for the other threads)."""
        self._failure = self._failure or failure
        markers = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item[2] is None:
                    markers.append(item)
                else:
                    self._fail(item[2], self._failure)
        for item in markers:
            self._queue.put(item)
