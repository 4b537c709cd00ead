"""The README's main command, run as a newcomer would: `nox -s build image smoke` on dev-cpu."""

from __future__ import annotations

import json
import shutil
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


# The oracle can fail: an image whose decode worker loses the Gated DeltaNet state a NIXL transfer
# delivered (zeroed where the transferred state is first used: the one prompt token prefill held
# back, run on the decode side with the state as its initial state) must fail smoke's agreement
# check, naming the prompts, while the aggregated server (no KV connector) is untouched.
GDN_ATTENTION = "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py"
CORRUPTION = '''
        # servestack's broken-transfer test image: with a KV connector (a disaggregated worker), the
        # state that arrived over NIXL is lost before its first use.
        from vllm.distributed.kv_transfer import has_kv_transfer_group
        if has_kv_transfer_group():
            ssm_state[prefill_state_indices[prefill_has_initial_state]] = 0
'''
ANCHOR = "        if no_initial_state.numel() > 0:\n            ssm_state[no_initial_state] = 0\n"
BREAK = f"""
import pathlib, py_compile
path = pathlib.Path({GDN_ATTENTION!r})
source = path.read_text()
assert source.count({ANCHOR!r}) == 1, "the anchor is not in gdn_attention.py"
path.write_text(source.replace({ANCHOR!r}, {ANCHOR!r} + {CORRUPTION!r}))
# The image's pycs are unchecked-hash: without a new one the edited source is never read.
py_compile.compile(str(path), cfile=str(path.parent / "__pycache__" / (path.stem + ".cpython-311.pyc")), doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""


def broken_transfer_image(reference: str) -> str:
    """The built image with the corruption above as one more layer, pushed by digest."""
    from servestack import services

    client = services.docker_client()
    container = client.containers.run(reference, ["/opt/venv/bin/python", "-c", BREAK], detach=True, network_mode="none")
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()[-2000:]
        repository = reference.split("@", 1)[0] + "-broken-transfer"
        container.commit(repository=repository, tag="test")
    finally:
        container.remove(force=True)
    client.images.push(repository, tag="test")
    pushed = client.images.get_registry_data(f"{repository}:test")
    return f"{repository}@{pushed.id}"


@pytest.mark.e2e
def test_the_oracle_fails_an_image_that_loses_the_transferred_ssm_state(tmp_path):
    from servestack.project import Project
    from servestack.smoke import run_smoke

    # A project of its own, so the main job's build/dev-cpu/smoke.json stays the main job's.
    for tree in ("pins", "recipes"):
        shutil.copytree(ROOT / tree, tmp_path / tree)
    project = Project(tmp_path)
    image = json.loads((ROOT / "build/dev-cpu/image.json").read_text())["reference"]
    broken = broken_transfer_image(image)
    result = run_smoke(project, "dev-cpu", image=broken, echo=None)
    checks = {(c.probe, c.name): c for c in result.record.checks}
    assert checks[("serving", "agreement-reference")].status == "pass", checks[("serving", "agreement-reference")]
    agreement = checks[("disagg", "agreement")]
    assert agreement.status == "fail", agreement
    # Named prompt by prompt, each off from its first generated token, by far more than float noise.
    assert "prompt 0 (tokens, 1 tokens)" in agreement.detail or "prompt 1 (tokens, 2 tokens)" in agreement.detail, agreement.detail
    rows = result.record.metrics["disagg"]["agreement"]["rows"]
    assert sum(row["verdict"] == "disagree" for row in rows) >= len(rows) // 2, rows
    # The transfer itself went through: only the state's content was wrong.
    assert checks[("disagg", "kv-transfer")].status == "pass", checks[("disagg", "kv-transfer")]
