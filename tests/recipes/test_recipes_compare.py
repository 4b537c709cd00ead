"""`servestack recipes compare`: our qwen35-gb200 set against NVIDIA's published files (tests/data)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.cli import main
from servestack.errors import InputError
from servestack.recipes import closest_set, committed_sets, compare_dirs, format_comparisons
from servestack.util.project import Project

OURS = ROOT / "recipes" / "qwen35-gb200"
NVIDIA = ROOT / "tests" / "data" / "srt-slurm-recipes" / "qwen35-gb200-8k1k-vllm-disagg"


def test_our_set_is_nvidias_point_for_point():
    comparisons = compare_dirs(OURS, NVIDIA)
    assert len(comparisons) == 20
    for c in comparisons:
        assert c.ours is not None and c.theirs is not None, c
        assert c.same, format_comparisons([c])
        # what differs, differs on purpose: the container, Dynamo's install block, the identity block,
        # and the one setting whose srt-slurm default changed, written out
        assert {d.path[0] for d in c.differences} == {"model", "dynamo", "identity", "backend"}, c.differences
        assert {d.path for d in c.differences if d.path[0] == "model"} == {("model", "container")}
        assert [(d.path, d.ours, d.theirs) for d in c.differences if d.path[0] == "backend"] == [
            (("backend", "dp_launch_mode"), "per_gpu", "(absent)")]
        assert "backend.dp_launch_mode: ours \"per_gpu\", theirs unset (written out: srt-slurm's vLLM default until v1.0.68" \
            in format_comparisons([c])


def test_a_written_out_default_that_disagrees_with_theirs_is_a_difference(tmp_path: Path):
    theirs = _copy(tmp_path)
    f = theirs / "4xdep2-1xdep8.yaml"
    f.write_text(f.read_text().replace("  type: vllm\n", "  type: vllm\n  dp_launch_mode: per_node\n", 1))
    [c] = [c for c in compare_dirs(OURS, theirs) if c.name == f.name]
    assert not c.same
    assert "backend.dp_launch_mode: ours \"per_gpu\", theirs \"per_node\"" in format_comparisons([c])


def _copy(tmp_path: Path) -> Path:
    theirs = tmp_path / "theirs"
    shutil.copytree(NVIDIA, theirs)
    return theirs


def test_a_changed_flag_env_or_benchmark_value_is_reported(tmp_path: Path):
    theirs = _copy(tmp_path)
    f = theirs / "4xdep2-1xdep8-cc4096.yaml"
    text = f.read_text()
    text = text.replace("max-cudagraph-capture-size: 640", "max-cudagraph-capture-size: 512")
    text = text.replace('VLLM_SSM_CONV_STATE_LAYOUT: "DS"', 'VLLM_SSM_CONV_STATE_LAYOUT: "SD"', 1)
    text = text.replace("random_range_ratio: 0.8", "random_range_ratio: 1.0")
    text = text.replace("  gpus_per_prefill: 2", "  gpus_per_prefill: 2\n  prefill_workers_extra: 1")
    f.write_text(text)
    [c] = [c for c in compare_dirs(OURS, theirs) if c.name == f.name]
    real = {d.key: (d.ours, d.theirs) for d in c.differences if not d.ignored}
    assert real == {
        "backend.vllm_config.decode.max-cudagraph-capture-size": ("640", "512"),
        "backend.prefill_environment.VLLM_SSM_CONV_STATE_LAYOUT": ("DS", "SD"),
        "benchmark.random_range_ratio": (0.8, 1.0),
        "resources.prefill_workers_extra": ("(absent)", 1),
    }
    out = format_comparisons([c])
    assert "4 difference(s)" in out and "max-cudagraph-capture-size: ours \"640\", theirs \"512\"" in out


def test_equal_meaning_in_another_spelling_is_not_a_difference(tmp_path: Path):
    theirs = _copy(tmp_path)
    f = theirs / "5xdep2-1xdep8.yaml"
    text = f.read_text()
    text = text.replace('concurrencies: "64x128x256x512x1024x2048x3072"', "concurrencies: [64, 128, 256, 512, 1024, 2048, 3072]")
    text = text.replace("tensor-parallel-size: 1", 'tensor_parallel_size: "1"')  # srtctl passes --tensor-parallel-size 1 either way
    text = text.replace('"kv_role": "kv_both", ', '"kv_role":"kv_both",')  # the same JSON
    text = text.replace("  connector: null\n", "")  # a null is an absent key
    text = text.replace("      async-scheduling: true\n", "      async-scheduling: true\n      enforce-eager: false\n")  # false: left out
    f.write_text(text)
    [c] = [c for c in compare_dirs(OURS, theirs) if c.name == f.name]
    assert c.same, format_comparisons([c])


def test_the_previous_family_would_have_been_caught(tmp_path: Path):
    """What issue 12 found by hand: the sweep ran to 5120 and the throughput runs passed --api-server-count."""
    ours = tmp_path / "ours"
    shutil.copytree(OURS, ours)
    f = ours / "6xdep2-1xdep8.yaml"
    f.write_text(f.read_text().replace('"64x128x256x512x1024x2048x3072"', '"64x128x256x512x1024x2048x3072x4096x5120"')
                 .replace("      language-model-only: true\n", "      language-model-only: true\n      api-server-count: 1\n"))
    (ours / "6xdep2-1xdep8-cc4096.yaml").unlink()
    comparisons = {c.name: c for c in compare_dirs(ours, NVIDIA)}
    keys = {d.key for d in comparisons["6xdep2-1xdep8.yaml"].differences if not d.ignored}
    assert keys == {"benchmark.concurrencies", "backend.vllm_config.prefill.api-server-count",
                    "backend.vllm_config.decode.api-server-count"}
    assert comparisons["6xdep2-1xdep8-cc4096.yaml"].ours is None and not comparisons["6xdep2-1xdep8-cc4096.yaml"].same
    assert "6xdep2-1xdep8-cc4096.yaml: only in theirs" in format_comparisons(list(comparisons.values()))


def test_broken_yaml_is_named_with_its_position(tmp_path: Path):
    theirs = _copy(tmp_path)
    (theirs / "4xdep2-1xdep8.yaml").write_text("name: [unclosed\n")
    with pytest.raises(InputError) as info:
        compare_dirs(OURS, theirs)
    assert info.value.location.file.endswith("4xdep2-1xdep8.yaml") and info.value.location.line is not None


def test_cli_compare_picks_our_set_and_exits_by_result(tmp_path: Path, capsys):
    project = Project(root=ROOT)
    assert closest_set(committed_sets(project), NVIDIA) == OURS
    assert main(["--project", str(ROOT), "recipes", "compare", str(NVIDIA)]) == 0
    out = capsys.readouterr().out
    assert "recipes compare: 20 of 20 file(s) the same" in out
    theirs = _copy(tmp_path)
    f = theirs / "8xdep2-1xdep8-acc.yaml"
    f.write_text(f.read_text().replace("repeat: 5", "repeat: 3"))
    assert main(["--project", str(ROOT), "recipes", "compare", "--against", str(OURS), str(theirs)]) == 1
    out = capsys.readouterr().out
    assert "8xdep2-1xdep8-acc.yaml: 1 difference(s)" in out and "benchmark.repeat: ours 5, theirs 3" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "other.yaml").write_text("name: x\n")
    assert main(["--project", str(ROOT), "recipes", "compare", str(empty)]) == 2
    assert "--against" in capsys.readouterr().err
