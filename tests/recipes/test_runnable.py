"""A recipe that validates is a recipe that can run (issue 40).

Each test edits one line of a committed GB200 recipe, as a new user would, and shows what
`recipes validate` says: an error naming the file, both lines and the engine's reason, or a
warning with the numbers. NVIDIA's 20 files and every committed recipe pass clean.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.errors import InputErrors
from servestack.recipes import check_before_run, validate_files
from servestack.recipes.engine_cli import load_engine
from servestack.recipes.kvrules import derive
from servestack.recipes.validate import validate_text
from servestack.util.project import Project

pytestmark = pytest.mark.usefixtures("static_recipes")  # the static rules; the engine's: *_judge_e2e.py
GB200 = load_engine(ROOT / "pins" / "qwen35-gb200.engine.json")
SWEEP = ROOT / "recipes" / "qwen35-gb200" / "4xdep2-1xdep8.yaml"
CC5120 = ROOT / "recipes" / "qwen35-gb200" / "4xdep2-1xdep8-cc5120.yaml"
FIXTURE_ENGINE = ROOT / "tests" / "fixtures" / "nixl-engine"
DECODE_TAIL = '      mamba-ssm-cache-dtype: "bfloat16"\n      language-model-only: true\n\nbenchmark'


def edited(file: Path, old: str, new: str, engine=GB200) -> tuple[list[str], list[str]]:
    """The errors and warnings of `file` with its one line `old` replaced by `new`."""
    text = file.read_text()
    assert text.count(old) == 1, old
    warnings: list = []
    errors = validate_text(text.replace(old, new), file, engine, warnings=warnings, platforms=("linux/arm64",))
    return [str(e) for e in errors], [str(w) for w in warnings]


# -- class 1: prefill and decode agree on what NIXL moves ----------------------------------------------
def test_a_decode_ssm_cache_dtype_unlike_prefills_is_an_error_naming_both_lines_and_the_engines_reason():
    errors, _ = edited(SWEEP, DECODE_TAIL, DECODE_TAIL.replace("bfloat16", "float32"))
    assert len(errors) == 1
    assert errors[0].startswith(f"{SWEEP}:76:")
    assert "prefill sets 'bfloat16' (line 61), decode sets 'float32' (line 76)" in errors[0]
    assert "nixl/base_worker.py:_build_mamba_remote" in errors[0]


def test_a_conv_state_layout_other_than_ds_on_one_role_is_an_error():
    errors, _ = edited(SWEEP, '    VLLM_SSM_CONV_STATE_LAYOUT: "DS"\n  vllm_config', '    VLLM_SSM_CONV_STATE_LAYOUT: "SD"\n  vllm_config')
    assert len(errors) == 1 and f"{SWEEP}:47:" in errors[0]
    assert "prefill sets 'DS' (line 42), decode sets 'SD' (line 47)" in errors[0]
    assert "Set VLLM_SSM_CONV_STATE_LAYOUT=DS (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:__init__)" in errors[0]


def test_a_kv_cache_dtype_on_one_role_only_is_an_error_from_the_compatibility_hash():
    errors, _ = edited(SWEEP, "      max-num-batched-tokens: 16384\n", "      kv-cache-dtype: fp8\n")
    assert len(errors) == 1
    assert "prefill sets 'fp8' (line 63), decode sets nothing (the engine's default) (line 64)" in errors[0]
    assert "compatibility hash factor 'cache_dtype'" in errors[0] and "nixl/metadata.py:compute_nixl_compatibility_hash" in errors[0]


def test_async_scheduling_on_one_role_only_costs_and_is_a_warning():
    errors, warnings = edited(SWEEP,
                              "      async-scheduling: true\n      stream-interval: 100\n"
                              "      mamba-ssm-cache-dtype: \"bfloat16\"\n      language-model-only: true\n\n",
                              "      stream-interval: 100\n      mamba-ssm-cache-dtype: \"bfloat16\"\n      language-model-only: true\n\n")
    assert errors == []
    assert len(warnings) == 1 and "async-scheduling differs: prefill sets True (line 59)" in warnings[0]


def test_a_block_size_the_handshake_accepts_differing_passes_silently():
    assert edited(SWEEP, "      max-num-batched-tokens: 16384\n", "      block-size: 32\n") == ([], [])


# -- the rules move with the engine ----------------------------------------------------------------------
def fixture_sources(extra_factor: str = "") -> dict[str, str]:
    sources = {str(f.relative_to(FIXTURE_ENGINE)).removesuffix("src"): f.read_text()
               for f in FIXTURE_ENGINE.rglob("*.pysrc")}
    if extra_factor:
        name = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py"
        sources[name] = sources[name].replace('        "transfer_mode"', f"        {extra_factor}\n        \"transfer_mode\"")
    return sources


def test_the_rules_are_read_from_the_engines_source():
    rules = {(r.kind, r.name): r for r in derive(fixture_sources())}
    assert rules["hash", "cache_dtype"].settings == ("flag:kv-cache-dtype",)  # through EngineArgs.create_engine_config
    assert rules["handshake", "block_size"].policy == "heterogeneous"
    assert rules["handshake", "tp_size"].condition == "self._has_mamba"
    assert rules["state", "VLLM_SSM_CONV_STATE_LAYOUT"].value == "DS"
    assert rules["state", "ssm_sizes"].settings == ("flag:mamba-ssm-cache-dtype",)


def test_an_engine_hashing_one_more_factor_makes_that_setting_required_equal():
    before = derive(fixture_sources())
    after = derive(fixture_sources('"block_size": cache_config.block_size,'))
    added = [r for r in after if r not in before]
    assert [(r.name, r.policy, r.settings) for r in added] == [("block_size", "equal", ("flag:block-size",))]
    engine = dataclasses.replace(GB200, kv_rules=tuple(after))
    errors, _ = edited(SWEEP, "      max-num-batched-tokens: 16384\n", "      block-size: 32\n", engine)
    assert len(errors) == 1 and "compatibility hash factor 'block_size'" in errors[0]


def test_the_committed_engine_descriptions_carry_the_rules_with_their_sources():
    for stack in ("qwen35-gb200", "dev-cpu"):
        rules = load_engine(ROOT / "pins" / f"{stack}.engine.json").kv_rules
        assert {r.name for r in rules} >= {"cache_dtype", "is_hma_enabled", "ssm_sizes", "VLLM_SSM_CONV_STATE_LAYOUT"}
        assert all(r.source.startswith("vllm/") and ":" in r.source for r in rules)


# -- class 2: the hardware is what the GPU type has ------------------------------------------------------
def test_a_gb200_recipe_with_8_gpus_per_node_is_an_error():
    errors, _ = edited(SWEEP, "  gpus_per_node: 4", "  gpus_per_node: 8")
    assert len(errors) == 1
    # what to change first, in one sentence; the datasheet after it
    assert ("8 GPUs per node (line 22), but a gb200 node has 4: set gpus_per_node to 4 for gpu_type gb200 (line 21) "
            "(source: NVIDIA GB200 NVL72 datasheet:") in errors[0]


def test_nvfp4_on_hopper_and_an_arm64_image_on_x86_nodes_are_errors():
    errors, _ = edited(SWEEP, '  gpu_type: "gb200"', '  gpu_type: "h200"')
    assert any("NVFP4 (line 15) needs Blackwell's FP4 tensor cores; gpu_type h200 (line 21" in e for e in errors)
    assert any("the image (line 14) is linux/arm64 as its stack builds it, but gpu_type h200 (line 21) nodes are "
               "linux/amd64" in e for e in errors)


# -- class 3: the workload fits the engine's limits ------------------------------------------------------
def test_isl_plus_osl_beyond_a_roles_max_model_len_is_an_error():
    errors, _ = edited(SWEEP, "      max-num-batched-tokens: 16384\n", "      max-model-len: 8192\n")
    assert errors == [f"{SWEEP}:81:8: benchmark.isl: isl 8192 (line 81) + osl 1024 (line 82) = 9216 tokens exceed the "
                      "prefill role's max-model-len 8192 (line 63): vLLM refuses every request whose prompt plus "
                      "max_tokens exceed it"]


def test_a_per_rank_batch_above_the_cuda_graph_capture_size_is_a_warning_with_the_numbers():
    errors, warnings = edited(CC5120, "      max-cudagraph-capture-size: 768\n", "      max-cudagraph-capture-size: 512\n")
    assert errors == []
    assert warnings == [f"{CC5120}:84:18: benchmark.concurrencies: at concurrency 5120 (line 84) each of the 8 decode "
                        "rank(s) batches up to 640 requests, above the largest CUDA-graph capture size 512 (line 78): those "
                        "steps run outside CUDA graphs; raise max-cudagraph-capture-size to 640 or more, as NVIDIA's "
                        "-cc4096/-cc5120 variants do"]


def test_a_concurrency_beyond_what_decode_holds_is_queued_and_warned():
    _, warnings = edited(CC5120, '  concurrencies: "5120"', '  concurrencies: "10240"')
    assert any("concurrency 10240 (line 84) exceeds what the decode role holds at once: max-num-seqs 1024 (vLLM's "
               "default on this GPU) x data parallel 8 x 1 worker(s) = 8192" in w for w in warnings)


def test_fewer_prompts_than_the_concurrency_is_a_warning():
    _, warnings = edited(CC5120, "  num_prompts_mult: 8\n", "  num_requests: 100\n")
    assert warnings == [f"{CC5120}:87:17: benchmark.num_requests: 100 prompts (line 87) never reach concurrency 5120 "
                        "(line 84): the point measures a smaller load than it names"]


# -- what passes, and where the checks run ---------------------------------------------------------------
def test_nvidias_files_and_every_committed_recipe_pass_with_no_error_and_no_warning():
    project = Project(root=ROOT)
    for paths, stack in (([ROOT / "tests" / "data" / "srt-slurm-recipes"], "qwen35-gb200"),
                         ([ROOT / "recipes" / "qwen35-gb200", ROOT / "recipes" / "dev-cpu"], None)):
        result = validate_files(project, paths, stack=stack)
        assert (result.errors, result.warnings) == ([], [])


@pytest.fixture()
def project(tmp_path: Path) -> Project:
    shutil.copytree(ROOT / "pins", tmp_path / "pins")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    return Project(root=tmp_path)


def test_runners_and_pull_refuse_a_recipe_that_cannot_run(project: Project):
    recipe = project.recipes / "qwen35-gb200" / SWEEP.name
    recipe.write_text(recipe.read_text().replace(DECODE_TAIL, DECODE_TAIL.replace("bfloat16", "float32")))
    with pytest.raises(InputErrors, match="mamba-ssm-cache-dtype differs"):
        check_before_run([recipe], project)
    assert check_before_run([project.recipes / "qwen35-gb200" / CC5120.name], project) == []
