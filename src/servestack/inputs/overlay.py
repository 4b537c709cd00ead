"""Overlays: apply upstream pull requests' diffs onto a pinned wheel's files, or take one out.

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

Taking a PR out (`reverse`) applies its diff backwards onto a wheel that contains it: the variant of a
stack without that PR. Later code may have copied the lines a hunk brought; where a hunk's text occurs
more than once in its file, git would pick the copy nearest the old line number, so the reversal is
refused instead, naming the file and the hunk.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servestack import wheels
from servestack.errors import InputError, OverlayError, PatchDoesNotApply
from servestack.sources.diffs import HUNK_HEADER, FileDiff, diff_native_files, map_path, parse_diff
from servestack.util.fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from servestack.util.proc import run

# ---------------------------------------------------------------- overlays


def overlay_name(repo: str, number: int | None, patch: Path | str, reverse: bool = False) -> str:
    """`owner/repo#N` for a PR (`without owner/repo#N` taken out); `local:<file>` for a local patch."""
    name = f"{repo}#{number}" if number is not None else f"local:{Path(patch).name}"
    return f"without {name}" if reverse else name


@dataclass(frozen=True, kw_only=True)
class Overlay:
    repo: str  # "vllm-project/vllm"; for a local patch, the package it patches
    number: int | None  # the PR; None for a local patch (stack `packages[].patches`)
    patch: Path  # the diff (pins/patches/...)
    sha256: str  # expected sha256 of the patch file (from the lock)
    reverse: bool = False  # take the PR out of a wheel that contains it

    @property
    def name(self) -> str:
        return overlay_name(self.repo, self.number, self.patch, self.reverse)

    def identity(self) -> dict[str, object]:
        """What names this overlay in the set's digest and the wheel's provenance (`reverse` only when set,
        so that every forward overlay keeps the label it always had)."""
        entry: dict[str, object] = {"repo": self.repo.lower(), "number": self.number, "sha256": self.sha256.lower()}
        return {**entry, "reverse": True} if self.reverse else entry


@dataclass(frozen=True, kw_only=True)
class AppliedPR:
    repo: str
    number: int | None
    patch_sha256: str
    added: tuple[str, ...]  # wheel paths
    modified: tuple[str, ...]
    deleted: tuple[str, ...]
    skipped: tuple[str, ...]  # repository paths not in the wheel
    name: str = ""
    reverse: bool = False

    @property
    def changed(self) -> tuple[str, ...]:
        return tuple(sorted({*self.added, *self.modified, *self.deleted}))


@dataclass(frozen=True, kw_only=True)
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
                    **({"reverse": True} if p.reverse else {}),
                }
                for p in self.prs
            ],
            "files": dict(sorted(self.files.items())),
        }


def overlay_set_digest(overlays: Sequence[Overlay]) -> str:
    """Digest of the overlay set in application order (order matters: later PRs see earlier ones)."""
    return sha256_bytes(canonical_json([o.identity() for o in overlays]).encode())


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
                hm = HUNK_HEADER.match(h[0])
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
    added: list[str] = []
    modified: list[str] = []
    deleted: list[str] = []
    skipped: list[str] = []
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
        # Past the checks above, a side the diff has is a path in the wheel.
        if f.added and new is not None:
            added.append(new)
        elif f.deleted and old is not None:
            deleted.append(old)
        elif old is not None and new is not None:
            if old != new:
                deleted.append(old)
                added.append(new)
            else:
                modified.append(new)
    if parts:
        patch = root.parent / "pr.diff"
        patch.write_text("".join(parts), encoding="utf-8", errors="surrogateescape")
        if o.reverse:
            _refuse_ambiguous(o, sections, to_repo, root)
        direction = ["--reverse"] if o.reverse else []
        proc = run(
            ["git", "apply", "--verbose", "--whitespace=nowarn", *direction, "-p1", patch],
            cwd=root,
            env=_git_env(root),
            check=False,
        )
        if proc.returncode != 0:
            other = run(
                ["git", "apply", "--check", *([] if o.reverse else ["--reverse"]), "-p1", patch],
                cwd=root,
                env=_git_env(root),
                check=False,
            )
            if other.returncode == 0 and o.reverse:
                raise OverlayError(
                    f"{o.name}: the wheel does not contain this PR (its diff applies forward); "
                    "there is nothing to take out"
                )
            if other.returncode == 0:
                raise OverlayError(
                    f"{o.name}: the wheel already contains this PR (its diff applies in reverse); "
                    "drop the overlay, the pinned release includes it"
                )
            raise _explain_failure(o, proc.stdout or "", sections, to_repo)
        if o.reverse:
            added, deleted = deleted, added
    return AppliedPR(
        name=o.name,
        repo=o.repo,
        number=o.number,
        patch_sha256=o.sha256.lower(),
        added=tuple(sorted(added)),
        modified=tuple(sorted(modified)),
        deleted=tuple(sorted(deleted)),
        skipped=tuple(sorted(skipped)),
        reverse=o.reverse,
    )


def _hunk_side(hunk: list[str], keep: str) -> list[str]:
    """The lines a hunk leaves (`keep` "+") or expects (`keep` "-"), without their markers."""
    return [line[1:] for line in hunk[1:] if line[:1] in (" ", keep)]


def _refuse_ambiguous(o: Overlay, sections: dict[str, FileDiff], to_repo: dict[str, str], root: Path) -> None:
    """Taking a PR out: each hunk's text as the PR left it must occur once in its file of the wheel."""
    for wheel_path, f in sections.items():
        target = root / wheel_path
        if f.deleted or f.added or not target.is_file():
            continue
        lines = target.read_text(encoding="utf-8", errors="surrogateescape").splitlines(keepends=True)
        for hunk in f.hunks:
            after = _hunk_side(hunk, "+")
            if not after:
                continue
            found = [i for i in range(len(lines) - len(after) + 1) if lines[i:i + len(after)] == after]
            if len(found) > 1:
                header = hunk[0].rstrip("\n")
                raise PatchDoesNotApply(
                    o.name, to_repo.get(wheel_path, wheel_path), header[: header.index("@@", 2) + 2],
                    f"the lines this hunk brought occur {len(found)} times in the wheel's file (lines "
                    f"{', '.join(str(i + 1) for i in found)}); later code copied them, so which to take out is ambiguous",
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
        base_sha256 = sha256_file(wheel)
        provenance = {
            "base": {"filename": wheel.name, "sha256": base_sha256},
            "overlays": [{**o.identity(), "repo": o.repo} for o in patches],
        }
        (root / dist_info / "servestack-overlays.json").write_text(canonical_json(provenance))
        out = wheels.pack_wheel(root, out_dir, epoch=epoch, tag=info.tag, build=info.build)

    return OverlayResult(
        wheel=out,
        filename=out.name,
        sha256=sha256_file(out),
        version=new_version,
        base_wheel=wheel.name,
        base_sha256=base_sha256,
        label=label,
        prs=tuple(applied),
        files=files,
    )


def write_record(result: OverlayResult, path: Path) -> None:
    atomic_write_json(path, result.to_json())


__all__ = [
    "AppliedPR", "Overlay", "OverlayResult",
    "apply_overlays", "overlay_set_digest", "verify_patches", "write_record",
]
