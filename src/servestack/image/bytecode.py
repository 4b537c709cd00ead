"""Bytecode for the installed trees, compiled module by module on every core, in memory.

One compiling interpreter per core stays up for the whole build and is handed modules from a queue
that all trees share (the earliest started tree's first), each as soon as it is installed, a few ahead
of its answers so it never waits for this process. Each
module's source is read from its tree's pack (trees.py: a tree is one file of contents, not thousands
of files), and its pyc comes back over the pipe: no source is written out and no pyc is written in,
each of which cost a file creation (200-700 us of kernel time here; 21,350 modules compiled and
41,597 files for dev-cpu).

The pycs are byte-identical to `compileall.compile_dir`'s: each module goes through what
py_compile.compile does (SourceFileLoader.source_to_code with the module's path in the image as its
file name, then an unchecked-hash pyc), in an interpreter started the same way (-S, PYTHONHASHSEED=0:
see trees.compiler) with the same modules imported. What else is alive in the compiling interpreter
can matter (marshal flags an object for back-references by its refcount; site's imports changed a
pyc, see trees.compiler), so the worker imports nothing compile_dir's script did not, and names its
variables only as py_compile.compile and compileall.compile_file do: an identifier of its own that a
module uses once would be an interned string with a second reference. tests/image/test_bytecode.py
compares the pycs with compile_dir's, file by file.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
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
from typing import IO

from servestack.errors import ServestackError
from servestack.util import proc

# Each request line: the pack (hex of its filesystem bytes), the source's offset and size in it, and
# the module's path in the image (hex). Each answer: "S\n" when the module does not compile (a syntax
# error, a null byte: compile_dir skips those the same way), "E\n" when its pack cannot be read (a
# failed tree's pack is removed while its modules may still be in the worker's standard input), else
# a line with the pyc's path in the image (hex) and its length, then the pyc's bytes. Any other
# failure ends the worker, its traceback on standard error.
WORKER = (
    "import compileall, py_compile, sys\n"
    "while fullname := sys.stdin.buffer.readline():\n"
    "    file, head, tail, dfile = fullname.split()\n"
    "    try:\n"
    "        with open(bytes.fromhex(file.decode()), 'rb') as loader:\n"
    "            loader.seek(int(head))\n"
    "            source_bytes = loader.read(int(tail))\n"
    "    except OSError:\n"
    "        sys.stdout.buffer.write(b'E\\n')\n"
    "        sys.stdout.buffer.flush()\n"
    "        del file, head, tail, dfile\n"
    "        continue\n"
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
# Modules with each compiler at once (see BytecodePool._serve), and its answer pipe's size.
IN_FLIGHT = 8
PIPE_BYTES = 1 << 20


def worker_base_env() -> dict[str, str]:
    """This process's environment without its PYTHON* variables (WORKER_ENV then sets the two that count)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}


@dataclass(frozen=True, kw_only=True)
class Module:
    """A module's source: `size` bytes at `offset` in `pack`, at `path` in the image (absolute: the pyc's
    co_filename and its __pycache__ name come from it)."""

    pack: Path
    offset: int
    size: int
    path: str


@dataclass(kw_only=True)
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


def _pipes(worker: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes]]:
    """The compiler's standard input and output (proc.pipe makes both)."""
    if worker.stdin is None or worker.stdout is None:
        raise ServestackError("bytecode: the compiler was started without its pipes")
    return worker.stdin, worker.stdout


class BytecodePool:
    """`workers` compiling interpreters (`executable -S`), fed modules from one queue, a few at a time each.

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
        self._running: list[subprocess.Popen[bytes]] = []  # the compilers, killed by stop()
        self._running_lock = threading.Lock()

    def __enter__(self) -> BytecodePool:
        for n in range(self.workers):
            thread = threading.Thread(target=self._serve, name=f"bytecode-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None:
            self.stop()
        for _ in self._threads:
            self._queue.put(((float("inf"), next(self._order)), None, None))
        for thread in self._threads:
            thread.join()

    def job(self) -> Job:
        """A new job: its modules are served after every earlier job's (a tree started earlier finishes
        earlier, and its layer can be written)."""
        job = Job(pool=self, number=next(self._jobs))
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
        self._queue.put(((job.number, next(self._order)), job, (module, line)))

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

    def _fail_all(self, in_flight: collections.deque[tuple[Job, Module]], failure: ServestackError) -> None:
        """Every job with a module in flight fails with `failure`; the compiler has none left."""
        for job, _ in in_flight:
            self._fail(job, failure)
        in_flight.clear()

    def _serve(self) -> None:
        """One compiling interpreter: started here, fed until the pool closes. Whatever goes wrong with
        a module (the compiler cannot start: EAGAIN, EMFILE; it dies or hangs; a bug here) fails that
        module's job, and after a failure every job still queued fails with it, so no caller waits for ever.

        Up to IN_FLIGHT modules are with the compiler at once: it starts on the next as soon as it has
        written an answer, rather than waiting for this thread to read it and send another, which needs
        the GIL that the installing threads hold for up to its switch interval (5 ms) at a time: with one
        at a time the compilers of a cold dev-cpu build waited 38 s each."""
        with tempfile.TemporaryFile() as errors:
            worker = None  # started with the first module: a build of cached trees compiles nothing
            answers: _Answers | None = None
            in_flight: collections.deque[tuple[Job, Module]] = collections.deque()
            closed = False
            try:
                while True:
                    while not closed and len(in_flight) < IN_FLIGHT:
                        try:  # wait for a module only when the compiler has none
                            _, job, request = self._queue.get(block=not in_flight)
                        except queue.Empty:
                            break
                        if job is None:
                            closed = True
                        elif self._failure is not None:
                            self._fail(job, self._failure)
                        elif not job.done.done():  # else abandoned: its tree failed
                            module, line = request
                            in_flight.append((job, module))
                            try:
                                if worker is None:
                                    worker = self._start(errors)
                                    answers = _Answers(_pipes(worker)[1].fileno())
                                to_worker = _pipes(worker)[0]
                                to_worker.write(line)
                                to_worker.flush()
                            except BaseException as error:
                                # The compiler died on the oldest module it was handed, not this one.
                                self._fail_all(in_flight, self._failed(worker, in_flight[0][1].path, error, errors))
                    if not in_flight:
                        if closed:
                            return
                        continue
                    job, module = in_flight.popleft()
                    try:
                        pyc = self._answer(answers)
                    except _Unreadable:  # only this job fails (nothing, when it was abandoned already)
                        job.abandon(ServestackError(f"bytecode: the source of {module.path} could not be read "
                                                    f"from {module.pack} (bytes {module.offset}+{module.size})"))
                    except BaseException as error:
                        in_flight.appendleft((job, module))
                        self._fail_all(in_flight, self._failed(worker, module.path, error, errors))
                    else:
                        job.finished_one(module.path, pyc)
            finally:
                if not closed:  # this thread is ending early: no job may be left waiting for it
                    failure = ServestackError(f"bytecode: {threading.current_thread().name} ended early")
                    self._fail_all(in_flight, failure)
                    self._fail_queued(failure)
                if worker is not None:
                    with contextlib.suppress(OSError):
                        _pipes(worker)[0].close()
                    worker.wait()

    def _start(self, errors: IO[bytes]) -> subprocess.Popen[bytes]:
        worker = proc.pipe([self.executable, "-S", "-c", WORKER], env=WORKER_ENV, base_env=worker_base_env(),
                           stderr=errors)
        with self._running_lock:
            self._running.append(worker)
            if self._failure is not None:  # stop() came while it started
                worker.kill()
        # A pipe as big as an unprivileged process may make it (Linux; 64 KB by default): a compiler
        # writing a large pyc, or several answers, does not block until this thread next gets the GIL.
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(_pipes(worker)[1].fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        return worker

    @staticmethod
    def _answer(answers: _Answers | None) -> tuple[str, bytes] | None:
        """The compiler's answer about its oldest module: its pyc's path in the image and bytes, None when
        it does not compile; _Unreadable when its pack could not be read."""
        if answers is None:  # a module is in flight only once a compiler started
            raise ServestackError("bytecode: an answer was awaited from a compiler that never started")
        header = answers.line()
        if header == b"S\n":
            return None
        if header == b"E\n":
            raise _Unreadable
        cfile, length = header.split()
        return os.fsdecode(bytes.fromhex(cfile.decode())), answers.exactly(int(length))

    def _failed(self, worker: subprocess.Popen[bytes] | None, path: str, error: BaseException,
                errors: IO[bytes]) -> ServestackError:
        """What went wrong speaking to the compiler about `path`; the compiler is then killed and reaped."""
        if isinstance(error, ServestackError) or worker is None:  # it did not start
            return error if isinstance(error, ServestackError) else ServestackError(
                f"bytecode: compiling {path} with {self.executable} -S failed: {error!r}")
        # Killed even when it seems to have exited (a broken pipe, its output closed): one still running
        # would be waited for below, with modules in flight, for ever. Killing an exited process does nothing.
        worker.kill()
        if isinstance(error, TimeoutError):
            return ServestackError(f"bytecode: {self.executable} -S gave no answer in {ANSWER_TIMEOUT_S:.0f} s "
                                   f"while compiling {path}; killed it")
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
                if item[1] is None:
                    markers.append(item)
                else:
                    self._fail(item[1], self._failure)
        for item in markers:
            self._queue.put(item)


class _Unreadable(Exception):
    """The compiler could not read a module's source from its pack (its tree failed and removed it)."""


class _Answers:
    """A compiler's standard output, read as its answers come, into a buffer of this module's own: with
    several modules in flight, part of the next answer may be read with this one, and a poll() on the
    pipe then says nothing about it (a BufferedReader's buffer cannot be asked)."""

    READ = 1 << 16  # below malloc's mmap threshold: a read's buffer costs no mmap and munmap

    def __init__(self, fd: int):
        self.fd, self.buffer, self.start = fd, b"", 0
        # poll, not select: select refuses descriptors from 1024 on (a process with many threads and
        # compilers, one pipe pair each, or many open files, gets there).
        self.readable = select.poll()
        self.readable.register(fd, select.POLLIN)

    def line(self) -> bytes:
        while (end := self.buffer.find(b"\n", self.start)) < 0:
            self._more()
        return self._take(end + 1 - self.start)

    def exactly(self, n: int) -> bytes:
        while len(self.buffer) - self.start < n:
            self._more()
        return self._take(n)

    def _take(self, n: int) -> bytes:
        # What is taken is left in place (the start moves on): dropping it from the front of a buffer
        # would move the rest, a pipe-full at worst, once per answer.
        taken = self.buffer[self.start:self.start + n]
        self.start += n
        return taken

    def _more(self) -> None:
        """Whatever the pipe holds: TimeoutError when the compiler writes nothing for ANSWER_TIMEOUT_S,
        EOFError when it has exited."""
        if not self.readable.poll(ANSWER_TIMEOUT_S * 1000):
            raise TimeoutError
        data = os.read(self.fd, self.READ)
        if not data:
            raise EOFError
        self.buffer, self.start = self.buffer[self.start:] + data, 0
