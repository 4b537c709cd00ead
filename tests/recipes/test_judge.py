"""Recipes judged by srt-slurm itself (issue 51): each role's command line and environment built by the vendored
srt-slurm's own loader and worker stage, and what that launch means, each at its line.

The engine's half (vLLM's and Dynamo's parsers, create_engine_config, the NIXL hash, in the stack's image)
runs containers: tests/recipes/test_judge_e2e.py. Here the engine's answers are the ones it gives for these
launches, written out, so what is held is srt-slurm's launch and the messages.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.recipes import judge as J
from servestack.recipes import validate_files
from servestack.recipes.engine_cli import load_engine
from servestack.recipes.judged import check_file
from servestack.recipes.validate import recipe_files, validate_text
from servestack.util.project import Project

DISAGG = ROOT / "recipes" / "dev-cpu" / "disagg.yaml"
SWEEP = ROOT / "recipes" / "qwen35-gb200" / "4xdep2-1xdep8.yaml"
DEV_CPU = load_engine(ROOT / "pins" / "dev-cpu.engine.json")
GB200 = load_engine(ROOT / "pins" / "qwen35-gb200.engine.json")

needs_vendor = pytest.mark.skipif(not os.environ.get("SERVESTACK_VENDOR"),
                                  reason="SERVESTACK_VENDOR is not set (the vendored srt-slurm)")


def _variant(tmp_path: Path, old: str, new: str, name: str = "recipe.yaml", base: Path = DISAGG) -> Path:
    text = base.read_text()
    assert text.count(old) == 1, old
    out = tmp_path / name
    out.write_text(text.replace(old, new))
    return out


def _launch(file: Path) -> J.Launch:
    return J.launches([file], ["tiny-qwen35"])[file]


def _agreeing(served: str = "tiny-qwen35") -> dict:
    return {"ok": True, "served_model_name": served, "connector": "NixlConnector", "hash": "h", "factors": {}}


@needs_vendor
def test_srtslurm_builds_each_role_as_its_worker_stage_starts_it():
    launch = _launch(DISAGG)
    assert launch.error == "" and not launch.installs_dynamo and set(launch.roles) == {"prefill", "decode"}
    prefill = launch.roles["prefill"]
    assert prefill.argv[:3] == ("python3", "-m", "dynamo.vllm")
    assert prefill.argv[prefill.argv.index("--disaggregation-mode") + 1] == "prefill"
    # the model as srt-slurm mounts a local one, the role's flags sorted as its _config_to_cli_args passes them
    assert prefill.argv[prefill.argv.index("--model") + 1] == "/model"
    assert prefill.argv.index("--dtype") < prefill.argv.index("--enforce-eager") < prefill.argv.index("--max-model-len")
    # the role's own environment, the top-level one, and srt-slurm's own (one value standing for every process)
    assert prefill.env["PIN_WORKER_CPUS"] == "-1:" and launch.roles["decode"].env["PIN_WORKER_CPUS"] == ":-1"
    assert prefill.env["ETCD_LEASE_TTL"] == "180" and prefill.env["DYN_REQUEST_PLANE"] == "tcp"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1"


@needs_vendor
def test_the_top_level_environment_wins_over_the_roles_and_a_wrong_conv_layout_is_refused_at_its_line(tmp_path):
    file = _variant(tmp_path, "environment:\n  ETCD_LEASE_TTL", 'environment:\n  VLLM_SSM_CONV_STATE_LAYOUT: "SD"\n  ETCD_LEASE_TTL')
    launch = _launch(file)
    # both roles set DS in their own blocks; srt-slurm applies the top-level environment after them
    assert {r.env["VLLM_SSM_CONV_STATE_LAYOUT"] for r in launch.roles.values()} == {"SD"}
    errors = [str(e) for e in check_file(file, file.read_text(), launch, {m: _agreeing() for m in launch.roles}, DEV_CPU)]
    assert len(errors) == 1
    assert errors[0].startswith(f"{file}:94:31: environment.VLLM_SSM_CONV_STATE_LAYOUT: the prefill and decode worker(s) "
                                "start with VLLM_SSM_CONV_STATE_LAYOUT=SD (line 94; srt-slurm applies the top-level "
                                "environment after each role's, so it wins)")
    assert "set it to DS on line 94 (source: vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py" in errors[0]


@needs_vendor
def test_without_dynamo_install_false_srtslurm_installs_its_own_dynamo_and_the_recipe_is_refused(tmp_path):
    file = _variant(tmp_path, "dynamo:\n  install: false\n\n", "")
    launch = _launch(file)
    assert launch.installs_dynamo and launch.dynamo_version  # srt-slurm's default, not the image's 1.6.1
    errors = [str(e) for e in check_file(file, file.read_text(), launch, {m: _agreeing() for m in launch.roles}, DEV_CPU)]
    assert len(errors) == 1 and f"{file}:10:1: dynamo.install: srt-slurm v1.0.68 installs its default Dynamo" in errors[0]
    assert "add `dynamo:` with `install: false`" in errors[0]
    # with the block, nothing: the committed recipe
    assert check_file(DISAGG, DISAGG.read_text(), _launch(DISAGG), {m: _agreeing() for m in ("prefill", "decode")},
                      DEV_CPU) == []


@needs_vendor
def test_a_served_model_name_per_role_reaches_the_workers_after_the_first_roles_and_is_refused(tmp_path):
    file = _variant(tmp_path, '      served-model-name: "tiny-qwen35"\n      tensor-parallel-size: 1\n      max-model-len: 4096\n'
                              '      max-num-seqs: 16\n      dtype: "bfloat16"\n      gpu-memory-utilization: 0.1\n'
                              '      enforce-eager: true\n      no-disable-hybrid-kv-cache-manager: true\n'
                              '      generation-config: "vllm"\n      no-enable-prefix-caching: true\n'
                              '      mamba-ssm-cache-dtype: "bfloat16"\n      language-model-only: true\n  decode_environment',
                    '      served-model-name: "other"\n      tensor-parallel-size: 1\n      max-model-len: 4096\n'
                    '      max-num-seqs: 16\n      dtype: "bfloat16"\n      gpu-memory-utilization: 0.1\n'
                    '      enforce-eager: true\n      no-disable-hybrid-kv-cache-manager: true\n'
                    '      generation-config: "vllm"\n      no-enable-prefix-caching: true\n'
                    '      mamba-ssm-cache-dtype: "bfloat16"\n      language-model-only: true\n  decode_environment')
    decode = _launch(file).roles["decode"].argv
    names = [decode[i + 1] for i, a in enumerate(decode) if a == "--served-model-name"]
    assert names == ["tiny-qwen35", "other"]  # srt-slurm: the first role's name, then the role's own
    answers = {"prefill": _agreeing(), "decode": _agreeing("other")}  # vLLM keeps the last (the e2e test asks it)
    errors = [str(e) for e in check_file(file, file.read_text(), _launch(file), answers, DEV_CPU)]
    assert errors == [f"{file}:54:26: backend.vllm_config.decode.served-model-name: prefill registers the model as "
                      "'tiny-qwen35' (line 40), decode as 'other' (line 54): srt-slurm passes the first role's name to "
                      "every worker, then the role's own, which vLLM keeps, and the benchmark asks for one name; set "
                      "served-model-name to 'tiny-qwen35' on both (srtctl/backends/vllm.py: get_served_model_name)"]


@needs_vendor
def test_an_engine_refusal_lands_on_the_line_that_set_the_value_and_differing_hash_factors_name_both_lines(tmp_path):
    file = _variant(tmp_path,
                    "      gpu-memory-utilization: 0.1\n      enforce-eager: true\n      no-disable-hybrid-kv-cache-manager: true\n"
                    '      generation-config: "vllm"\n      no-enable-prefix-caching: true\n      mamba-ssm-cache-dtype: "bfloat16"\n'
                    "      language-model-only: true\n  decode_environment",
                    "      gpu-memory-utilization: 90\n      enforce-eager: true\n      no-disable-hybrid-kv-cache-manager: true\n"
                    '      generation-config: "vllm"\n      no-enable-prefix-caching: true\n      mamba-ssm-cache-dtype: "bfloat16"\n'
                    "      language-model-only: true\n      kv-cache-dtype: fp8\n  decode_environment")
    launch = _launch(file)
    refused = {"prefill": _agreeing(), "decode": {"ok": False, "stage": "config", "error": "ValidationError: "
                                                  "gpu_memory_utilization: Input should be less than or equal to 1"}}
    [error] = [str(e) for e in check_file(file, file.read_text(), launch, refused, DEV_CPU)]
    assert error.startswith(f"{file}:59:31: backend.vllm_config.decode.gpu-memory-utilization: the decode role, as "
                            "srt-slurm starts it, is refused by vLLM's engine configuration: ValidationError: "
                            "gpu_memory_utilization: Input should be less than or equal to 1")
    differ = {"prefill": {**_agreeing(), "hash": "a", "factors": {"cache_dtype": "auto"}},
              "decode": {**_agreeing(), "hash": "b", "factors": {"cache_dtype": "fp8"}}}
    [error] = [str(e) for e in check_file(file, file.read_text(), launch, differ, DEV_CPU)]
    assert error.startswith(f"{file}:66:23: backend.vllm_config.decode.kv-cache-dtype: the roles cannot exchange KV: "
                            "vLLM resolves cache_dtype to 'auto' on prefill and 'fp8' on decode")
    assert ("make decode resolve it to 'auto' (kv-cache-dtype is unset (vLLM's default) on prefill (line 38) "
            "and 'fp8' on decode (line 66))") in error and "nixl/metadata.py:compute_nixl_compatibility_hash" in error


def test_a_dp_rank_group_cannot_hide_behind_data_parallel_size_local(tmp_path):
    # srt-slurm v1.0.68 drops data-parallel-size-local and derives it: DP 16 on a 1-GPU worker is DP 16 still
    text = DISAGG.read_text().replace("      tensor-parallel-size: 1\n      max-model-len: 4096\n      max-num-seqs: 16\n"
                                      '      dtype: "bfloat16"\n      gpu-memory-utilization: 0.1\n      enforce-eager: true\n'
                                      "      no-disable-hybrid-kv-cache-manager: true\n      generation-config: \"vllm\"\n"
                                      "      no-enable-prefix-caching: true\n      mamba-ssm-cache-dtype: \"bfloat16\"\n"
                                      "      language-model-only: true\n  decode_environment",
                                      "      tensor-parallel-size: 1\n      data-parallel-size: 16\n      data-parallel-size-local: 8\n"
                                      "      max-model-len: 4096\n      max-num-seqs: 16\n"
                                      '      dtype: "bfloat16"\n      gpu-memory-utilization: 0.1\n      enforce-eager: true\n'
                                      "      no-disable-hybrid-kv-cache-manager: true\n      generation-config: \"vllm\"\n"
                                      "      no-enable-prefix-caching: true\n      mamba-ssm-cache-dtype: \"bfloat16\"\n"
                                      "      language-model-only: true\n  decode_environment")
    errors = [str(e) for e in validate_text(text, "r.yaml", DEV_CPU)]
    assert errors == ["r.yaml:56:27: backend.vllm_config.decode.data-parallel-size: tensor 1 x pipeline 1 x data 16 "
                      "parallel = 16 GPUs, but each worker has 1 GPUs"]


def test_a_connector_other_than_nixl_on_one_role_is_refused_by_the_static_rules_too():
    text = SWEEP.read_text()
    decode_at = text.index("    decode:\n      kv-transfer-config")
    text = text[:decode_at] + text[decode_at:].replace('"kv_connector": "NixlConnector"', '"kv_connector": "LMCacheConnectorV1"', 1)
    errors = [str(e) for e in validate_text(text, "r.yaml", GB200, platforms=("linux/arm64",))]
    assert errors == ["r.yaml:65:27: backend.vllm_config.decode.kv-transfer-config: the roles name different KV connectors: "
                      "prefill 'NixlConnector' (line 50), decode 'LMCacheConnectorV1' (line 65), so no KV moves between "
                      "them; name one connector in both kv-transfer-config values"]


def test_recipe_families_are_not_read_as_recipes(static_recipes):
    # `recipes validate recipes/` read recipes/families/*.yaml as recipes: 15 errors
    files = recipe_files([ROOT / "recipes"])
    assert not any(f.parent.name == "families" for f in files) and len(files) == 26
    result = validate_files(Project(root=ROOT), [ROOT / "recipes"])
    assert result.errors == []


def test_a_variable_one_role_lacks_is_reported_at_that_roles_environment_block():
    text = SWEEP.read_text()
    decode_env = text.index("  decode_environment:")
    line = '    VLLM_SSM_CONV_STATE_LAYOUT: "DS"\n'
    text = text[:decode_env] + text[decode_env:].replace(line, "", 1)
    [error] = [str(e) for e in validate_text(text, "r.yaml", GB200, platforms=("linux/arm64",))]
    assert error.startswith("r.yaml:44:5: backend.decode_environment: VLLM_SSM_CONV_STATE_LAYOUT must be 'DS' on both "
                            "roles exchanging KV; prefill sets 'DS' (line 42), decode sets nothing")


@needs_vendor
def test_a_cluster_path_for_the_model_or_the_container_is_the_clusters_and_not_refused_here(tmp_path):
    file = _variant(tmp_path, '  path: "tiny-qwen35"\n  container: "servestack-unbound"\n',
                    '  path: "/lustre/models/tiny-qwen35"\n  container: "/lustre/containers/dev-cpu.sqsh"\n')
    launch = J.launches([file], ["/lustre/models/tiny-qwen35"], ["/lustre/containers/dev-cpu.sqsh"])[file]
    assert launch.error == "" and "/model" in launch.roles["decode"].argv
    # without the stand-ins srt-slurm looks for them on this machine, and says so
    assert "Model path does not exist" in J.launches([file], [])[file].error
