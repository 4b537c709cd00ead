"""The README's main command, run as a newcomer would: `nox -s build image smoke` on dev-cpu.

It runs once per session, as the build workflow's `Build, image, smoke` step on a fresh checkout
of this commit (conftest's `build_job`, whose publish and outputs test_workflows_e2e checks): that
step is the README's command on the default stack, which the first test below holds it to.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from fixtures import workflow_jobs

from servestack.project import DEFAULT_STACK

ROOT = Path(__file__).resolve().parents[1]


def _main_job_smoke(runner_root: Path) -> dict:
    return json.loads((workflow_jobs.workspace(runner_root) / "build" / "dev-cpu" / "smoke.json").read_text())


@pytest.mark.e2e
def test_the_readme_main_job_builds_pushes_and_passes_every_probe(build_job, runner_root):
    first_block = (ROOT / "README.md").read_text().split("```")[1]
    assert "nox -s build image smoke" in first_block
    # The step runs that command on the matrix's stack, which is the default one (dev-cpu).
    image_job = yaml.safe_load((workflow_jobs.WORKFLOWS / "build.yml").read_text())["jobs"]["image"]
    [step] = [s for s in image_job["steps"] if s.get("name") == "Build, image, smoke"]
    assert re.fullmatch(r'exec nox -x -s build image smoke -- --stack "\$STACK"', step["run"].strip()), step["run"]
    assert workflow_jobs.STACK == DEFAULT_STACK in image_job["strategy"]["matrix"]["stack"]
    smoke_step = build_job.step("Build, image, smoke")
    assert smoke_step.outcome == "success", smoke_step.log[-4000:]

    out = workflow_jobs.workspace(runner_root) / "build" / "dev-cpu"
    image = json.loads((out / "image.json").read_text())
    smoke = _main_job_smoke(runner_root)
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
    assert (out / "smoke-junit.xml").exists()
    assert "smoke dev-cpu: PASS" in smoke_step.log


# The oracle can fail: an image whose decode worker loses the Gated DeltaNet state the NIXL transfer
# delivered. For GDN layers the prefill worker holds the last prompt token back, so the decode worker
# computes it with the recurrent (decode) kernel from the transferred state; the overlay zeroes that
# state before each decode step of a worker with a KV connector, so it never reaches a generated
# token, while the aggregated server (no connector) is untouched. Smoke's agreement check must fail,
# naming the prompts, against the main job's own reference answers (its smoke.json, just written).
GDN_ATTENTION = "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py"
ANCHOR = "        query, key, value = layer.rearrange_mixed_qkv(decode_mixed_qkv)\n"
CORRUPTION = """
        # servestack's broken-transfer test image: on a disaggregated worker, the recurrent state
        # (the transferred one on the first step) is lost before it is used.
        from vllm.distributed.kv_transfer import has_kv_transfer_group
        if has_kv_transfer_group():
            ssm_state[decode_state_indices] = 0
"""
BREAK = f"""
import pathlib, py_compile
path = pathlib.Path({GDN_ATTENTION!r})
source = path.read_text()
# Both decode paths (with and without speculative decoding) start from the state there.
assert source.count({ANCHOR!r}) >= 1, "the anchor is not in gdn_attention.py"
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
    errors = [line["error"] for line in client.images.push(repository, tag="test", stream=True, decode=True)
              if "error" in line]
    assert not errors, f"docker push {repository}:test: {errors}"
    pushed = client.images.get_registry_data(f"{repository}:test")
    return f"{repository}@{pushed.id}"


@pytest.mark.e2e
def test_the_oracle_fails_an_image_that_loses_the_transferred_ssm_state(build_job, runner_root):
    from servestack import services
    from servestack.lock import load_lock
    from servestack.project import Project
    from servestack.smoke.plan import disagg_plan
    from servestack.smoke.serving import run_disagg_probe

    smoke = _main_job_smoke(runner_root)
    reference = smoke["metrics"].get("agreement_reference")
    assert reference, "the main job's smoke recorded no oracle reference (test_the_readme_main_job... runs first)"
    broken = broken_transfer_image(smoke["image"])
    plan = disagg_plan(load_lock(Project(ROOT), "dev-cpu"), smoke["platform"])
    checks, metrics = run_disagg_probe(services.docker_client(), broken, smoke["platform"], plan, stack="dev-cpu",
                                       baseline=reference)
    by_name = {c.name: c for c in checks}
    agreement = by_name["agreement"]
    assert agreement.status == "fail", agreement
    # Prompt by prompt, answered (not errors: the engine lives), and off by far more than float noise.
    rows = metrics["agreement"]["rows"]
    assert all(row["verdict"] != "error" for row in rows), [(row["verdict"], row["detail"][:300]) for row in rows]
    disagree = [row for row in rows if row["verdict"] == "disagree"]
    assert len(disagree) >= len(rows) // 2, rows
    assert re.search(r"prompt \d+ \(tokens, \d+ tokens\): disagree: token \d+", agreement.detail), agreement.detail
    # The state matters most where the prompt is long: there the answers part at the first token.
    long = [row for row in rows if row["kind"] == "tokens" and row["length"] >= 100]
    assert sum(row["agreed"] == 0 for row in long) >= len(long) // 2, long
    # The transfer itself went through: only the state's content was wrong.
    assert by_name["kv-transfer"].status == "pass", by_name["kv-transfer"]
