"""A stack's variant without one PR: `<stack>.without-<N>` is the stack's image with that PR's diff taken
out of the pinned wheel, built from the stack's own file and lock (issue 50).

The tinyserve fixture's wheel includes PR #1 (merged before its release); its stack names a check
for it, so the lock keeps its diff, from the history a GitHub stand-in serves over its REST protocol.
"""

from __future__ import annotations

import zipfile

import pytest

from fixtures.tinystack import PR1_EVIDENCE, entries, github, tinyserve_stack, unreachable
from servestack import inputs, lock
from servestack.errors import ServestackError
from servestack.lock import check as lockcheck
from servestack.records.steps import read_build
from servestack.util.project import Project, variant_name, variant_of


def stack_naming_a_check(tmp_path, world) -> Project:
    (tmp_path / "pins").mkdir()
    prs = (f"      - repo: {world['pkg'].repo_name}\n        number: 1\n        title: PR 1\n"
           f"        evidence:\n{PR1_EVIDENCE}        check: disaggregated-smoke\n")
    (tmp_path / "pins" / "tiny.yaml").write_text(tinyserve_stack(world, "tiny", prs))
    return Project(root=tmp_path)


def test_a_variant_name_is_its_stack_and_the_pr_taken_out():
    assert variant_name("dev-cpu", 41869) == "dev-cpu.without-41869"
    assert variant_of("dev-cpu.without-41869") == ("dev-cpu", 41869)
    assert variant_of("dev-cpu") == ("dev-cpu", None)
    assert variant_of("dev-cpu.without-x") == ("dev-cpu.without-x", None)  # no such stack, refused as one
    project = Project(root=__import__("pathlib").Path("/p"))
    assert project.lock_file("dev-cpu.without-1") == project.lock_file("dev-cpu")
    assert project.artifacts("dev-cpu.without-1") != project.artifacts("dev-cpu")


def test_an_included_pr_that_names_a_check_keeps_its_diff_in_the_lock(tmp_path, world):
    project = stack_naming_a_check(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    entry = entries(project)[1]
    assert entry["status"] == "included" and "diff_unavailable" not in entry
    assert (project.root / entry["patch"]["path"]).read_text() == world["pkg"].patches[1]
    assert lockcheck.check(project, "tiny").ok


def test_without_its_history_the_lock_says_why_there_is_no_variant(tmp_path, world):
    project = stack_naming_a_check(tmp_path, world)
    lock.lock(project, "tiny", unreachable())
    entry = entries(project)[1]
    assert entry["status"] == "included" and "patch" not in entry
    assert "unreachable" in entry["diff_unavailable"] and "variant" in entry["diff_unavailable"]
    with pytest.raises(ServestackError, match=r"holds no diff for example/tinyserve#1: .*unreachable"):
        inputs.build(project, "tiny.without-1")
    assert not project.artifacts("tiny.without-1").exists()


def test_the_variant_s_wheel_lacks_the_pr_and_nothing_else_changes(tmp_path, world):
    project = stack_naming_a_check(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    intact = read_build(inputs.build(project, "tiny"))
    variant = read_build(inputs.build(project, "tiny.without-1"))
    assert variant.stack == "tiny.without-1" and variant.lock_sha256 == intact.lock_sha256
    assert variant.input_hash != intact.input_hash
    (overlaid,) = variant.overlays
    assert [(p["name"], p.get("reverse")) for p in overlaid.prs] == [(f"without {world['pkg'].repo_name}#1", True)]
    with zipfile.ZipFile(overlaid.path) as wheel:
        assert "max(low," not in wheel.read("tinyserve/util.py").decode()
    # Every other input is the intact build's, byte for byte.
    assert {i.filename: i.sha256 for i in variant.inputs} == {i.filename: i.sha256 for i in intact.inputs}
    assert not intact.overlays


def test_a_variant_for_a_pr_the_lock_does_not_hold_is_refused_before_anything_changes(tmp_path, world):
    project = stack_naming_a_check(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    with pytest.raises(ServestackError, match=r"must hold exactly one PR numbered 7 .*found: none"):
        inputs.build(project, "tiny.without-7")
    assert not project.artifacts("tiny.without-7").exists()
