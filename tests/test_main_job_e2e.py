"""The README's main command, run as a newcomer would: `nox -s build image smoke` on dev-cpu."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_the_readme_main_job_builds_pushes_and_passes_every_probe():
    first_block = (ROOT / "README.md").read_text().split("```")[1]
    assert "nox -s build image smoke" in first_block

    result = subprocess.run(["nox", "-s", "build", "image", "smoke"], cwd=ROOT, capture_output=True, text=True,
                            timeout=3600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]

    image = json.loads((ROOT / "build/dev-cpu/image.json").read_text())
    smoke = json.loads((ROOT / "build/dev-cpu/smoke.json").read_text())
    assert smoke["image"] == image["reference"] and "@sha256:" in image["reference"]
    assert smoke["status"] == "pass"
    serving = {c["name"]: c["status"] for c in smoke["checks"] if c["probe"] == "serving"}
    assert serving and set(serving.values()) == {"pass"}, serving
    # The production shape too: Dynamo's frontend, a prefill and a decode worker, the KV cache over NIXL.
    disagg = {c["name"]: c for c in smoke["checks"] if c["probe"] == "disagg"}
    assert disagg and {c["status"] for c in disagg.values()} == {"pass"}, disagg
    assert "transfer" in disagg["kv-transfer"]["detail"], disagg["kv-transfer"]
    # Ready means the pair served a first completion; retries before it are recorded, one per attempt.
    first = smoke["metrics"]["disagg"]["first_request"]
    assert first["served_s"] is not None and first["attempts"] == len(first["failed"]) + 1, first
    static = [c for c in smoke["checks"] if c["probe"] == "static"]
    assert static and not [c for c in static if c["status"] == "fail"]
    assert (ROOT / "build/dev-cpu/smoke-junit.xml").exists()
    assert "smoke dev-cpu: PASS" in result.stdout + result.stderr
