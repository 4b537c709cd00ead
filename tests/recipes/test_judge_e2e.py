"""The engine judges recipes (issue 51): on the dev-cpu image the main job built, srt-slurm's launch of each role
is parsed by Dynamo's and vLLM's own parsers, configured by vLLM's create_engine_config, and paired by vLLM's
own NIXL compatibility hash. One container judges every variation below (about 20 s cold); a second pass is
answered from the cache.

Each class of issue 51 is refused with the line to change, and the working variations, which the static rules
refused as "the engine requires them equal", pass. For the role pairs, the validator's verdict is the
engine's: both configs construct and their hashes are equal.
"""

from __future__ import annotations

import os
import time

import pytest

from fixtures import workflow_jobs
from fixtures.paths import ROOT
from servestack.recipes import judge as J
from servestack.recipes import validate_files
from servestack.recipes.engine_check import stack_image
from servestack.util.project import Project

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not os.environ.get("SERVESTACK_VENDOR"), reason="SERVESTACK_VENDOR is not set")]

BASE = (ROOT / "recipes" / "dev-cpu" / "disagg.yaml").read_text()
PRE, DEC = "    prefill:\n", "    decode:\n"
EAGER = "      enforce-eager: true\n"


def _edit(text: str, role: str, old: str, new: str) -> str:
    at = text.index(role)
    where = text.index(old, at)
    return text[:where] + new + text[where + len(old):]


def _mtp(depth: int) -> str:
    return EAGER + f"      speculative-config: '{{\"method\": \"mtp\", \"num_speculative_tokens\": {depth}}}'\n"


# name -> (the recipe, what its one error says; None: it passes)
CASES = {
    "kv-cache-dtype-auto-on-one-role": (_edit(BASE, DEC, EAGER, EAGER + "      kv-cache-dtype: auto\n"), None),
    "dtype-on-one-role": (_edit(BASE, PRE, '      dtype: "bfloat16"\n', ""), None),
    "mtp-depth-differs": (_edit(_edit(BASE, PRE, EAGER, _mtp(1)), DEC, EAGER, _mtp(2)), None),
    "hybrid-kv-flag-dropped-on-one-role": (_edit(BASE, DEC, "      no-disable-hybrid-kv-cache-manager: true\n", ""), None),
    "default-attention-backend-named-on-one-role": (_edit(BASE, DEC, EAGER, EAGER + "      attention-backend: CPU_ATTN\n"),
                                                    None),
    "connector": (_edit(BASE, DEC, '"kv_connector": "NixlConnector"', '"kv_connector": "LMCacheConnectorV1"'),
                  ":53:27: backend.vllm_config.decode.kv-transfer-config: the roles name different KV connectors"),
    "global-environment": (BASE.replace("environment:\n  ETCD", 'environment:\n  VLLM_SSM_CONV_STATE_LAYOUT: "SD"\n  ETCD'),
                           ":94:31: environment.VLLM_SSM_CONV_STATE_LAYOUT: the prefill and decode worker(s) start with "
                           "VLLM_SSM_CONV_STATE_LAYOUT=SD"),
    "no-dynamo-install-false": (BASE.replace("dynamo:\n  install: false\n\n", ""),
                                ":10:1: dynamo.install: srt-slurm v1.0.68 installs its default Dynamo"),
    "gpu-memory-utilization-90": (_edit(BASE, DEC, "      gpu-memory-utilization: 0.1\n", "      gpu-memory-utilization: 90\n"),
                                  ":59:31: backend.vllm_config.decode.gpu-memory-utilization: the decode role, as srt-slurm "
                                  "starts it, is refused by vLLM's engine configuration: ValidationError: "
                                  "gpu_memory_utilization: Input should be less than or equal to 1"),
    "batched-tokens-below-seqs": (_edit(BASE, DEC, "      max-num-seqs: 16\n", "      max-num-seqs: 16\n      max-num-batched-tokens: 8\n"),
                                  ":58:31: backend.vllm_config.decode.max-num-batched-tokens: the decode role, as srt-slurm "
                                  "starts it, is refused by vLLM's engine configuration: ValidationError: max_num_batched_tokens "
                                  "(8) must be greater than or equal to max_num_seqs (16)"),
    "served-model-name": (_edit(BASE, DEC, '      served-model-name: "tiny-qwen35"\n', '      served-model-name: "other"\n'),
                          ":54:26: backend.vllm_config.decode.served-model-name: prefill registers the model as 'tiny-qwen35' "
                          "(line 40), decode as 'other' (line 54)"),
    "kv-cache-dtype-fp8-on-one-role": (_edit(BASE, DEC, EAGER, EAGER + "      kv-cache-dtype: fp8\n"),
                                       ":61:23: backend.vllm_config.decode.kv-cache-dtype: the roles cannot exchange KV: vLLM "
                                       "resolves cache_dtype to 'auto' on prefill and 'fp8' on decode"),
}


@pytest.fixture(scope="module")
def judged(build_job, runner_root, tmp_path_factory):
    """The main job's checkout, with its dev-cpu image and smoke model; every case written out and validated."""
    project = Project(root=workflow_jobs.workspace(runner_root))
    image = stack_image(project, "dev-cpu")
    if image is None:  # pushed by the main job, not yet in dockerd: the judge needs it here, as a user pulls it
        from servestack import services

        reference = (project.artifacts("dev-cpu") / "image.json").read_text().split('"reference": "')[1].split('"')[0]
        services.docker_client().images.pull(reference)
    out = tmp_path_factory.mktemp("judged")
    files = {}
    for name, (text, _) in CASES.items():
        files[name] = out / f"{name}.yaml"
        files[name].write_text(text)
    started = time.monotonic()
    first = validate_files(project, list(files.values()), stack="dev-cpu")
    cold = time.monotonic() - started
    started = time.monotonic()
    second = validate_files(project, list(files.values()), stack="dev-cpu")
    return {"project": project, "files": files, "first": first, "second": second, "cold": cold,
            "warm": time.monotonic() - started}


def test_each_class_is_refused_at_the_line_to_change_and_the_working_variations_pass(judged):
    errors = {name: [str(e) for e in judged["first"].errors if str(e).startswith(f"{file}:")]
              for name, file in judged["files"].items()}
    for name, (_, expected) in CASES.items():
        if expected is None:
            assert errors[name] == [], name
        else:
            assert len(errors[name]) == 1 and errors[name][0].startswith(f"{judged['files'][name]}{expected}"), (name, errors[name])
    assert any(n.startswith(f"{len(CASES)} dev-cpu recipe(s) judged by srt-slurm v1.0.68 and the engine in ")
               for n in judged["first"].notes), judged["first"].notes


def test_the_second_pass_is_answered_from_the_cache(judged):
    assert [str(e) for e in judged["second"].errors] == [str(e) for e in judged["first"].errors]
    assert judged["warm"] < 3, judged["warm"]


def test_the_verdict_on_a_role_pair_is_the_engines_both_configs_construct_and_the_hashes_agree(judged):
    pairs = ["kv-cache-dtype-auto-on-one-role", "dtype-on-one-role", "mtp-depth-differs", "hybrid-kv-flag-dropped-on-one-role",
             "default-attention-backend-named-on-one-role", "kv-cache-dtype-fp8-on-one-role", "gpu-memory-utilization-90",
             "batched-tokens-below-seqs", "connector"]
    files = [judged["files"][name] for name in pairs]
    launches = J.launches(files, ["tiny-qwen35"])
    image = stack_image(judged["project"], "dev-cpu")
    engine = J.Engine(image=image[0], digest=image[1],
                      model_config=__import__("json").loads((judged["project"].artifacts("dev-cpu") / "model" / "config.json").read_text()))
    dev = J.device("cpu")
    for name, file in zip(pairs, files, strict=True):
        answers = J.judge(engine, [(dev, launches[file].roles["prefill"]), (dev, launches[file].roles["decode"])])
        assert not isinstance(answers, str), answers
        prefill, decode = answers
        engine_says = prefill["ok"] and decode["ok"] and prefill.get("hash") is not None and prefill.get("hash") == decode.get("hash")
        validator_says = not any(str(e).startswith(f"{file}:") for e in judged["first"].errors)
        assert validator_says == engine_says, (name, prefill, decode)
