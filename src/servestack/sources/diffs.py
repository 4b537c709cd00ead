"""Unified diffs as data: which files a pull request touches, whether any is native code or the
build, and where a repository path lives inside a wheel. Pure functions: nothing here reads a
repository or runs a command."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(kw_only=True)
class FileDiff:
    """One file's section of a unified git diff."""

    old_path: str | None  # None for an added file
    new_path: str | None  # None for a deleted file
    header: list[str] = field(default_factory=list)  # lines from `diff --git` to before the first hunk
    hunks: list[list[str]] = field(default_factory=list)  # each starts with its `@@` line

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> list[str]:
        return [p for p in dict.fromkeys((self.old_path, self.new_path)) if p]

    @property
    def added(self) -> bool:
        return self.old_path is None

    @property
    def deleted(self) -> bool:
        return self.new_path is None

    def text(self) -> str:
        return "".join(self.header) + "".join("".join(h) for h in self.hunks)


def _unquote(path: str) -> str:
    if len(path) >= 2 and path[0] == path[-1] == '"':
        raw = path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        return raw.encode("latin-1").decode("utf-8", "replace")
    return path


def _strip_prefix(path: str) -> str | None:
    path = _unquote(path.split("\t", 1)[0].rstrip("\n"))
    if path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse_diff(diff_text: str) -> list[FileDiff]:
    """Split a unified diff (git or plain) into per-file sections."""
    files: list[FileDiff] = []
    cur: FileDiff | None = None
    lines = diff_text.splitlines(keepends=True)
    old_left = new_left = 0  # lines still to come in the current hunk, by its header's counts
    i = 0
    while i < len(lines):
        line = lines[i]
        if cur is not None and cur.hunks and (old_left > 0 or new_left > 0):
            tag = line[:1]
            if tag in (" ", "\n", "\r"):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            cur.hunks[-1].append(line)
            i += 1
            continue
        if line.startswith("diff --git "):
            m = re.match(r'^diff --git (?:"?a/)(.+?)"? (?:"?b/)(.+?)"?$', line.rstrip("\n"))
            a, b = (m[1], m[2]) if m else (None, None)
            cur = FileDiff(old_path=a, new_path=b, header=[line])
            files.append(cur)
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ") and (
            cur is None or cur.hunks or not cur.header[0].startswith("diff --git ")
        ):
            # plain `diff -u` section without a git header
            cur = FileDiff(old_path=_strip_prefix(line[4:]), new_path=_strip_prefix(lines[i + 1][4:]), header=[line, lines[i + 1]])
            files.append(cur)
            i += 2
            continue
        elif cur is None:
            pass  # preamble (commit message of a format-patch, ...)
        elif line.startswith("@@"):
            cur.hunks.append([line])
            m = HUNK_HEADER.match(line)
            if m:
                old_left = int(m[2]) if m[2] is not None else 1
                new_left = int(m[4]) if m[4] is not None else 1
        elif cur.hunks and line.startswith("\\"):
            cur.hunks[-1].append(line)  # "\ No newline at end of file" after the hunk's last line
        elif cur.hunks:
            cur = None  # trailer (`-- ` signature of format-patch, ...)
        else:
            cur.header.append(line)
            if line.startswith("--- "):
                cur.old_path = _strip_prefix(line[4:])
            elif line.startswith("+++ "):
                cur.new_path = _strip_prefix(line[4:])
            elif line.startswith("new file mode"):
                cur.old_path = None
            elif line.startswith("deleted file mode"):
                cur.new_path = None
            elif line.startswith("rename from ") or line.startswith("copy from "):
                cur.old_path = _unquote(line.split(" ", 2)[2].rstrip("\n"))
            elif line.startswith("rename to ") or line.startswith("copy to "):
                cur.new_path = _unquote(line.split(" ", 2)[2].rstrip("\n"))
        i += 1
    return files


def touched_files(diff_text: str) -> list[str]:
    """Every repository path a diff touches (both sides of a rename), in order, without repeats."""
    out: dict[str, None] = {}
    for f in parse_diff(diff_text):
        for p in f.paths:
            out[p] = None
    return list(out)


NATIVE_SUFFIXES = (
    ".c", ".cc", ".cpp", ".cxx", ".c++", ".h", ".hh", ".hpp", ".hxx", ".inl", ".cu", ".cuh",
    ".pyx", ".pxd", ".cmake", ".cl", ".metal", ".s", ".asm", ".f90", ".rs", ".so",
)
NATIVE_DIRS = ("csrc", "cmake", "include", "3rdparty", "third_party")
BUILD_FILES = (
    "setup.py", "setup.cfg", "CMakeLists.txt", "MANIFEST.in", "build.sh", "Makefile",
    "pyproject.toml", "requirements-build.txt", "requirements/build.txt", "build_backend.py",
    "use_existing_torch.py", "meson.build", "Cargo.toml",
)


def is_native(path: str) -> bool:
    """Whether a change to `path` needs a compiler or the build backend to take effect."""
    p = PurePosixPath(path)
    if p.suffix.lower() in NATIVE_SUFFIXES:
        return True
    if p.parts and p.parts[0] in NATIVE_DIRS:
        return True
    if path in BUILD_FILES or p.name in ("CMakeLists.txt", "setup.py", "meson.build", "build.rs"):
        return True
    return False


def native_files(files: Iterable[str]) -> list[str]:
    return [f for f in files if is_native(f)]


def is_python_only(files: Iterable[str]) -> bool:
    """True when no file needs a native/source build (tests, docs and the like count as Python-only).

    From paths alone, so conservative: any pyproject.toml change counts as a build change. With
    the diff at hand, `diff_native_files` looks inside pyproject.toml hunks."""
    return not native_files(files)


# pyproject.toml tables whose changes cannot affect the built wheel (linters, test runners).
PYPROJECT_INERT_TABLES = (
    "tool.ruff", "tool.mypy", "tool.pytest", "tool.isort", "tool.yapf", "tool.yapfignore", "tool.black",
    "tool.codespell", "tool.coverage", "tool.typos", "tool.pyright", "tool.pylint", "tool.pymarkdown",
)
_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?")


def _pyproject_build_change(f: FileDiff) -> bool:
    """Whether a pyproject.toml diff changes anything outside linter/test-runner tables.
    A changed line whose table is not visible in its hunk counts as a build change."""
    if f.added or f.deleted or not f.hunks:
        return True
    for hunk in f.hunks:
        table: str | None = None
        for line in hunk[1:]:
            m = _TOML_TABLE.match(line[1:])
            if m:
                table = m[1]
            if line[:1] in "+-" and line[1:].strip() and not line[1:].lstrip().startswith("#"):
                t = table.strip('"') if table else None
                if t is None or not any(t == p or t.startswith(p + ".") for p in PYPROJECT_INERT_TABLES):
                    return True
    return False


def diff_native_files(diff_text: str | list[FileDiff]) -> list[str]:
    """The native/build files a diff touches; pyproject.toml only if a hunk changes build-relevant tables."""
    files = parse_diff(diff_text) if isinstance(diff_text, str) else diff_text
    out: dict[str, None] = {}
    for f in files:
        for p in f.paths:
            if PurePosixPath(p).name == "pyproject.toml" and p.count("/") == 0:
                if _pyproject_build_change(f):
                    out[p] = None
            elif is_native(p):
                out[p] = None
    return list(out)


# ---------------------------------------------------------------- repository paths -> wheel paths

# repo (owner/name, lowercase) -> [(prefix in the repo, prefix in the wheel)]. Repos not listed
# map a path to itself when its first component is a top-level entry of the wheel, and
# `src/<pkg>/...` / `python/<pkg>/...` to `<pkg>/...`.
REPO_LAYOUTS: dict[str, list[tuple[str, str]]] = {
    "vllm-project/vllm": [("vllm/", "vllm/")],
    "flashinfer-ai/flashinfer": [("flashinfer/", "flashinfer/")],
    "sgl-project/sglang": [("python/sglang/", "sglang/")],
}


def map_path(repo: str, path: str, wheel_tops: set[str]) -> str | None:
    """The wheel path a repository path lands at, or None when it is not part of the wheel."""
    layout = REPO_LAYOUTS.get(repo.lower())
    if layout is not None:
        for src, dst in layout:
            if path.startswith(src):
                return dst + path[len(src):]
        return None
    parts = PurePosixPath(path).parts
    if not parts:
        return None
    if parts[0] in wheel_tops:
        return path
    if len(parts) > 2 and parts[0] in ("src", "python") and parts[1] in wheel_tops:
        return "/".join(parts[1:])
    return None


__all__ = ["FileDiff", "diff_native_files", "is_native", "is_python_only", "map_path", "native_files", "parse_diff",
           "touched_files"]
