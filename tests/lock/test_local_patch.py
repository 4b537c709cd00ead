"""A local patch (`packages[].patches` in the stack, a diff in `pins/patches/` with its reason) is
locked by hash, applied by `build` after the package's PRs, and reported by the static probe
like an overlaid PR. The package is the tinyserve fixture with its real PRs.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from fixtures.tinystack import github, pr_items, tinyserve_stack
from servestack import inputs, lock
from servestack.errors import InputError
from servestack.lock import check as lockcheck
from servestack.probe.static import evidence as probe
from servestack.util.project import Project

PATCHES = """\
    patches:
      - file: tinyserve-launch-negative.diff
        reason: launch() of a negative count must launch nothing
"""

# In the wheel's own paths (a local patch is written against what is installed).
PATCH = """\
diff --git a/tinyserve/ops.py b/tinyserve/ops.py
--- a/tinyserve/ops.py
+++ b/tinyserve/ops.py
@@ -1,2 +1,2 @@
 def launch(n):
-    return ["kernel"] * n
+    return ["kernel"] * max(n, 0)
"""
PATCHED_OPS = 'def launch(n):\n    return ["kernel"] * max(n, 0)\n'


@pytest.fixture
def project(tmp_path, world, monkeypatch) -> Project:
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    (tmp_path / "pins" / "patches").mkdir(parents=True)
    (tmp_path / "pins" / "patches" / "tinyserve-launch-negative.diff").write_text(PATCH)
    (tmp_path / "pins" / "tinyimg.yaml").write_text(tinyserve_stack(world, "tinyimg", pr_items(world, [2]), package=PATCHES))
    return Project(root=tmp_path)


def test_the_lock_records_the_patch_by_hash_with_its_reason_and_check_names_an_edit(project, world):
    lock.lock(project, "tinyimg", github(world))
    (entry,) = lock.load_lock(project, "tinyimg").to_json()["local_patches"]
    assert entry == {
        "package": "tinyserve",
        "file": "pins/patches/tinyserve-launch-negative.diff",
        "sha256": hashlib.sha256(PATCH.encode()).hexdigest(),
        "reason": "launch() of a negative count must launch nothing",
        "python_only": True,
        "native_files": [],
    }
    assert lockcheck.check(project, "tinyimg").ok
    (project.patches / "tinyserve-launch-negative.diff").write_text(PATCH.replace("max(n, 0)", "max(n, 1)"))
    (problem,) = lockcheck.check(project, "tinyimg").problems
    assert "local_patches[pins/patches/tinyserve-launch-negative.diff]" in problem and "the lock says" in problem


def test_a_missing_patch_file_names_the_stack_field(project, world):
    (project.patches / "tinyserve-launch-negative.diff").unlink()
    with pytest.raises(InputError) as info:
        lock.lock(project, "tinyimg", github(world))
    assert info.value.field == "packages[0].patches[0].file"
    assert "pins/patches/tinyserve-launch-negative.diff does not exist" in str(info.value)


def test_build_applies_the_patch_after_the_prs_and_the_probe_reports_it(project, world, tmp_path):
    lock.lock(project, "tinyimg", github(world))
    record = json.loads(inputs.build(project, "tinyimg").read_text())
    (applied,) = record["overlays"]
    assert [p["name"] for p in applied["prs"]] == [f"{world['pkg'].repo_name}#2", "local:tinyserve-launch-negative.diff"]
    assert applied["files"]["tinyserve/ops.py"] == hashlib.sha256(PATCHED_OPS.encode()).hexdigest()

    document = lock.load_lock(project, "tinyimg").to_json()
    config = {"pull_requests": document["pull_requests"], "local_patches": document["local_patches"]}
    stack_json = {"overlays": {"tinyserve": {"version": applied["wheel"]["version"], "files": applied["files"]}}}
    checks = {c["name"]: c for c in probe.check_prs(config, stack_json, {"tinyserve": True})}
    patch_check = checks["patch:tinyserve:tinyserve-launch-negative.diff"]
    assert patch_check["status"] == "pass" and "local patch: launch() of a negative count" in patch_check["detail"]
    assert applied["wheel"]["version"] in patch_check["detail"]
    failed = {c["name"]: c for c in probe.check_prs(config, stack_json, {"tinyserve": False})}
    assert failed["patch:tinyserve:tinyserve-launch-negative.diff"]["status"] == "fail"
    assert probe.check_prs(config, {"overlays": {}}, {})[-1]["status"] == "fail"
