"""Installed trees in the cache: a tree is there whole or not at all. Which host interpreter compiles their
bytecode: the image's exact Python version wherever PATH has it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servestack.debian import tarball
from servestack.errors import ServestackError
from servestack.image import layers, trees
from servestack.image.bytecode import BytecodePool
from servestack.image.trees import installed_tree
from servestack.records.lockfile import DebianBase, LockedDeb
from servestack.wheels import pack_wheel

COMPILED_BY = "3.11.2"  # the version a tree's key names; the compilers below are scripts


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel_with(tmp_path: Path, name: str, files: dict[str, str], executable: tuple[str, ...] = ()) -> tuple[Path, str]:
    """A wheel of `name` 1.0 holding `files` (path in the wheel: text), `executable` ones with mode 0755."""
    root = tmp_path / f"{name}-unpacked"
    info = f"{name}-1.0.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n", **files}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
        (root / path).chmod(0o755 if path in executable else 0o644)
    wheel = pack_wheel(root, tmp_path / "wheels", epoch=1_700_000_000)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


def _wheel(tmp_path: Path) -> tuple[Path, str]:
    return _wheel_with(tmp_path, "tiny", {"tiny/__init__.py": "VALUE = 1\n", "tiny/more.py": "OTHER = 2\n"})


def _compiler(tmp_path: Path, does: str) -> str:
    script = tmp_path / "python3.11"
    script.write_text(f"#!/bin/sh\n{does}\n")
    script.chmod(0o755)
    return str(script)


def test_a_tree_whose_bytecode_fails_leaves_nothing_in_the_cache(tmp_path, cache):
    wheel, sha256 = _wheel(tmp_path)
    dying = _compiler(tmp_path, "read line\necho 'compiler crashed' >&2\nexit 3")
    with BytecodePool(dying, 1) as pool:
        with pytest.raises(ServestackError, match="exited with 3 while compiling"):
            installed_tree(wheel, sha256, "3.11", COMPILED_BY, pool)
    assert list((cache / "installed").iterdir()) == []  # the wheel was installed, then removed with its staging


def test_a_tree_under_way_when_the_build_is_interrupted_leaves_nothing_in_the_cache(tmp_path, cache):
    """On Ctrl-C install_all stops the compilers (BytecodePool.stop): the tree being made fails and goes."""
    wheel, sha256 = _wheel(tmp_path)
    said = tmp_path / "read-a-file"
    os.mkfifo(said)
    wedged = _compiler(tmp_path, f"read line\necho read > '{said}'\nexec sleep 3600")
    with BytecodePool(wedged, 1) as pool, ThreadPoolExecutor(max_workers=1) as making:
        tree = making.submit(installed_tree, wheel, sha256, "3.11", COMPILED_BY, pool)
        with open(said) as fifo:  # the wheel is installed and its bytecode under way
            assert fifo.read() == "read\n"
        pool.stop()
        with pytest.raises(ServestackError, match="the build stopped"):
            tree.result(timeout=60)
    assert list((cache / "installed").iterdir()) == []


def test_a_made_tree_is_renamed_into_place_whole(tmp_path, cache):
    wheel, sha256 = _wheel(tmp_path)
    tree = installed_tree(wheel, sha256, "3.11", "none", None)
    assert tree.made and [p.name for p in (cache / "installed").iterdir()] == [tree.path.name]
    assert {e.path for e in tree.entries} >= {"opt/venv/lib/python3.11/site-packages/tiny/more.py"}
    assert (tree.path / "entries.json").is_file() and (tree.path / "timing.json").is_file()


def test_a_made_trees_entries_are_the_ones_a_later_build_reads_from_the_cache(tmp_path, cache):
    """The made tree's entries are built in memory, not read back: they must be what entries.json holds,
    their bytes in the pack in place (not the staging name it was made under)."""
    wheel, sha256 = _wheel(tmp_path)
    made = installed_tree(wheel, sha256, "3.11", "none", None)
    again = installed_tree(wheel, sha256, "3.11", "none", None)
    assert made.made and not again.made
    assert made.entries == again.entries and {e.source for e in made.entries} == {made.path / trees.PACK}
    by_path = {e.path: e for e in made.entries}
    assert layers.content(by_path[trees.site_packages("3.11") + "/tiny/__init__.py"]) == b"VALUE = 1\n"


def test_a_tree_another_build_put_in_place_first_is_the_one_returned(tmp_path, cache, monkeypatch):
    """Two builds made the same tree at once and the other renamed its own into place first: ours goes, and
    the entries returned are theirs, pointing into their pack (theirs may lay its files out otherwise)."""
    wheel, sha256 = _wheel(tmp_path)
    theirs = installed_tree(wheel, sha256, "3.11", "none", None).path
    aside = theirs.rename(tmp_path / "theirs")
    listed = json.loads((aside / "entries.json").read_text())
    listed[0][-1] = 7  # their first file elsewhere in their pack than in ours
    (aside / "entries.json").write_text(json.dumps(listed))
    written = trees.atomic_write_json

    def timing_then_theirs_lands(path, doc):  # timing.json is the last thing written before the rename
        written(path, doc)
        aside.rename(theirs)

    monkeypatch.setattr(trees, "atomic_write_json", timing_then_theirs_lands)
    tree = installed_tree(wheel, sha256, "3.11", "none", None)
    assert tree.entries == tuple(layers.load_entries(theirs / "entries.json", theirs)) and tree.entries[0].offset == 7
    assert [p.name for p in (cache / "installed").iterdir()] == [theirs.name]  # our staging is gone


def test_a_tree_that_cannot_be_put_in_place_fails_and_leaves_nothing(tmp_path, cache, monkeypatch):
    wheel, sha256 = _wheel(tmp_path)

    def refused(self, target):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "rename", refused)
    with pytest.raises(PermissionError):
        installed_tree(wheel, sha256, "3.11", "none", None)
    assert list((cache / "installed").iterdir()) == []


def _raw_wheel(tmp_path: Path, name: str, files: dict[str, str]) -> tuple[Path, str]:
    """A wheel whose member names are taken as they are (a directory would resolve `..`), with its RECORD."""
    import base64
    import zipfile

    info = f"{name}-1.0.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n", **files}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{info}/RECORD,,\n"
    wheel = tmp_path / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            out.writestr(path, text)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


@pytest.mark.parametrize("path", ["../../../../../../etc/passwd", "../venv2/x", "a/../../x"])
def test_a_wheel_file_outside_its_scheme_directory_is_refused(tmp_path, cache, path):
    wheel, sha256 = _raw_wheel(tmp_path, "escape", {"escape/__init__.py": "", f"escape-1.0.data/data/{path}": "x\n"})
    with pytest.raises(ServestackError, match=r"escape-1\.0-py3-none-any\.whl: .* would be installed outside /opt/venv$"):
        installed_tree(wheel, sha256, "3.11", "none", None)
    assert list((cache / "installed").iterdir()) == []


@pytest.mark.parametrize("path, clash", [
    ("a/b/c", "files below a/b/c"),
    ("a", "files below a"),
    ("a/b/y", "a file at a/b/y"),
    ("a/b/y/z/w", "a file at a/b/y"),
    ("a/b/c/x.py/deeper/still", "a file at a/b/c/x.py"),
])
def test_a_path_is_refused_where_a_file_is_or_its_directories_go(path, clash):
    files = trees._Files(Path("w-1.0-py3-none-any.whl"))
    for claimed in ("a/b/c/x.py", "a/b/y"):
        files.claim(claimed, "a file")
        files[claimed] = trees._Packed(offset=0, size=0, sha256="", executable=False)
    with pytest.raises(ServestackError, match=f"a file cannot be at {path}: the wheel installs {clash}$"):
        files.claim(path, "a file")
    files.claim("a/b/c/other/deeper.py", "a file")  # beside what is there: no clash
    assert files.directories == {"a", "a/b", "a/b/c", "a/b/c/other"}


def _rich_wheel(tmp_path: Path) -> tuple[Path, str]:
    """A wheel with what installing treats specially: an entry point, a script and a header in .data, an
    executable module, a module that does not compile, a nested package."""
    return _wheel_with(tmp_path, "rich", {
        "rich/__init__.py": "from .sub.deep import VALUES\n",
        "rich/sub/__init__.py": "",
        "rich/sub/deep.py": "VALUES = {'a': frozenset({'x', 'y'}), 'b': (1000, 2.5)}\n",
        "rich/run.py": "#!/usr/bin/env python\nprint('run')\n",
        "rich/broken.py": "def broken(:\n",
        "rich/tests/test_deep.py": "from rich.sub.deep import VALUES\n",
        "rich/sub/test/__init__.py": "",
        "rich/testing/__init__.py": "def assert_rich(): pass\n",
        "rich/data.json": "{}\n",
        "rich-1.0.data/scripts/rich-tool": "#!python\nprint('tool')\n",
        "rich-1.0.data/headers/rich.h": "int rich;\n",
        "rich-1.0.dist-info/entry_points.txt": "[console_scripts]\nrich = rich:main\n",
    }, executable=("rich/run.py", "rich-1.0.data/scripts/rich-tool"))


# How trees were made before packs: installer writing files, then compile_dir over site-packages,
# test suites left out.
COMPILE_DIR = (
    "import compileall, py_compile, re, sys\n"
    "compileall.compile_dir(sys.argv[1], ddir=sys.argv[2], quiet=2, workers=1, rx=re.compile('/tests?/'),\n"
    "                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
)


def _installed_into_a_directory(wheel: Path, root: Path, interpreter: str) -> list:
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    from servestack.image import layers

    site = root / trees.site_packages("3.11")
    scheme = {"purelib": str(site), "platlib": str(site), "headers": str(root / "opt/venv/include/site/python3.11"),
              "scripts": str(root / "opt/venv/bin"), "data": str(root / "opt/venv")}
    destination = SchemeDictionaryDestination(scheme, interpreter="/opt/venv/bin/python", script_kind="posix",
                                              bytecode_optimization_levels=())
    with WheelFile.open(wheel) as source:
        install(source, destination, additional_metadata={"INSTALLER": b"servestack\n"})
    subprocess.run([interpreter, "-S", "-c", COMPILE_DIR, str(site), "/" + trees.site_packages("3.11")], check=True,
                   capture_output=True, env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
                                             "PYTHONHASHSEED": "0", "PYTHONPATH": ""})
    return layers.scan_tree(root)


def test_a_tree_holds_what_installing_into_a_directory_and_compile_dir_made(tmp_path, cache):
    """The same paths, modes and bytes, so the same layer: a tree is a pack and an entry list now, where
    it was a directory of files that installer wrote and compile_dir compiled."""
    from servestack.image import layers

    interpreter = trees.compiler("3.11", None)
    if interpreter.executable is None:
        pytest.skip("no python3.11 on this host")
    wheel, sha256 = _rich_wheel(tmp_path)
    with BytecodePool(interpreter.executable, 2) as pool:
        tree = installed_tree(wheel, sha256, "3.11", interpreter.version, pool)
    expected = _installed_into_a_directory(wheel, tmp_path / "dir", interpreter.executable)
    assert [e.identity() for e in tree.entries] == [e.identity() for e in expected]
    made = {e.path: e for e in tree.entries}
    assert made["opt/venv/bin/rich"].mode == made["opt/venv/bin/rich-tool"].mode == 0o755
    assert made["opt/venv/lib/python3.11/site-packages/rich/run.py"].mode == 0o755
    assert made["opt/venv/lib/python3.11/site-packages/rich/__pycache__/run.cpython-311.pyc"].mode == 0o644
    assert not any("broken.cpython" in path for path in made)
    site = "opt/venv/lib/python3.11/site-packages/rich"
    assert f"{site}/tests/test_deep.py" in made and not any(p.startswith(f"{site}/tests/__pycache__") for p in made)
    assert not any(p.startswith(f"{site}/sub/test/__pycache__") for p in made)
    assert f"{site}/testing/__pycache__/__init__.cpython-311.pyc" in made  # public API (torch.testing), compiled
    assert sorted(p.name for p in tree.path.iterdir()) == ["entries.json", "files.pack", "timing.json"]
    epoch = 1_700_000_000
    assert layers.write_layer(list(tree.entries), epoch, key="from-pack").digest == \
        layers.write_layer(expected, epoch, key="from-directory").digest


def test_a_wheel_with_a_file_where_a_pyc_goes_fails_naming_both(tmp_path, cache):
    """compile_dir could not write that pyc (a file where its __pycache__ directory goes); a pack would
    hold both, and the layer a file and a directory at one path."""
    wheel, sha256 = _wheel_with(tmp_path, "clash", {"clash/__init__.py": "VALUE = 1\n",
                                                    "clash/__pycache__": "a file where the directory goes\n"})
    interpreter = trees.compiler("3.11", None)
    if interpreter.executable is None:
        pytest.skip("no python3.11 on this host")
    with BytecodePool(interpreter.executable, 1) as pool, pytest.raises(
            ServestackError, match=r"the pyc of .*clash/__init__\.py cannot be at .*: the wheel installs a file at "
                                   r"opt/venv/lib/python3\.11/site-packages/clash/__pycache__$"):
        installed_tree(wheel, sha256, "3.11", interpreter.version, pool)
    assert list((cache / "installed").iterdir()) == []


@pytest.mark.parametrize("files, error", [
    ({"odd/x.py": "A = 1\n", "odd-1.0.data/purelib/odd/x.py": "A = 2\n"},
     r"odd-1.0-py3-none-any.whl: a file cannot be at .*/odd/x\.py: the wheel installs a file at .*/odd/x\.py$"),
    ({"odd/data": "a file\n", "odd-1.0.data/purelib/odd/data/x.txt": "below it\n"},
     r"a file cannot be at .*/odd/data(/x\.txt)?: the wheel installs (a file at|files below) .*/odd/data$"),  # either order
])
def test_a_wheel_installing_two_things_at_one_path_fails_naming_it_and_leaves_nothing(tmp_path, cache, files, error):
    """Installing into a directory failed on these (a file twice, a file where a directory goes); a pack
    would hold both, and a layer two entries at one path."""
    wheel, sha256 = _wheel_with(tmp_path, "odd", files)
    with pytest.raises(ServestackError, match=error):
        installed_tree(wheel, sha256, "3.11", "none", None)
    assert list((cache / "installed").iterdir()) == []


def _version(executable: str) -> str:
    """Asked the way a user would (`--version`), not the way trees asks."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def _patch_releases() -> dict[str, str]:
    """Real python3.11 binaries of different patch releases on this host, by version: the one running the
    tests (pyenv's on CI) and Debian's. Needs two to tell a choice from an accident of PATH order."""
    found = {".".join(map(str, sys.version_info[:3])): os.path.realpath(sys.executable)}
    for candidate in ("/usr/bin/python3.11", *(os.path.join(d, "python3.11") for d in os.get_exec_path())):
        if os.access(candidate, os.X_OK):
            found.setdefault(_version(candidate), os.path.realpath(candidate))
    return {v: p for v, p in found.items() if v.startswith("3.11.")}


def _bin(root: Path, name: str, target: str | None = None, script: str | None = None) -> Path:
    """A PATH directory holding python3.11: a symlink to `target`, or an executable `script`."""
    directory = root / name
    directory.mkdir()
    if target is not None:
        (directory / "python3.11").symlink_to(target)
    else:
        (directory / "python3.11").write_text(script or "")
        (directory / "python3.11").chmod(0o755)
    return directory


def _path(*directories: Path) -> str:
    return os.pathsep.join(str(d) for d in directories)


@pytest.fixture
def releases() -> dict[str, str]:
    found = _patch_releases()
    if len(found) < 2:
        pytest.skip(f"needs two python3.11 patch releases on this host (pyenv's and Debian's); found {found}")
    return found


def _fake(root: Path, name: str, version: str) -> tuple[Path, str]:
    """A PATH directory whose python3.11 answers the probe as an interpreter of `version` would: its binary's
    path, then its version. Runs everywhere, where a host has one python3.11 (a fresh Debian 12, CI) too."""
    binary = str(root / name / "python3.11")
    return _bin(root, name, script=f"#!/bin/sh\nprintf '%s\\n%s\\n' '{binary}' '{version}'\n"), binary


def test_the_image_version_compiles_wherever_it_is_on_path(tmp_path, monkeypatch, capsys):
    (first, first_binary), (second, second_binary) = _fake(tmp_path, "a", "3.11.2"), _fake(tmp_path, "b", "3.11.7")
    monkeypatch.setenv("PATH", _path(first, second))
    assert trees.compiler("3.11", "3.11.2") == trees.Compiler(executable=first_binary, version="3.11.2")
    assert trees.compiler("3.11", "3.11.7") == trees.Compiler(executable=second_binary, version="3.11.7")  # second on PATH
    assert capsys.readouterr().err == ""


def test_without_the_image_version_the_first_on_path_compiles_and_says_so(tmp_path, monkeypatch, capsys):
    (first, first_binary), (second, second_binary) = _fake(tmp_path, "a", "3.11.7"), _fake(tmp_path, "b", "3.11.2")
    monkeypatch.setenv("PATH", _path(first, second))
    chosen = trees.compiler("3.11", "3.11.99")
    assert chosen == trees.Compiler(executable=first_binary, version="3.11.7")
    [message] = capsys.readouterr().err.splitlines()
    assert message.startswith("servestack.image.trees: bytecode: ") and "Python 3.11.99" in message
    assert f"compiling with {first_binary} (3.11.7)" in message
    assert f"{second_binary} (3.11.2)" in message and "image digest" in message


def test_without_a_known_image_version_the_warning_says_only_that(tmp_path, monkeypatch, capsys):
    first, first_binary = _fake(tmp_path, "a", "3.11.7")
    monkeypatch.setenv("PATH", _path(first))
    assert trees.compiler("3.11", None) == trees.Compiler(executable=first_binary, version="3.11.7")
    [warning] = capsys.readouterr().err.splitlines()
    assert warning.startswith("servestack.image.trees: bytecode: the exact version of the image's Python 3.11 is not known "
                                           f"(none was given) (found: {first_binary} (3.11.7))")


def test_the_real_patch_releases_answer_the_probe_with_their_own_version(tmp_path, monkeypatch, releases):
    # The fakes above stand for these: where a host has two, the probe tells them apart through links.
    (_, first_binary), (second, second_binary) = sorted(releases.items())[:2]
    monkeypatch.setenv("PATH", _path(_bin(tmp_path, "a", first_binary), _bin(tmp_path, "b", second_binary)))
    assert trees.compiler("3.11", second) == trees.Compiler(executable=second_binary, version=second)
    assert _version(trees.compiler("3.11", second).executable) == second


def test_each_staging_name_is_its_own_though_the_pid_repeats(tmp_path, monkeypatch):
    # Containers sharing a cache have PID namespaces of their own: two builds there can both be pid 7.
    monkeypatch.setattr(os, "getpid", lambda: 7)
    tree = tmp_path / "installed" / f"{'a' * 64}-py3.11.2-pyc{trees.BYTECODE}"
    names = {trees.staging_path(tree).name for _ in range(20)}
    assert len(names) == 20 and all(n.startswith(f"{tree.name}.tmp7-") for n in names)


def test_a_shim_and_links_count_once_as_the_binary_they_run(tmp_path):
    real = os.path.realpath(sys.executable)
    version = ".".join(map(str, sys.version_info[:3]))
    shim = _bin(tmp_path, "shims", script=f'#!/bin/sh\nexec "{real}" "$@"\n')  # as pyenv's shims do
    # pyenv's shim when the selected version has no python3.11: a real executable that does not run it.
    missing = _bin(tmp_path, "other-shims", script='#!/bin/sh\necho "pyenv: python3.11: command not found" >&2\nexit 127\n')
    linked = _bin(tmp_path, "venv-bin", real)
    (tmp_path / "bin").symlink_to(linked, target_is_directory=True)  # /bin -> /usr/bin
    path = _path(missing, shim, tmp_path / "empty", linked, tmp_path / "bin")
    assert trees.interpreters("3.11", path) == [trees.Compiler(executable=real, version=version)]


def test_no_python_of_that_version_on_path_means_no_bytecode(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path(_bin(tmp_path, "a", os.path.realpath(sys.executable))))
    assert trees.compiler("3.99", "3.99.0") == trees.Compiler(executable=None, version="none")


def _debian(*debs: tuple[str, str]) -> DebianBase:
    locked = tuple(LockedDeb(name=name, version=version, architecture="amd64", size=1, sha256="0" * 64,
                             filename=f"pool/main/p/{name}.deb") for name, version in debs)
    return DebianBase(suite="bookworm", packages=("python3",), release_date=0, release_sha256="0" * 64, index="debian",
                      resolved={"linux/amd64": locked})


def test_the_image_interpreter_version_is_the_locked_interpreter_package():
    base = _debian(("libpython3.11-minimal", "3.11.2-6+deb12u8"), ("python3.11-minimal", "3.11.2-6+deb12u8"))
    assert tarball.interpreter_version(base, "linux/amd64", "3.11") == "3.11.2"
    with pytest.raises(ServestackError, match=r"no python3.13-minimal for linux/amd64"):
        tarball.interpreter_version(base, "linux/amd64", "3.13")
    with pytest.raises(ServestackError, match=r"has Version '1:3.11'; expected X.Y.Z-<revision>"):
        tarball.interpreter_version(_debian(("python3.11-minimal", "1:3.11")), "linux/amd64", "3.11")
