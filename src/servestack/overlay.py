"""Overlays: apply upstream pull requests' diffs onto a pinned wheel's files.

The wheel's recorded commit is each PR's base; the PR's diff (pins/patches/, sha256 in the lock)
is applied with `git apply` onto the wheel's unpacked files, and the wheel is re-packed
deterministically with a PEP 440 local label naming the overlay set (`+ss.<8 hex>`).

Only Python-only PRs can be overlaid: a PR touching native code or the build (csrc/, *.cu,
CMakeLists.txt, setup.py, the pyproject build backend, ...) needs a full source build.
Files of a PR that are not in the wheel (tests/, docs/, benchmarks/, .github/, ...) are
skipped and recorded as such.

`git apply` is used without `--recount` (GitHub's diffs have exact counts, and a hunk whose
counts are wrong is a corrupt patch we want to hear about), without fuzz (every context line
must match; only the hunk's position may move), and atomically per PR.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from . import wheels
from .errors import InputError, ServestackError
from .fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from .proc import run

# ---------------------------------------------------------------- diff parsing (pure)

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
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
            cur = FileDiff(a, b, [line])
            files.append(cur)
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ") and (
            cur is None or cur.hunks or not cur.header[0].startswith("diff --git ")
        ):
            # plain `diff -u` section without a git header
            cur = FileDiff(_strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:]), [line, lines[i + 1]])
            files.append(cur)
            i += 2
            continue
        elif cur is None:
            pass  # preamble (commit message of a format-patch, ...)
        elif line.startswith("@@"):
            cur.hunks.append([line])
            m = _HUNK.match(line)
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


# ---------------------------------------------------------------- overlays


class OverlayError(ServestackError):
    """A PR that cannot be overlaid onto a wheel."""


class PatchDoesNotApply(OverlayError):
    def __init__(self, pr: str, file: str, hunk: str | None, detail: str):
        self.pr, self.file, self.hunk, self.detail = pr, file, hunk, detail
        where = f"{file}, hunk `{hunk}`" if hunk else file
        super().__init__(
            f"{pr}: patch does not apply to the wheel at {where}: {detail.strip()}\n"
            "The wheel's files differ from the PR's base there; rebase the PR's diff onto the "
            "wheel's commit or drop the overlay."
        )


def overlay_name(repo: str, number: int | None, patch: Path | str) -> str:
    """`owner/repo#N` for a PR; `local:<file>` for a local patch (its diff is in the wheel's paths)."""
    return f"{repo}#{number}" if number is not None else f"local:{Path(patch).name}"


@dataclass(frozen=True)
class Overlay:
    repo: str  # "vllm-project/vllm"; for a local patch, the package it patches
    number: int | None  # the PR; None for a local patch (stack `packages[].patches`)
    patch: Path  # the diff (pins/patches/...)
    sha256: str  # expected sha256 of the patch file (from the lock)

    @property
    def name(self) -> str:
        return overlay_name(self.repo, self.number, self.patch)


@dataclass(frozen=True)
class AppliedPR:
    repo: str
    number: int | None
    patch_sha256: str
    added: tuple[str, ...]  # wheel paths
    modified: tuple[str, ...]
    deleted: tuple[str, ...]
    skipped: tuple[str, ...]  # repository paths not in the wheel
    name: str = ""

    @property
    def changed(self) -> tuple[str, ...]:
        return tuple(sorted({*self.added, *self.modified, *self.deleted}))


@dataclass(frozen=True)
class OverlayResult:
    wheel: Path
    filename: str
    sha256: str
    version: str
    base_wheel: str  # filename of the input wheel
    base_sha256: str
    label: str  # "ss.<8 hex>"
    prs: tuple[AppliedPR, ...]
    files: dict[str, str | None]  # every overlaid wheel path -> final sha256 (None: deleted)

    def to_json(self) -> dict:
        return {
            "wheel": {"filename": self.filename, "sha256": self.sha256, "version": self.version},
            "base": {"filename": self.base_wheel, "sha256": self.base_sha256},
            "label": self.label,
            "prs": [
                {
                    "name": p.name,
                    "repo": p.repo,
                    "number": p.number,
                    "patch_sha256": p.patch_sha256,
                    "added": list(p.added),
                    "modified": list(p.modified),
                    "deleted": list(p.deleted),
                    "skipped": list(p.skipped),
                }
                for p in self.prs
            ],
            "files": dict(sorted(self.files.items())),
        }


def overlay_set_digest(overlays: Sequence[Overlay]) -> str:
    """Digest of the overlay set in application order (order matters: later PRs see earlier ones)."""
    return sha256_bytes(
        canonical_json([{"repo": o.repo.lower(), "number": o.number, "sha256": o.sha256.lower()} for o in overlays]).encode()
    )


def verify_patches(overlays: Sequence[Overlay]) -> dict[Overlay, str]:
    """Each patch's text, after checking its sha256 against the lock."""
    texts = {}
    for o in overlays:
        if not Path(o.patch).is_file():
            raise InputError(o.patch, o.name, "patch file not found")
        actual = sha256_file(o.patch)
        if actual != o.sha256.lower():
            raise InputError(
                o.patch, f"{o.name} sha256",
                f"patch file {o.patch} has sha256 {actual} but the lock expects {o.sha256}; "
                "the file changed since it was locked (re-lock, or restore the file)",
            )
        texts[o] = Path(o.patch).read_bytes().decode("utf-8", "surrogateescape")
    return texts


def _refuse_native(o: Overlay, diff: list[FileDiff]) -> None:
    native = diff_native_files(diff)
    if native:
        raise InputError(
            o.patch, o.name,
            f"touches native/build files: {', '.join(native)}. Overlay mode only handles Python-only "
            "PRs; this PR needs a full source build (not yet supported).",
        )


def _rewrite(f: FileDiff, old: str | None, new: str | None) -> str:
    """The file's section with paths rewritten to wheel paths."""

    def q(prefix: str, p: str | None) -> str:
        return "/dev/null" if p is None else f"{prefix}{p}"

    out = []
    for line in f.header:
        if line.startswith("diff --git "):
            line = f"diff --git {q('a/', old or new)} {q('b/', new or old)}\n"
        elif line.startswith("--- "):
            line = f"--- {q('a/', old)}\n"
        elif line.startswith("+++ "):
            line = f"+++ {q('b/', new)}\n"
        elif line.startswith("rename from ") and old:
            line = f"rename from {old}\n"
        elif line.startswith("rename to ") and new:
            line = f"rename to {new}\n"
        out.append(line)
    return "".join(out) + "".join("".join(h) for h in f.hunks)


def _explain_failure(o: Overlay, output: str, sections: dict[str, FileDiff], to_repo: dict[str, str]) -> OverlayError:
    m = re.search(r"patch failed: (.+?):(\d+)\s*$", output, re.M)
    if m:
        wheel_path, line = m[1], int(m[2])
        f = sections.get(wheel_path)
        hunk = None
        if f is not None:
            for h in f.hunks:
                hm = _HUNK.match(h[0])
                if hm and int(hm[1]) == line:
                    hunk = h[0].rstrip("\n")
                    hunk = hunk[: hunk.index("@@", 2) + 2]
                    break
        return PatchDoesNotApply(o.name, to_repo.get(wheel_path, wheel_path), hunk, f"git apply: {m[0].strip()}")
    m = re.search(r"error: (?:patch failed: )?(\S+?): (.+)$", output, re.M)
    if m:
        return PatchDoesNotApply(o.name, to_repo.get(m[1], m[1]), None, m[2])
    return OverlayError(f"{o.name}: git apply failed:\n{output.strip()}")


def _git_env(root: Path) -> dict[str, str]:
    # Never let git find a repository above the scratch dir (paths would become relative to it),
    # nor read the user's configuration.
    return {"GIT_CEILING_DIRECTORIES": str(root.parent), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


def _apply_one(o: Overlay, diff: list[FileDiff], root: Path, wheel_tops: set[str]) -> AppliedPR:
    added, modified, deleted, skipped = [], [], [], []
    parts: list[str] = []
    sections: dict[str, FileDiff] = {}
    to_repo: dict[str, str] = {}
    for f in diff:
        old = map_path(o.repo, f.old_path, wheel_tops) if f.old_path else None
        new = map_path(o.repo, f.new_path, wheel_tops) if f.new_path else None
        in_old = f.old_path is None or old is not None
        in_new = f.new_path is None or new is not None
        if old is None and new is None:
            skipped.extend(f.paths)
            continue
        if not (in_old and in_new):
            raise OverlayError(
                f"{o.name}: {f.old_path} -> {f.new_path} moves a file between the wheel and paths "
                "outside it; overlay mode cannot follow that"
            )
        if any(line.startswith(("GIT binary patch", "Binary files ")) for line in f.header):
            raise OverlayError(f"{o.name}: {f.path}: binary change, overlay mode only applies text diffs")
        parts.append(_rewrite(f, old, new))
        for src, dst in ((f.old_path, old), (f.new_path, new)):
            if src and dst:
                sections[dst] = f
                to_repo[dst] = src
        if f.added:
            added.append(new)
        elif f.deleted:
            deleted.append(old)
        else:
            if old != new:
                deleted.append(old)
                added.append(new)
            else:
                modified.append(new)
    if parts:
        patch = root.parent / "pr.diff"
        patch.write_text("".join(parts), encoding="utf-8", errors="surrogateescape")
        proc = run(
            ["git", "apply", "--verbose", "--whitespace=nowarn", "-p1", patch],
            cwd=root,
            env=_git_env(root),
            check=False,
        )
        if proc.returncode != 0:
            reverse = run(
                ["git", "apply", "--check", "--reverse", "-p1", patch],
                cwd=root,
                env=_git_env(root),
                check=False,
            )
            if reverse.returncode == 0:
                raise OverlayError(
                    f"{o.name}: the wheel already contains this PR (its diff applies in reverse); "
                    "drop the overlay, the pinned release includes it"
                )
            raise _explain_failure(o, proc.stdout or "", sections, to_repo)
    return AppliedPR(
        name=o.name,
        repo=o.repo,
        number=o.number,
        patch_sha256=o.sha256.lower(),
        added=tuple(sorted(added)),
        modified=tuple(sorted(modified)),
        deleted=tuple(sorted(deleted)),
        skipped=tuple(sorted(skipped)),
    )


def apply_overlays(wheel: Path, patches: list[Overlay], out_dir: Path, epoch: int) -> OverlayResult:
    """Apply the PRs' diffs, in order, onto `wheel`; write the relabelled wheel into `out_dir`.

    Checks every patch's sha256 and refuses native PRs before touching anything. On any error
    nothing is left in `out_dir`.
    """
    wheel, out_dir = Path(wheel), Path(out_dir)
    if not patches:
        raise OverlayError(f"{wheel.name}: no overlays to apply")
    texts = verify_patches(patches)
    diffs = {}
    for o in patches:
        diffs[o] = parse_diff(texts[o])
        if not diffs[o]:
            raise InputError(o.patch, o.name, "patch contains no file changes")
        _refuse_native(o, diffs[o])

    digest = overlay_set_digest(patches)
    label = wheels.overlay_label(digest)
    with tempfile.TemporaryDirectory(prefix="servestack-overlay-") as scratch:
        root = Path(scratch) / "wheel"
        info = wheels.unpack_wheel(wheel, root)
        new_version = wheels.add_local_label(info.version, label)
        wheel_tops = {p.name for p in root.iterdir() if not p.name.endswith((".dist-info", ".data"))}
        wheel_tops |= {p.stem for p in root.glob("*.py")}
        applied = [_apply_one(o, diffs[o], root, wheel_tops) for o in patches]

        files: dict[str, str | None] = {}
        for pr in applied:
            for p in pr.changed:
                files[p] = None
        for p in files:
            target = root / p
            files[p] = sha256_file(target) if target.is_file() else None

        dist_info = wheels.relabel_tree(root, new_version)
        provenance = {
            "base": {"filename": wheel.name, "sha256": sha256_file(wheel)},
            "overlays": [{"repo": o.repo, "number": o.number, "sha256": o.sha256.lower()} for o in patches],
        }
        (root / dist_info / "servestack-overlays.json").write_text(canonical_json(provenance))
        out = wheels.pack_wheel(root, out_dir, epoch=epoch, tag=info.tag, build=info.build)

    return OverlayResult(
        wheel=out,
        filename=out.name,
        sha256=sha256_file(out),
        version=new_version,
        base_wheel=wheel.name,
        base_sha256=provenance["base"]["sha256"],
        label=label,
        prs=tuple(applied),
        files=files,
    )


def write_record(result: OverlayResult, path: Path) -> None:
    atomic_write_json(path, result.to_json())


__all__ = [
    "AppliedPR", "FileDiff", "Overlay", "OverlayError", "OverlayResult", "PatchDoesNotApply",
    "apply_overlays", "diff_native_files", "is_native", "is_python_only", "map_path", "native_files", "overlay_set_digest",
    "parse_diff", "touched_files", "verify_patches", "write_record",
]
