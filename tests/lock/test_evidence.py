"""PR evidence: `lock` proves a PR is in the pinned wheel by reading its files, without GitHub.

The tinyserve fixture's wheel is a real wheel built from its v1.0.0 commit: PR #1 (merged before
the release) changed `tinyserve/util.py`; PR #2 (merged after) added `tinyserve/extra.py`. The
history is served by a GitHub stand-in speaking the REST protocol, or refused by a closed port.
"""

from __future__ import annotations

import pytest

from fixtures.tinystack import PR1_EVIDENCE, PR2_EVIDENCE, entries, github, stack_with, unreachable
from servestack import inputs, lock
from servestack.errors import InputErrors, ServestackError
from servestack.lock import check as lockcheck
from servestack.probe.static.evidence import evidence_problem


def test_evidence_alone_makes_a_pr_included_without_any_history(tmp_path, world):
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE})
    lock.lock(project, "tiny", unreachable())
    (entry,) = entries(project).values()
    assert entry["status"] == "included" and entry["verified_by"] == ["evidence"]
    assert entry["evidence"] == [{"file": "tinyserve/util.py", "contains": "max(low, min(value, high))",
                                  "found": "tinyserve/util.py:2"}]
    assert lockcheck.check(project, "tiny").ok


def test_evidence_missing_from_the_pinned_wheel_names_the_pr_and_the_item(tmp_path, world):
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE})
    before = lock.lock(project, "tiny", unreachable()).read_bytes()
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE, 2: PR2_EVIDENCE})
    with pytest.raises(InputErrors) as info:
        lock.lock(project, "tiny", unreachable())
    (error,) = info.value.errors
    assert error.field == "packages[0].prs[1].evidence[0]"
    assert "example/tinyserve#2 (PR 2)" in str(error)
    assert "the pinned tinyserve 1.0.0 (tinyserve-1.0.0-py3-none-any.whl)" in str(error)
    assert "module tinyserve.extra is not in the package" in str(error)
    assert project.lock_file("tiny").read_bytes() == before


def test_evidence_and_ancestry_together_and_a_pr_after_the_release_is_an_overlay(tmp_path, world):
    project = stack_with(tmp_path, world, {1: PR1_EVIDENCE, 2: PR2_EVIDENCE})
    lock.lock(project, "tiny", github(world))
    prs = entries(project)
    assert prs[1]["status"] == "included" and prs[1]["verified_by"] == ["ancestry", "evidence"]
    # Not in the pinned wheel, and history says so: an overlay, whose evidence the probe checks in the image.
    assert prs[2]["status"] == "overlay" and prs[2]["evidence"] == [{"attribute": "tinyserve.extra:extra_feature"}]


def test_evidence_that_contradicts_ancestry_is_an_error(tmp_path, world):
    wrong = '          - {file: tinyserve/util.py, pattern: "def clamp\\\\(value, low, high, step\\\\)"}\n'
    project = stack_with(tmp_path, world, {1: wrong})
    with pytest.raises(InputErrors, match=r"example/tinyserve#1 \(PR 1\): its merge commit is an ancestor of the "
                                          r"pinned commit, yet the evidence is missing"):
        lock.lock(project, "tiny", github(world))


def test_a_pr_with_neither_evidence_nor_history_is_unverified_and_build_refuses_it(tmp_path, world):
    project = stack_with(tmp_path, world, {1: ""})
    lock.lock(project, "tiny", unreachable())
    assert entries(project)[1]["status"] == "unverified"
    with pytest.raises(ServestackError, match=r"example/tinyserve#1 are unverified .* --allow-unverified"):
        inputs.build(project, "tiny")
    assert not (project.artifacts("tiny") / "build.json").exists()


@pytest.mark.parametrize(
    "item, problem",
    [
        ({"flag": "--gdn-prefill-backend"}, None),
        ({"flag": "--no-such-flag"}, "no source declares the flag --no-such-flag"),
        ({"env": "VLLM_SSM_CONV_STATE_LAYOUT"}, None),
        ({"env": "VLLM_NOT_THERE"}, "no source registers the variable VLLM_NOT_THERE"),
        ({"attribute": "pkg.sched:Scheduler._drain"}, None),
        ({"attribute": "pkg.sched:Other._drain"}, "pkg.sched defines no Other._drain"),
        ({"file": "pkg/sched.py", "pattern": r"self\.defer = (True|False)"}, None),
    ],
)
def test_each_kind_of_evidence_is_read_from_files(item, problem):
    files = {
        "pkg/args.py": 'class EngineArgs:\n    gdn_prefill_backend: str | None = None\n',
        "pkg/envs.py": 'environment_variables = {\n    "VLLM_SSM_CONV_STATE_LAYOUT": lambda: None,\n}\n',
        "pkg/sched.py": "class Scheduler:\n    def __init__(self):\n        self.defer = True\n\n    def _drain(self):\n        pass\n",
    }
    found, where = evidence_problem(item, files.get, lambda: list(files))
    assert found == problem
    assert bool(where) == (problem is None)
