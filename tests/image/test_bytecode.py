"""The bytecode pool makes the same pycs, for the same modules, as one compileall.compile_dir per tree."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from servestack.errors import ServestackError
from servestack.image import bytecode, trees
from servestack.image.bytecode import BytecodePool, Module
from servestack.image.trees import compiler

DDIR = "/opt/venv/lib/python3.11/site-packages"
# How trees were compiled before the pool: one interpreter per tree, one file at a time.
COMPILE_DIR = (
    "import compileall, py_compile, sys\n"
    "compileall.compile_dir(sys.argv[1], ddir=sys.argv[2], quiet=2, workers=1,\n"
    "                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
)


@pytest.fixture
def interpreter() -> str:
    found = compiler("3.11", None).executable
    if found is None:
        pytest.skip("no python3.11 on this host")
    return found


def _site(root: Path) -> Path:
    """A small site-packages with what compile_dir treats specially (a tree holds no symlinks: wheels cannot)."""
    site = root / "site"
    pkg = site / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .core import run\n")
    # Constants whose order or sharing the compiling interpreter's state could change: a frozenset of
    # strings (ordered by the hash seed), a tuple and a large int used twice, a float used once.
    words = ", ".join(repr(f"word{i}") for i in range(24))
    (pkg / "names.py").write_text(f"WORDS = frozenset({{{words}}})\nPAIR = (1000, 2.5)\nAGAIN = (1000, 'a b')\n")
    (pkg / "core.py").write_text("import os\n\ndef run(line, stdin):\n    return [os.sep, line, stdin, 'warn \\d']\n" * 50)
    (pkg / "sub" / "deep.py").write_text("VALUES = {'a': 1, 'b': (2, 3), 'c': frozenset({'x', 'y'})}\n")
    (pkg / "broken.py").write_text("def broken(:\n")  # no pyc, no failure: compile_dir skips it too
    (pkg / "data.txt").write_text("not python\n")
    (site / "top.py").write_text("print('top')\n")
    return site


def _modules(site: Path) -> list[Module]:
    """The site's modules in one pack beside it, as an installed tree keeps them."""
    pack, modules = site.with_name(site.name + ".pack"), []
    with open(pack, "wb") as out:
        for path in sorted(site.rglob("*.py")):
            source = path.read_bytes()
            modules.append(Module(pack=pack, offset=out.tell(), size=len(source), path=f"{DDIR}/{path.relative_to(site).as_posix()}"))
            out.write(source)
    return modules


def _made(pycs: dict[str, tuple[str, bytes]]) -> dict[str, bytes]:
    """What a job resolved with, as compile_dir's pycs are named below: by path under the site."""
    return {path.removeprefix(DDIR + "/"): pyc for path, pyc in pycs.values()}


def _pycs(site: Path) -> dict[str, bytes]:
    """What compile_dir wrote."""
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*.pyc"))}


def _compile_dir(interpreter: str, site: Path) -> dict[str, bytes]:
    subprocess.run([interpreter, "-S", "-c", COMPILE_DIR, str(site), DDIR], check=True, capture_output=True,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
                        "PYTHONHASHSEED": "0", "PYTHONPATH": ""})
    return _pycs(site)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_pool_makes_the_pycs_compile_dir_writes(tmp_path, interpreter, workers):
    site = _site(tmp_path / "site")  # the largest file, so the one compiler meets it first and goes on
    (site / "pkg" / "broken_large.py").write_text("x = 1\n" * 2000 + "def broken(:\n")
    modules = _modules(site)
    with BytecodePool(interpreter, workers) as pool:
        made = pool.submit(modules).result(timeout=120)
    expected = _compile_dir(interpreter, site)
    assert "pkg/__pycache__/names.cpython-311.pyc" in expected
    assert not any("broken" in name for name in expected)
    assert _made(made) == expected


def test_a_module_compiled_after_others_in_one_compiler_gets_the_pyc_compile_dir_writes(tmp_path, interpreter):
    """While a module compiled earlier in the same interpreter was still alive, marshal left the
    back-reference flag off one of ftplib's constant frozensets: the pyc then depended on which
    modules one compiler happened to be handed before (found on aiohttp/multipart.py)."""
    stdlib = subprocess.run([interpreter, "-S", "-c", "import ftplib; print(ftplib.__file__)"], check=True,
                            capture_output=True, text=True).stdout.strip()
    site = tmp_path / "site"
    for copy in "abc":
        (site / copy).mkdir(parents=True)
        shutil.copy(stdlib, site / copy / "ftplib.py")
    with BytecodePool(interpreter, 1) as pool:
        made = _made(pool.submit(_modules(site)).result(timeout=120))
    expected = _compile_dir(interpreter, site)
    assert len(expected) == 3 and made == expected


def test_many_trees_share_the_pool_and_each_resolves_with_its_own_pycs(tmp_path, interpreter):
    sites = [_site(tmp_path / str(n)) for n in range(3)]
    with BytecodePool(interpreter, 2) as pool:
        jobs = [pool.submit(_modules(site)) for site in sites] + [pool.submit([])]
        made = [job.result(timeout=120) for job in jobs]
    assert made[3] == {}
    assert _made(made[0]) == _made(made[1]) == _made(made[2]) and len(made[0]) == 5
    assert {pack for pycs in made[:3] for pack in pycs} == {m.path for site in sites for m in _modules(site)
                                                             if "broken" not in m.path}


def test_a_compiler_that_dies_fails_the_jobs_naming_the_file_and_nobody_waits(tmp_path, interpreter):
    site = _site(tmp_path / "s")
    dying = tmp_path / "python-that-dies"
    dying.write_text("#!/bin/sh\necho 'compiler crashed' >&2\nexit 3\n")
    dying.chmod(0o755)
    with BytecodePool(str(dying), 2) as pool:
        first = pool.submit(_modules(site))
        with pytest.raises(ServestackError, match=r"exited with 3 while compiling .*\.py: compiler crashed"):
            first.result(timeout=60)
        with pytest.raises(ServestackError):
            pool.submit(_modules(site)).result(timeout=60)


def test_a_stopped_pool_fails_what_is_queued_instead_of_compiling_it(tmp_path, interpreter):
    sites = [_site(tmp_path / str(n)) for n in range(3)]
    pool = BytecodePool(interpreter, 1)
    queued = [pool.submit(_modules(site)) for site in sites]  # no compiler is serving yet
    pool.stop()
    with pool:
        later = pool.submit(_modules(sites[0]))
        for job in queued + [later]:
            with pytest.raises(ServestackError, match="the build stopped"):
                job.result(timeout=60)


def test_install_all_starts_one_compiler_per_cpu_it_may_run_on(monkeypatch):
    """Not one per host CPU: in a cpuset of 1 CPU on a 64-CPU host, 64 compilers would share it."""
    started = []

    class Recording:
        def __init__(self, executable, workers):
            started.append(workers)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(trees, "BytecodePool", Recording)
    monkeypatch.setattr(trees, "compiler", lambda python, image_version: trees.Compiler(executable="/usr/bin/python3.11", version="3.11.7"))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert trees.install_all([], "3.11", None) == []
    assert started == [1]


def test_a_compiler_that_cannot_start_fails_the_job_naming_the_file(tmp_path):
    """proc.pipe raising (no such file here; EAGAIN, EMFILE on a loaded host) used to end the pool's
    threads with the job never resolved, and install_all waited for it for ever."""
    site = _site(tmp_path / "s")
    with BytecodePool(str(tmp_path / "no-such-python3.11"), 2) as pool:
        with pytest.raises(ServestackError, match=r"compiling .*\.py with .*no-such-python3.11 -S failed"):
            pool.submit(_modules(site)).result(timeout=10)
        with pytest.raises(ServestackError):
            pool.submit(_modules(site)).result(timeout=10)


def _wedged(tmp_path: Path) -> tuple[Path, Path]:
    """A compiler that reads its first request, says so on a FIFO, and then never answers."""
    said = tmp_path / "read-a-file"
    os.mkfifo(said)
    wedged = tmp_path / "python-that-hangs"
    wedged.write_text(f"#!/bin/sh\nread line\necho read > '{said}'\nexec sleep 3600\n")
    wedged.chmod(0o755)
    return wedged, said


def _until_read(said: Path) -> None:
    with open(said) as fifo:  # returns once the compiler has opened it to write
        assert fifo.read() == "read\n"


def test_a_wedged_compiler_is_killed_after_the_answer_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(bytecode, "ANSWER_TIMEOUT_S", 1.0)
    wedged, said = _wedged(tmp_path)
    site = _site(tmp_path / "s")
    with BytecodePool(str(wedged), 1) as pool:
        job = pool.submit(_modules(site))
        _until_read(said)
        with pytest.raises(ServestackError, match=r"gave no answer in 1 s while compiling .*\.py"):
            job.result(timeout=30)


def test_leaving_the_pool_on_an_error_kills_a_wedged_compiler_instead_of_waiting(tmp_path):
    wedged, said = _wedged(tmp_path)
    site = _site(tmp_path / "s")
    left = threading.Event()
    job = None

    def build():
        nonlocal job
        with contextlib.suppress(RuntimeError), BytecodePool(str(wedged), 1) as pool:
            job = pool.submit(_modules(site))
            _until_read(said)
            raise RuntimeError("a tree failed")
        left.set()

    threading.Thread(target=build, daemon=True).start()
    assert left.wait(timeout=30), "leaving the pool waited for the wedged compiler"
    with pytest.raises(ServestackError, match="the build stopped"):
        job.result(timeout=0)


def test_the_callers_python_variables_do_not_reach_the_compilers(tmp_path, interpreter, monkeypatch):
    """They are not part of a tree's key, yet each changed what the old pool wrote: debug ranges out
    of every pyc, opt-1 names, the pycs outside the tree, no pyc for a module with a warning."""
    site = _site(tmp_path / "site")
    expected = _compile_dir(interpreter, _site(tmp_path / "serial"))
    for name, value in {"PYTHONNODEBUGRANGES": "1", "PYTHONOPTIMIZE": "1", "PYTHONWARNINGS": "error",
                        "PYTHONPYCACHEPREFIX": str(tmp_path / "elsewhere")}.items():
        monkeypatch.setenv(name, value)
    with BytecodePool(interpreter, 2) as pool:
        made = _made(pool.submit(_modules(site)).result(timeout=120))
    assert made == expected


def test_a_job_takes_modules_as_they_come_and_resolves_once_closed_and_compiled(tmp_path, interpreter):
    """A tree hands each module over as soon as it is installed: the compilers work while the rest of
    the wheel installs, and the tree waits only for the last."""
    site = _site(tmp_path / "site")
    modules = _modules(site)
    with BytecodePool(interpreter, 2) as pool:
        job = pool.job()
        job.add(modules[0])
        deadline = time.monotonic() + 60
        while job.left and time.monotonic() < deadline:  # compiled while the job is still open
            threading.Event().wait(0.01)
        assert job.left == 0 and not job.done.done()
        for module in modules[1:]:
            job.add(module)
        made = job.close().result(timeout=120)
        with pytest.raises(RuntimeError, match="closed job"):
            job.add(modules[0])
        assert pool.job().close().result(timeout=10) == {}
    assert _made(made) == _compile_dir(interpreter, site)


def test_a_module_that_raises_while_compiling_is_skipped_as_compile_dir_skips_it(tmp_path, interpreter):
    """py_compile turns any exception from compiling into an error compile_dir skips the module for:
    compiling's recursion limit too, not only a syntax error."""
    site = _site(tmp_path / "site")
    (site / "pkg" / "deep_sum.py").write_text("x = " + "1 + " * 200_000 + "1\n")
    with BytecodePool(interpreter, 1) as pool:
        made = _made(pool.submit(_modules(site)).result(timeout=120))
    expected = _compile_dir(interpreter, site)
    assert not any("deep_sum" in name for name in expected) and made == expected


def test_an_abandoned_jobs_modules_are_dropped_not_read_from_its_gone_pack(tmp_path, interpreter):
    """A tree that fails removes its pack while its modules may still be queued: a compiler reading one
    died, and failed every other tree's job with it."""
    failed, healthy = _site(tmp_path / "failed"), _site(tmp_path / "healthy")
    pool = BytecodePool(interpreter, 1)
    job = pool.job()
    for module in _modules(failed):  # queued before any compiler serves
        job.add(module)
    job.abandon(ServestackError("the wheel did not install"))
    failed.with_name(failed.name + ".pack").unlink()
    with pool:
        made = _made(pool.submit(_modules(healthy)).result(timeout=120))
    assert made == _compile_dir(interpreter, healthy)
    with pytest.raises(ServestackError, match="did not install"):
        job.close().result(timeout=0)


def test_a_compiler_is_handed_more_modules_before_it_has_answered_the_first(tmp_path, monkeypatch):
    """It starts on the next module as soon as it has written an answer, not once this process has read
    it and sent another: this compiler reads two requests before it answers either."""
    monkeypatch.setattr(bytecode, "ANSWER_TIMEOUT_S", 10.0)
    pairs = tmp_path / "python-that-reads-two"
    pairs.write_text("#!/bin/sh\nwhile read first && read second; do printf 'S\\nS\\n'; done\n")
    pairs.chmod(0o755)
    modules = _modules(_site(tmp_path / "s"))[:4]
    with BytecodePool(str(pairs), 1) as pool:
        assert pool.submit(modules).result(timeout=30) == {}  # every module answered (as not compiling)


def test_answers_are_read_whole_however_the_pipe_splits_or_joins_them():
    """Several in flight: one read may hold the end of one answer and the start of the next."""
    read, write = os.pipe()
    answers = bytecode._Answers(read)
    try:
        os.write(write, b"S\nab 5\nhel")
        assert answers.line() == b"S\n" and answers.line() == b"ab 5\n"
        threading.Timer(0.05, os.write, (write, b"lo")).start()  # the rest comes later
        assert answers.exactly(5) == b"hello"
        os.close(write)
        with pytest.raises(EOFError):
            answers.line()
    finally:
        os.close(read)


def test_a_job_abandoned_with_modules_in_flight_fails_alone_and_the_pool_goes_on(tmp_path, interpreter, monkeypatch):
    """A failed tree removes its pack while some of its modules are already in a compiler's standard
    input: the compiler reading one died, and every other tree's job failed with it."""
    failed, healthy = _site(tmp_path / "failed"), _site(tmp_path / "healthy")
    pool = BytecodePool(interpreter, 1)
    job = pool.job()
    for module in _modules(failed):  # queued before any compiler serves, with the healthy job's after
        job.add(module)
    healthy_job = pool.submit(_modules(healthy))
    start = BytecodePool._start

    def start_then_fail_the_tree_as_its_first_module_goes_in(self, errors):
        worker = start(self, errors)
        write = worker.stdin.write

        def write_after_the_tree_failed(line):  # the module passed the pool's check: its job was alive
            if not job.done.done():
                job.abandon(ServestackError("the wheel did not install"))
                failed.with_name(failed.name + ".pack").unlink()
            return write(line)

        monkeypatch.setattr(worker.stdin, "write", write_after_the_tree_failed, raising=False)
        return worker

    monkeypatch.setattr(BytecodePool, "_start", start_then_fail_the_tree_as_its_first_module_goes_in)
    with pool:
        made = _made(healthy_job.result(timeout=120))
    assert made == _compile_dir(interpreter, healthy)
    with pytest.raises(ServestackError, match="did not install"):
        job.close().result(timeout=0)


def test_a_module_whose_pack_cannot_be_read_fails_its_job_naming_both_and_no_other(tmp_path, interpreter):
    gone, healthy = _site(tmp_path / "gone"), _site(tmp_path / "healthy")
    modules = _modules(gone)
    pack = gone.with_name(gone.name + ".pack")
    pack.unlink()
    with BytecodePool(interpreter, 1) as pool:
        failing = pool.submit(modules)
        made = _made(pool.submit(_modules(healthy)).result(timeout=120))
        with pytest.raises(ServestackError, match=rf"the source of {DDIR}/.*\.py could not be read from {pack}"):
            failing.result(timeout=0)
    assert made == _compile_dir(interpreter, healthy)


def test_a_compiler_that_closes_its_output_but_lives_on_is_killed_not_waited_for(tmp_path):
    """Its answers end (EOFError) while it still runs: waiting for it to exit would wait for ever."""
    closing = tmp_path / "python-that-closes-its-output"
    closing.write_text("#!/bin/sh\nexec >&-\nexec sleep 60\n")
    closing.chmod(0o755)
    with BytecodePool(str(closing), 1) as pool:
        with pytest.raises(ServestackError, match=r"exited with -9 while compiling .*\.py"):
            pool.submit(_modules(_site(tmp_path / "s"))).result(timeout=20)


def test_a_failed_write_names_the_module_the_compiler_died_on_not_the_one_being_written(tmp_path, monkeypatch):
    dying = tmp_path / "python-that-dies-on-the-first"
    dying.write_text("#!/bin/sh\nread line\necho 'crashed' >&2\nexit 3\n")
    dying.chmod(0o755)
    first, second = _modules(_site(tmp_path / "s"))[:2]
    pool = BytecodePool(str(dying), 1)
    job = pool.job()
    job.add(first)
    job.add(second)
    start = BytecodePool._start

    def start_and_write_the_second_once_it_died(self, errors):
        worker = start(self, errors)
        write, written = worker.stdin.write, []

        def write_once_it_died(line):
            if written:
                worker.wait()  # it read the first module and exited
            written.append(line)
            return write(line)

        monkeypatch.setattr(worker.stdin, "write", write_once_it_died, raising=False)
        return worker

    monkeypatch.setattr(BytecodePool, "_start", start_and_write_the_second_once_it_died)
    with pool:
        with pytest.raises(ServestackError, match=rf"exited with 3 while compiling {first.path}: crashed"):
            job.close().result(timeout=30)


def test_answers_are_read_from_a_descriptor_select_would_refuse(tmp_path):
    """select() raises ValueError from descriptor 1024 on; a build with many compilers and files open
    gets there."""
    read, write = os.pipe()
    high = os.dup2(read, 1500)
    try:
        os.write(write, b"S\n")
        assert bytecode._Answers(high).line() == b"S\n"
    finally:
        for fd in (read, write, high):
            os.close(fd)
