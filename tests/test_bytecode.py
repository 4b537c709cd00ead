"""The bytecode pool writes the same pycs, for the same files, as one compileall.compile_dir per tree."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from servestack.bytecode import BytecodePool, sources
from servestack.errors import ServestackError
from servestack import bytecode, trees
from servestack.trees import compiler

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
    """A small site-packages with what compile_dir treats specially."""
    site = root / "site"
    pkg = site / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .core import run\n")
    # Constants whose order or sharing the compiling interpreter's state could change: a frozenset of
    # strings (ordered by the hash seed), a tuple and a large int used twice, a float used once.
    (pkg / "names.py").write_text("WORDS = frozenset({%s})\nPAIR = (1000, 2.5)\nAGAIN = (1000, 'a b')\n"
                                  % ", ".join(repr(f"word{i}") for i in range(24)))
    (pkg / "core.py").write_text("import os\n\ndef run(line, stdin):\n    return [os.sep, line, stdin, 'warn \\d']\n" * 50)
    (pkg / "sub" / "deep.py").write_text("VALUES = {'a': 1, 'b': (2, 3), 'c': frozenset({'x', 'y'})}\n")
    (pkg / "broken.py").write_text("def broken(:\n")  # no pyc, no failure: compile_dir skips it too
    (pkg / "data.txt").write_text("not python\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "linked.py").symlink_to("core.py")
    (site / "linkdir").symlink_to("pkg", target_is_directory=True)  # not walked into
    (site / "top.py").write_text("print('top')\n")
    return site


def _pycs(site: Path) -> dict[str, bytes]:
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*.pyc"))
            if not any(part == "linkdir" for part in p.relative_to(site).parts)}


@pytest.mark.parametrize("workers", [1, 2])
def test_the_pool_writes_the_pycs_compile_dir_writes(tmp_path, interpreter, workers):
    serial, pooled = _site(tmp_path / "serial"), _site(tmp_path / "pooled")
    for site in serial, pooled:  # the largest file, so the one compiler checks it first and goes on
        (site / "pkg" / "broken_large.py").write_text("x = 1\n" * 2000 + "def broken(:\n")
    subprocess.run([interpreter, "-S", "-c", COMPILE_DIR, str(serial), DDIR], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": ""}, capture_output=True)
    with BytecodePool(interpreter, workers) as pool:
        pool.submit(pooled, DDIR, sources(pooled)).result(timeout=120)
    expected = _pycs(serial)
    assert "pkg/__pycache__/names.cpython-311.pyc" in expected and "pkg/__pycache__/linked.cpython-311.pyc" in expected
    assert not any("broken" in name for name in expected)
    assert _pycs(pooled) == expected


def test_many_trees_share_the_pool_and_each_resolves_when_its_files_are_written(tmp_path, interpreter):
    sites = [_site(tmp_path / str(n)) for n in range(3)]
    empty = tmp_path / "empty"
    empty.mkdir()
    with BytecodePool(interpreter, 2) as pool:
        jobs = [pool.submit(site, DDIR, sources(site)) for site in sites] + [pool.submit(empty, DDIR, [])]
        for job in jobs:
            job.result(timeout=120)
    assert _pycs(sites[0]) == _pycs(sites[1]) == _pycs(sites[2]) and len(_pycs(sites[0])) == 6


def test_a_compiler_that_dies_fails_the_jobs_naming_the_file_and_nobody_waits(tmp_path, interpreter):
    site = _site(tmp_path / "s")
    dying = tmp_path / "python-that-dies"
    dying.write_text("#!/bin/sh\necho 'compiler crashed' >&2\nexit 3\n")
    dying.chmod(0o755)
    with BytecodePool(str(dying), 2) as pool:
        first = pool.submit(site, DDIR, sources(site))
        with pytest.raises(ServestackError, match=r"exited with 3 while compiling .*\.py: compiler crashed"):
            first.result(timeout=60)
        with pytest.raises(ServestackError):
            pool.submit(site, DDIR, sources(site)).result(timeout=60)


def test_sources_are_the_py_files_compile_dir_visits(tmp_path):
    site = _site(tmp_path / "s")
    shutil.copy(site / "pkg" / "core.py", site / "pkg" / "__pycache__" / "stale.py")
    names = [p.relative_to(site).as_posix() for p in sources(site)]
    assert sorted(names) == ["pkg/__init__.py", "pkg/broken.py", "pkg/core.py", "pkg/linked.py", "pkg/names.py",
                             "pkg/sub/deep.py", "top.py"]


def test_a_stopped_pool_fails_what_is_queued_instead_of_compiling_it(tmp_path, interpreter):
    sites = [_site(tmp_path / str(n)) for n in range(3)]
    pool = BytecodePool(interpreter, 1)
    queued = [pool.submit(site, DDIR, sources(site)) for site in sites]  # no compiler is serving yet
    pool.stop()
    with pool:
        later = pool.submit(sites[0], DDIR, sources(sites[0]))
        for job in queued + [later]:
            with pytest.raises(ServestackError, match="the build stopped"):
                job.result(timeout=60)
    assert not any(_pycs(site) for site in sites)


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
    monkeypatch.setattr(trees, "compiler", lambda python, image_version: trees.Compiler("/usr/bin/python3.11", "3.11.7"))
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
            pool.submit(site, DDIR, sources(site)).result(timeout=10)
        with pytest.raises(ServestackError):
            pool.submit(site, DDIR, sources(site)).result(timeout=10)


def _wedged(tmp_path: Path) -> tuple[Path, Path]:
    """A compiler that reads its first file, says so on a FIFO, and then never answers."""
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
        job = pool.submit(site, DDIR, sources(site))
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
            job = pool.submit(site, DDIR, sources(site))
            _until_read(said)
            raise RuntimeError("a tree failed")
        left.set()

    threading.Thread(target=build, daemon=True).start()
    assert left.wait(timeout=30), "leaving the pool waited for the wedged compiler"
    with pytest.raises(ServestackError, match="the build stopped"):
        job.result(timeout=0)


def test_the_callers_python_variables_do_not_reach_the_compilers(tmp_path, interpreter, monkeypatch):
    """They are not part of a tree's key, yet each changed what the old pool wrote: debug ranges out
    of every pyc, opt-1 names, the pycs outside the tree, no pyc for a file with a warning."""
    serial, pooled = _site(tmp_path / "serial"), _site(tmp_path / "pooled")
    subprocess.run([interpreter, "-S", "-c", COMPILE_DIR, str(serial), DDIR], check=True, capture_output=True,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
                        "PYTHONHASHSEED": "0", "PYTHONPATH": ""})
    for name, value in {"PYTHONNODEBUGRANGES": "1", "PYTHONOPTIMIZE": "1", "PYTHONWARNINGS": "error",
                        "PYTHONPYCACHEPREFIX": str(tmp_path / "elsewhere")}.items():
        monkeypatch.setenv(name, value)
    with BytecodePool(interpreter, 2) as pool:
        pool.submit(pooled, DDIR, sources(pooled)).result(timeout=120)
    assert _pycs(pooled) == _pycs(serial)
    assert not (tmp_path / "elsewhere").exists()


def test_a_pyc_that_could_not_be_written_fails_the_job_naming_the_file(tmp_path, interpreter):
    """compile_file answers False both for a syntax error (no pyc, as compile_dir: fine) and for a write
    that failed (disk full): the second must not count as compiled."""
    site = _site(tmp_path / "s")
    (site / "pkg" / "sub" / "__pycache__").write_text("a file where the directory goes\n")
    with BytecodePool(interpreter, 1) as pool:
        with pytest.raises(ServestackError, match=r"no pyc was written for .*/pkg/sub/deep\.py, which compiles"):
            pool.submit(site, DDIR, sources(site)).result(timeout=120)
