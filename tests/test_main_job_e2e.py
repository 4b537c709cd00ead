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
from servestack.util.project import DEFAULT_STACK

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
    # What only a GPU host records (kernels, CUDA graphs, GPU buffers) is not run here, never passed.
    assert serving.pop("gpu") == "not_run", serving
    assert serving and set(serving.values()) == {"pass"}, serving
    # The production shape too: Dynamo's frontend, a prefill and a decode worker, the KV cache over NIXL.
    disagg = {c["name"]: c for c in smoke["checks"] if c["probe"] == "disagg"}
    assert disagg.pop("gpu")["status"] == "not_run", disagg
    assert disagg and {c["status"] for c in disagg.values()} == {"pass"}, disagg
    assert "transfer" in disagg["kv-transfer"]["detail"], disagg["kv-transfer"]
    # Ready means the pair served a first completion; retries before it are recorded, one per attempt.
    first = smoke["metrics"]["disagg"]["first_request"]
    assert first["served_s"] is not None and first["attempts"] == len(first["failed"]) + 1, first
    static = [c for c in smoke["checks"] if c["probe"] == "static"]
    assert static and not [c for c in static if c["status"] == "fail"]
    assert (out / "smoke-junit.xml").exists()
    assert "smoke dev-cpu: PASS" in smoke_step.log


# The oracle can fail, as a transfer bug would make it: images whose decode worker damages the Gated
# DeltaNet state that NIXL delivered, on the first step of each request only. The decode worker's
# first step computes the prompt's last token or tokens from the transferred state (with the
# recurrent kernel, or the chunked one where more than one is left); after that it carries on from
# what it computed itself. A state slot whose content differs from what this worker left in it was
# written by someone else (the transfer, or a new request's reset), so that step is the first: it is
# damaged there and never again. A new request's reset state is zero and damage leaves it so. Workers
# without a KV connector (the aggregated reference) are untouched. SERVESTACK_TEST_BREAK_FIRST_STEP,
# set in each image's config, picks the damage.
GDN_ATTENTION = "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py"
ANCHOR = "def _cpu_gdn_attention_nonspec(\n"
FIRST_STEP_BREAKAGE = """

# servestack's first-step breakage test image (tests/test_main_job_e2e.py).
_servestack_intact = _cpu_gdn_attention_nonspec
_servestack_left: dict = {}


def _cpu_gdn_attention_nonspec(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out):
    import os
    from vllm.distributed.kv_transfer import has_kv_transfer_group
    damage = os.environ.get("SERVESTACK_TEST_BREAK_FIRST_STEP", "")
    if not damage or not has_kv_transfer_group():
        return _servestack_intact(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out)
    conv, ssm = layer.kv_cache[0], layer.kv_cache[1]
    slots = attn_metadata_i.non_spec_state_indices_tensor.tolist()
    active = slots[:attn_metadata_i.num_decodes + attn_metadata_i.num_prefills]
    for slot in active:
        left = _servestack_left.get((layer.prefix, slot))
        if left is None or not (torch.equal(left[0], conv[slot]) and torch.equal(left[1], ssm[slot])):
            others = [other for other in active if other != slot]
            if damage == "misrouted":  # another in-flight request's state; alone in the batch, none
                if others:
                    conv[slot], ssm[slot] = conv[others[0]].clone(), ssm[others[0]].clone()
            elif damage == "recurrent-lost":
                ssm[slot] = 0
            elif damage == "recurrent-halved":
                ssm[slot] *= 0.5
            elif damage == "conv-lost":
                conv[slot] = 0
            else:
                raise ValueError(f"SERVESTACK_TEST_BREAK_FIRST_STEP={damage!r}")
    _servestack_intact(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out)
    for slot in slots[:attn_metadata_i.num_decodes + attn_metadata_i.num_prefills]:
        _servestack_left[(layer.prefix, slot)] = (conv[slot].clone(), ssm[slot].clone())
"""
PATCH = f"""
import pathlib, py_compile
path = pathlib.Path({GDN_ATTENTION!r})
source = path.read_text()
assert source.count({ANCHOR!r}) == 1, "the anchor is not in gdn_attention.py"
path.write_text(source + {FIRST_STEP_BREAKAGE!r})
# The image's pycs are unchecked-hash: without a new one the edited source is never read.
py_compile.compile(str(path), cfile=str(path.parent / "__pycache__" / (path.stem + ".cpython-311.pyc")), doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""
DAMAGES = ("recurrent-lost", "recurrent-halved", "conv-lost")
MISROUTED = "misrouted"


def first_step_breakage_images(reference: str) -> dict[str, str]:
    """The built image with the breakage above as one more layer, once per damage (the layer is
    shared, the config names the damage), each pushed and referenced by digest."""
    from servestack import services

    client = services.docker_client()
    container = client.containers.run(reference, ["/opt/venv/bin/python", "-c", PATCH], detach=True, network_mode="none")
    repository = reference.split("@", 1)[0] + "-first-step-breakage"
    images = {}
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()[-2000:]
        for damage in (*DAMAGES, MISROUTED):
            container.commit(repository=repository, tag=damage, changes=[f"ENV SERVESTACK_TEST_BREAK_FIRST_STEP={damage}"])
            errors = [line["error"] for line in client.images.push(repository, tag=damage, stream=True, decode=True)
                      if "error" in line]
            assert not errors, f"docker push {repository}:{damage}: {errors}"
            images[damage] = f"{repository}@{client.images.get_registry_data(f'{repository}:{damage}').id}"
    finally:
        container.remove(force=True)
    return images


@pytest.fixture(scope="module")
def breakage_images(build_job, runner_root) -> dict[str, str]:
    return first_step_breakage_images(_main_job_smoke(runner_root)["image"])


def run_oracle_against(image: str, smoke: dict):
    from servestack import services
    from servestack.lock import load_lock
    from servestack.smoke.checklist import disagg_plan
    from servestack.smoke.serving import run_disagg_probe
    from servestack.util.project import Project

    reference = smoke["metrics"].get("agreement_reference")
    assert reference, "the main job's smoke recorded no oracle reference (test_the_readme_main_job... runs first)"
    plan = disagg_plan(load_lock(Project(root=ROOT), "dev-cpu"), smoke["platform"])
    checks, metrics = run_disagg_probe(services.docker_client(), image, smoke["platform"], plan, stack="dev-cpu",
                                       baseline=reference)
    return {c.name: c for c in checks}, metrics


@pytest.mark.e2e
@pytest.mark.parametrize("damage", DAMAGES)
def test_the_oracle_fails_a_transfer_damaged_on_its_first_step_only(damage, breakage_images, runner_root):
    by_name, metrics = run_oracle_against(breakage_images[damage], _main_job_smoke(runner_root))
    agreement = by_name["agreement"]
    assert agreement.status == "fail", agreement
    result = metrics["agreement"]
    rows = result["rows"]
    # Answered (the engine lives), and the transfer itself went through: only the state was wrong.
    assert all(row["verdict"] != "error" for row in rows), [(row["verdict"], row["detail"][:300]) for row in rows]
    assert by_name["kv-transfer"].status == "pass", by_name["kv-transfer"]
    # At least two thirds of the prompts whose state was transferred, each named in the check.
    transferred = [i for i, row in enumerate(rows) if not row["control"]]
    assert 3 * len(result["failed_transferred"]) >= 2 * len(transferred), agreement.detail
    assert re.search(r"prompt \d+ \((tokens|text), \d+ tokens\): disagree: token \d+", agreement.detail), agreement.detail
    # The 1-token control moved no state: it agrees whatever the damage.
    assert [rows[i]["verdict"] for i in result["controls"]] == ["agree"], [rows[i] for i in result["controls"]]


@pytest.mark.e2e
def test_a_state_handed_to_another_in_flight_request_fails_the_loaded_round_only(breakage_images, runner_root):
    """Issue 50: a decode worker that gives a request's first step another in-flight request's state.
    One prompt at a time nothing else is in flight, and the sequential round agrees; the loaded round
    (pairs arriving while the carrier decodes) fails, naming the requests."""
    by_name, metrics = run_oracle_against(breakage_images[MISROUTED], _main_job_smoke(runner_root))
    result = metrics["agreement"]
    assert by_name["agreement"].status == "fail", by_name["agreement"]
    assert result["failed"] == [], agreement_rows(result)
    loaded = result["loaded"]
    assert loaded["arrived_while_decoding"] >= 4 and len(loaded["failed"]) >= 2, loaded
    assert re.search(r"under load, pair of \d+ tokens: disagree", by_name["agreement"].detail), by_name["agreement"].detail


def agreement_rows(result: dict) -> list:
    return [(row["kind"], row["length"], row["verdict"], row["detail"][:200]) for row in result["rows"]]
