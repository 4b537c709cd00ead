from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fixtures.tinypkg import TinyPkg, build_tinypkg
from servestack.errors import InputError, OverlayError, PatchDoesNotApply
from servestack.inputs.overlay import Overlay, apply_overlays, overlay_set_digest
from servestack.sources.diffs import diff_native_files, is_python_only, map_path, parse_diff, touched_files
from servestack.util.fsutil import sha256_bytes, sha256_file
from servestack.wheels import read_wheel, verify_record


@pytest.fixture(scope="module")
def pkg(tmp_path_factory) -> TinyPkg:
    return build_tinypkg(tmp_path_factory.mktemp("tinypkg"))


def ov(pkg: TinyPkg, number: int, patch: Path | None = None) -> Overlay:
    path = patch or pkg.prs[number].patch_path
    return Overlay(repo=pkg.repo_name, number=number, patch=path, sha256=sha256_file(path))


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


# ------------------------------------------------------------------ fixture sanity


def test_fixture_history(pkg):
    assert [p.kind for p in pkg.prs.values()] == ["included", "overlay", "native", "conflict"]
    assert pkg.prs[1].merge == pkg.base  # released right after PR #1's merge
    assert pkg.prs[2].base == pkg.base
    out = subprocess.run(["git", "-C", pkg.repo, "rev-parse", pkg.tag], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == pkg.base
    parents = subprocess.run(["git", "-C", pkg.repo, "rev-list", "--parents", "-n1", pkg.prs[2].merge],
                             capture_output=True, text=True, check=True).stdout.split()
    assert parents[1:] == [pkg.base, pkg.prs[2].head]  # a real merge commit


def test_fixture_is_deterministic(pkg, tmp_path):
    again = build_tinypkg(tmp_path)
    assert again.base == pkg.base
    assert {n: (p.head, p.merge) for n, p in again.prs.items()} == {n: (p.head, p.merge) for n, p in pkg.prs.items()}
    assert again.wheel.read_bytes() == pkg.wheel.read_bytes()


# ------------------------------------------------------------------ classification (pure)


def test_touched_files_and_python_only(pkg):
    files2 = touched_files(pkg.patches[2])
    assert sorted(files2) == ["README.md", "tests/test_server.py", "tinyserve/extra.py", "tinyserve/legacy.py", "tinyserve/server.py"]
    assert is_python_only(files2)
    files3 = touched_files(pkg.patches[3])
    assert sorted(files3) == ["csrc/kernel.cu", "tinyserve/ops.py"]
    assert not is_python_only(files3)
    assert diff_native_files(pkg.patches[3]) == ["csrc/kernel.cu"]
    for native in ("csrc/x.py", "vllm/a.cuh", "CMakeLists.txt", "cmake/utils.cmake", "setup.py", "kernels/x.cpp", "pyproject.toml"):
        assert not is_python_only(["vllm/a.py", native]), native
    assert is_python_only(["vllm/a.py", "docs/x.md", ".github/workflows/ci.yml", "tests/test_a.py"])


def test_touched_files_renames_and_plain_diffs():
    rename = (
        "diff --git a/vllm/old.py b/vllm/new.py\nsimilarity index 90%\nrename from vllm/old.py\nrename to vllm/new.py\n"
        "index 1..2 100644\n--- a/vllm/old.py\n+++ b/vllm/new.py\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/bin/tool b/bin/tool\nold mode 100644\nnew mode 100755\n"
    )
    assert touched_files(rename) == ["vllm/old.py", "vllm/new.py", "bin/tool"]
    plain = "--- a/x.py\t2024-01-01\n+++ b/x.py\t2024-01-02\n@@ -1 +1 @@\n-a\n+b\n--- a/y.c\n+++ b/y.c\n@@ -1 +1 @@\n-a\n+b\n"
    assert touched_files(plain) == ["x.py", "y.c"]
    assert [f.hunks[0][0] for f in parse_diff(plain)] == ["@@ -1 +1 @@\n"] * 2


def test_hunk_lines_that_look_like_file_headers():
    # removing "-- a" and adding "++ b" inside a hunk must not start a new file section
    d = (
        "diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,2 +1,2 @@\n--- a\n+++ b\n x\n"
        "\\ No newline at end of file\n"
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    files = parse_diff(d)
    assert [f.path for f in files] == ["q.sql", "m.py"]
    assert files[0].hunks[0][1:] == ["--- a\n", "+++ b\n", " x\n", "\\ No newline at end of file\n"]
    assert touched_files(d) == ["q.sql", "m.py"]


def test_pyproject_lint_only_change_is_not_native():
    def diff(table: str) -> str:
        return (
            "diff --git a/pyproject.toml b/pyproject.toml\n--- a/pyproject.toml\n+++ b/pyproject.toml\n"
            f"@@ -10,3 +10,4 @@\n {table}\n select = [\"E\"]\n+ignore = [\"E501\"]\n \n"
        )

    assert diff_native_files(diff("[tool.ruff.lint]")) == []
    assert diff_native_files(diff("[build-system]")) == ["pyproject.toml"]
    assert diff_native_files(diff("[project]")) == ["pyproject.toml"]  # dependencies live in METADATA
    assert diff_native_files(diff("select = []")) == ["pyproject.toml"]  # table not visible: be safe


def test_map_path():
    assert map_path("vllm-project/vllm", "vllm/v1/engine/core.py", set()) == "vllm/v1/engine/core.py"
    assert map_path("vllm-project/vllm", "tests/v1/test_core.py", set()) is None
    assert map_path("flashinfer-ai/flashinfer", "flashinfer/decode.py", set()) == "flashinfer/decode.py"
    assert map_path("flashinfer-ai/flashinfer", "benchmarks/bench.py", set()) is None
    assert map_path("sgl-project/sglang", "python/sglang/srt/server.py", set()) == "sglang/srt/server.py"
    assert map_path("x/y", "src/pkg/a.py", {"pkg"}) == "pkg/a.py"
    assert map_path("x/y", "pkg/a.py", {"pkg"}) == "pkg/a.py"
    assert map_path("x/y", "docs/a.py", {"pkg"}) is None


# ------------------------------------------------------------------ applying


def test_overlay_installs_and_contains_the_change(pkg, tmp_path):
    result = apply_overlays(pkg.wheel, [ov(pkg, 2)], tmp_path / "out", pkg.epoch)
    label = "ss." + overlay_set_digest([ov(pkg, 2)])[:8]
    assert result.version == f"1.0.0+{label}" and result.label == label
    assert result.filename == f"tinyserve-1.0.0+{label}-py3-none-any.whl"
    assert result.wheel == tmp_path / "out" / result.filename
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [result.filename]
    assert result.sha256 == sha256_file(result.wheel)
    assert verify_record(result.wheel) == []
    info = read_wheel(result.wheel)
    assert info.version == result.version and info.dist_info == f"tinyserve-1.0.0+{label}.dist-info"

    (pr,) = result.prs
    assert (pr.repo, pr.number) == (pkg.repo_name, 2)
    assert pr.added == ("tinyserve/extra.py",)
    assert pr.modified == ("tinyserve/server.py",)
    assert pr.deleted == ("tinyserve/legacy.py",)
    assert pr.skipped == ("README.md", "tests/test_server.py")
    files = members(result.wheel)
    assert result.files == {
        "tinyserve/extra.py": sha256_bytes(files["tinyserve/extra.py"]),
        "tinyserve/server.py": sha256_bytes(files["tinyserve/server.py"]),
        "tinyserve/legacy.py": None,
    }
    assert "tinyserve/legacy.py" not in files
    assert result.to_json()["wheel"]["sha256"] == result.sha256

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", target, result.wheel], check=True)
    code = (
        "import tinyserve.server as s, tinyserve.extra as e, importlib.metadata as m, importlib.util as u;"
        "print(s.greeting('x'), e.extra_feature(), m.version('tinyserve'), u.find_spec('tinyserve.legacy'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(target)}, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["hello,", "x", "42", result.version, "None"]


def test_overlay_is_deterministic(pkg, tmp_path):
    a = apply_overlays(pkg.wheel, [ov(pkg, 2)], tmp_path / "a", pkg.epoch)
    b = apply_overlays(pkg.wheel, [ov(pkg, 2)], tmp_path / "b", pkg.epoch)
    assert a.wheel.read_bytes() == b.wheel.read_bytes()
    assert a.to_json() == b.to_json()


def test_stacked_overlays_and_order_in_label(pkg, tmp_path):
    both = apply_overlays(pkg.wheel, [ov(pkg, 2), ov(pkg, 4)], tmp_path / "out", pkg.epoch)
    assert 'return f"hello, {name}!"' in members(both.wheel)["tinyserve/server.py"].decode()
    assert [p.number for p in both.prs] == [2, 4]
    only2 = overlay_set_digest([ov(pkg, 2)])
    assert both.label != "ss." + only2[:8]
    assert overlay_set_digest([ov(pkg, 2), ov(pkg, 4)]) != overlay_set_digest([ov(pkg, 4), ov(pkg, 2)])


def test_tampered_patch_names_file_and_hashes(pkg, tmp_path):
    patch = tmp_path / "tinyserve-2.diff"
    patch.write_text(pkg.patches[2])
    good = sha256_file(patch)
    patch.write_text(pkg.patches[2].replace("hello, {name}", "HELLO, {name}"))
    with pytest.raises(InputError) as e:
        apply_overlays(pkg.wheel, [Overlay(repo=pkg.repo_name, number=2, patch=patch, sha256=good)], tmp_path / "out", pkg.epoch)
    msg = str(e.value)
    assert str(patch) in msg and good in msg and sha256_file(patch) in msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_patch_that_no_longer_applies_names_pr_file_and_hunk(pkg, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PatchDoesNotApply) as e:
        apply_overlays(pkg.wheel, [ov(pkg, 4)], out, pkg.epoch)
    hunk = re.search(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", pkg.patches[4], re.M)[0]
    msg = str(e.value)
    assert f"{pkg.repo_name}#4" in msg and "tinyserve/server.py" in msg and hunk in msg
    assert (e.value.pr, e.value.file, e.value.hunk) == (f"{pkg.repo_name}#4", "tinyserve/server.py", hunk)
    assert list(out.iterdir()) == []  # no partial output


def test_already_included_pr_is_explained(pkg, tmp_path):
    with pytest.raises(OverlayError, match="already contains"):
        apply_overlays(pkg.wheel, [ov(pkg, 1)], tmp_path / "out", pkg.epoch)


def test_native_pr_is_refused(pkg, tmp_path):
    with pytest.raises(InputError) as e:
        apply_overlays(pkg.wheel, [ov(pkg, 2), ov(pkg, 3)], tmp_path / "out", pkg.epoch)
    msg = str(e.value)
    assert "csrc/kernel.cu" in msg and "tinyserve/ops.py" not in msg
    assert "Python-only" in msg and "full source build" in msg and f"{pkg.repo_name}#3" in msg
    assert not (tmp_path / "out").exists()


def test_existing_local_label_is_extended(pkg, tmp_path):
    first = apply_overlays(pkg.wheel, [ov(pkg, 2)], tmp_path / "one", pkg.epoch)
    second = apply_overlays(first.wheel, [ov(pkg, 4)], tmp_path / "two", pkg.epoch)
    assert second.version == f"{first.version}.{second.label}"
    assert verify_record(second.wheel) == []


# ------------------------------------------------------------------ taking a PR out (a stack's variant without it)


def out_of(pkg: TinyPkg, number: int, patch: Path | None = None) -> Overlay:
    path = patch or pkg.prs[number].patch_path
    return Overlay(repo=pkg.repo_name, number=number, patch=path, sha256=sha256_file(path), reverse=True)


def test_a_pr_the_wheel_includes_is_taken_out_and_the_rest_is_unchanged(pkg, tmp_path):
    result = apply_overlays(pkg.wheel, [out_of(pkg, 1)], tmp_path / "out", pkg.epoch)
    before, after = members(pkg.wheel), members(result.wheel)
    util = after["tinyserve/util.py"].decode()
    assert "return min(value, high)" in util and "max(low," not in util  # the code from before PR #1
    assert [(p.name, p.reverse, p.modified) for p in result.prs] == [
        (f"without {pkg.repo_name}#1", True, ("tinyserve/util.py",))]
    changed = {n for n in before.keys() & after.keys() if before[n] != after[n] and ".dist-info/" not in n}
    assert changed == {"tinyserve/util.py"}
    assert verify_record(result.wheel) == []
    # Its own label: the same diff applied forward would be another wheel.
    assert result.label != "ss." + overlay_set_digest([ov(pkg, 1)])[:8]


def test_taking_out_a_pr_the_wheel_does_not_have_is_refused(pkg, tmp_path):
    with pytest.raises(OverlayError, match="does not contain this PR"):
        apply_overlays(pkg.wheel, [out_of(pkg, 2)], tmp_path / "out", pkg.epoch)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_reversal_that_later_code_made_ambiguous_names_the_file_and_hunk(pkg, tmp_path):
    # Later code copied the lines PR #1 brought: which copy to take out is not the diff's to say.
    wheel = tmp_path / "copied" / pkg.wheel.name
    wheel.parent.mkdir()
    with zipfile.ZipFile(pkg.wheel) as source, zipfile.ZipFile(wheel, "w") as copy:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "tinyserve/util.py":
                data += b"\n\n" + data
            copy.writestr(item, data)
    with pytest.raises(PatchDoesNotApply) as e:
        apply_overlays(wheel, [out_of(pkg, 1)], tmp_path / "out", pkg.epoch)
    hunk = re.search(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", pkg.patches[1], re.M)[0]
    assert (e.value.pr, e.value.file, e.value.hunk) == (f"without {pkg.repo_name}#1", "tinyserve/util.py", hunk)
    assert "ambiguous" in str(e.value)
