"""Bytecode for the installed trees, compiled module by module on every core, in memory.

One compiling interpreter per core stays up for the whole build and is handed single modules from a
queue that all trees share (the earliest started tree's first), each as soon as it is installed. Each
module's source is read from its tree's pack (trees.py: a tree is one file of contents, not thousands
of files), and its pyc comes back over the pipe: no source is written out and no pyc is written in,
each of which cost a file creation (200-700 us of kernel time here; 25,840 pycs and 41,597 files
for dev-cpu).

The pycs are byte-identical to `compileall.compile_dir`'s: each module goes through what
py_compile.compile does (SourceFileLoader.source_to_code with the module's path in the image as its
file name, then an unchecked-hash pyc), in an interpreter started the same way (-S, PYTHONHASHSEED=0:
see trees.compiler) with the same modules imported. What else is alive in the compiling interpreter
can matter (marshal flags an object for back-references by its refcount; site's imports changed a
pyc, see trees.compiler), so the worker imports nothing compile_dir's script did not, and names its
variables only as py_compile.compile and compileall.compile_file do: an identifier of its own that a
module uses once would be an interned string with a second reference. tests/test_bytecode.py
compares the pycs with compile_dir's, file by file.
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

# Each request line: the pack (hex of its filesystem bytes), the source's offset and size in it, and
# the module's path in the image (hex). Each answer: "S\n" when the module does not compile (a syntax
# error, a null byte: compile_dir skips those the same way), else a line with the pyc's path in the
# image (hex) and its length, then the pyc's bytes. Any other failure ends the worker, its traceback
# on standard error.
WORKER = (
    "import compileall, py_compile, sys\n"
    "while fullname := sys.stdin.buffer.readline():\n"
    "    file, head, tail, dfile = fullname.split()\n"
    "    with open(bytes.fromhex(file.decode()), 'rb') as loader:\n"
    "        loader.seek(int(head))\n"
    "        source_bytes = loader.read(int(tail))\n"
    "    dfile = compileall.os.fsdecode(bytes.fromhex(dfile.decode()))\n"
    "    try:\n"
    "        code = compileall.importlib.machinery.SourceFileLoader('<py_compile>', dfile).source_to_code(\n"
    "            source_bytes, dfile, _optimize=-1)\n"
    "    except Exception:\n"
    "        sys.stdout.buffer.write(b'S\\n')\n"
    "    else:\n"
    "        bytecode = compileall.importlib._bootstrap_external._code_to_hash_pyc(\n"
    "            code, compileall.importlib.util.source_hash(source_bytes), False)\n"
    "        cfile = compileall.importlib.util.cache_from_source(dfile)\n"
    "        sys.stdout.buffer.write(b'%s %d\\n' % (compileall.os.fsencode(cfile).hex().encode(), len(bytecode)))\n"
    "        sys.stdout.buffer.write(bytecode)\n"
    "        del code, bytecode, cfile\n"
    "    sys.stdout.buffer.flush()\n"
    # Nothing of this module's stays alive into the next one's compiling, as nothing of compile_file's
    # outlives its call: a code object still alive changed the refcount, so the pyc, of a later module's
    # frozenset constant (aiohttp/multipart.py, the second time it was compiled in one interpreter).
    "    del file, head, tail, dfile, loader, source_bytes\n"
)
# What the compiling interpreter is started with: see trees.compiler for why each matters. Every
# other PYTHON* variable of the caller's is dropped: they change the pycs (PYTHONNODEBUGRANGES), their
# names (PYTHONOPTIMIZE), where they go (PYTHONPYCACHEPREFIX) or whether they are made at all
# (PYTHONWARNINGS=error), and they are not part of a tree's cache key. (-E or -I would drop them too,
# and PYTHONHASHSEED with them.)
WORKER_ENV = {"PYTHONHASHSEED": "0", "PYTHONPATH": ""}

# What one module may take: a compiler that answers nothing about a single module for this long is
# wedged, and is killed rather than waited for.
ANSWER_TIMEOUT_S = 600.0


def worker_base_env() -> dict[str, str]:
    """This process's environment without its PYTHON* variables (WORKER_ENV then sets the two that count)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}


@dataclass(frozen=True)
class Module:
    """A module's source: `size` bytes at `offset` in `pack`, at `path` in the image (absolute: the pyc's
    co_filename and its __pycache__ name come from it)."""

    pack: Path
    offset: int
    size: int
    path: str


@dataclass
class Job:
    """One tree's modules, handed to the pool one by one as they are installed (`add`); `close` says
    there are no more, and its future resolves when the last has been compiled, with each module's pyc
    (its path in the image and bytes) by the module's path (none for a module that does not compile)."""

    pool: BytecodePool
    number: int
    left: int = 0
    closed: bool = False
    pycs: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    done: Future = field(default_factory=Future)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, module: Module) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("bytecode: a module added to a closed job")
            self.left += 1
        self.pool._enqueue(self, module)

    def abandon(self, failure: BaseException) -> None:
        """The job fails with `failure` (its tree failed, or the pool did), unless it has already
        resolved: its modules still queued are dropped (a failed tree's pack is going)."""
        with self.lock:
            if not self.done.done():
                self.done.set_exception(failure)

    def close(self) -> Future:
        with self.lock:
            self.closed = True
            self._resolve_if_done()
        return self.done

    def finished_one(self, module: str, pyc: tuple[str, bytes] | None) -> None:
        with self.lock:
            if pyc is not None:
                self.pycs[module] = pyc
            self.left -= 1
            self._resolve_if_done()

    def _resolve_if_done(self) -> None:
        if self.closed and self.left == 0 and not self.done.done():
            self.done.set_result(self.pycs)


class BytecodePool:
    """`workers` compiling interpreters (`executable -S`), fed one module at a time from one queue.

    Use as a context manager; leaving it ends the interpreters (their CPU seconds then count in
    RUSAGE_CHILDREN, as trees.children_cpu_seconds reads them). Each interpreter starts with the first
    module it is handed.
    """

    def __init__(self, executable: str, workers: int):
        self.executable, self.workers = executable, workers
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # within a job (and among the closing markers): submission order
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
            self._queue.put(((float("inf"), next(self._order)), None, None))
        for thread in self._threads:
            thread.join()

    def job(self) -> Job:
        """A new job: its modules are served after every earlier job's (a tree started earlier finishes
        earlier, and its layer can be written)."""
        job = Job(self, next(self._jobs))
        if self._failure is not None:
            job.done.set_exception(self._failure)
        return job

    def submit(self, modules: list[Module]) -> Future:
        """Compile `modules`, all known at once: a job of them, closed (its largest modules first)."""
        job = self.job()
        for module in sorted(modules, key=lambda m: -m.size):
            job.add(module)
        return job.close()

    def _enqueue(self, job: Job, module: Module) -> None:
        if self._failure is not None:
            self._fail(job, self._failure)
            return
        line = b"%s %d %d %s\n" % (os.fsencode(module.pack).hex().encode(), module.offset, module.size,
                                    os.fsencode(module.path).hex().encode())
        self._queue.put(((job.number, next(self._order)), job, (module.path, line)))

    def stop(self) -> None:
        """Compile nothing more: every job still queued or under way fails (the build is stopping), and
        the compilers are killed, so a module under way (or a wedged compiler) is not waited for."""
        self._failure = self._failure or ServestackError("bytecode: the build stopped before these files were compiled")
        with self._running_lock:
            for worker in self._running:
                worker.kill()

    def _fail(self, job: Job, failure: ServestackError) -> None:
        self._failure = self._failure or failure
        job.abandon(self._failure)

    def _serve(self) -> None:
        """One compiling interpreter: started here, fed until the pool closes. Whatever goes wrong with
        a module (the compiler cannot start: EAGAIN, EMFILE; it dies or hangs; a bug here) fails that
        module's job, and after a failure every job still queued fails with it, so no caller waits for ever."""
        with tempfile.TemporaryFile() as errors:
            worker = None  # started with the first module: a build of cached trees compiles nothing
            closed = False
            try:
                while True:
                    _, job, request = self._queue.get()
                    if job is None:
                        closed = True
                        return
                    if self._failure is not None:
                        self._fail(job, self._failure)
                        continue
                    if job.done.done():  # abandoned: its tree failed
                        continue
                    path, line = request
                    try:
                        if worker is None:
                            worker = self._start(errors)
                        pyc = self._compile(worker, line, path, errors)
                    except ServestackError as failure:
                        self._fail(job, failure)
                    except BaseException as error:
                        self._fail(job, ServestackError(f"bytecode: compiling {path} with {self.executable} -S failed: {error!r}"))
                    else:
                        job.finished_one(path, pyc)
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

    def _compile(self, worker: subprocess.Popen, line: bytes, path: str, errors) -> tuple[str, bytes] | None:
        """Hand the worker one module: its pyc's path in the image and bytes, None when it does not compile."""
        header: bytes | None = b""
        try:
            worker.stdin.write(line)
            worker.stdin.flush()
            # The worker writes nothing but answers, each whole, and only when asked: the reader's buffer
            # is empty between answers, so the pipe's readiness is the answer's.
            answered = select.select([worker.stdout], [], [], ANSWER_TIMEOUT_S)[0]
            header = worker.stdout.readline() if answered else None
            if header == b"S\n":
                return None
            if header:
                cfile, length = header.split()
                pyc = worker.stdout.read(int(length))
                if len(pyc) == int(length):
                    return os.fsdecode(bytes.fromhex(cfile.decode())), pyc
        except OSError:  # the pipe broke: the interpreter is gone
            pass
        except ValueError:  # it answered nonsense: it cannot be spoken to any more
            worker.kill()
        if header is None:
            worker.kill()
            raise ServestackError(f"bytecode: {self.executable} -S gave no answer in {ANSWER_TIMEOUT_S:.0f} s "
                                  f"while compiling {path}; killed it")
        errors.seek(0)
        raise ServestackError(f"bytecode: {self.executable} -S exited with {worker.wait()} while compiling {path}: "
                              f"{errors.read()[-2000:].decode(errors='replace')}")

    def _fail_queued(self, failure: ServestackError) -> None:
        """Fail every job still queued (the pool's closing markers go back for the other threads)."""
        self._failure = self._failure or failure
        markers = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item[1] is None:
                    markers.append(item)
                else:
                    self._fail(item[1], self._failure)
        for item in markers:
            self._queue.put(item)
