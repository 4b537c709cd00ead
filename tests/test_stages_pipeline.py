"""The pipeline loader: the committed pipelines load; bad ones name file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from servestack.errors import InputError
from servestack.stages.pipeline import load_pipeline, parse_duration

ROOT = Path(__file__).resolve().parents[1]


def test_committed_pipelines_load():
    dev = load_pipeline(ROOT / "pipelines" / "dev-cpu.yaml", ROOT)
    assert dev.stack == "dev-cpu" and dev.runner.kind == "local"
    assert dev.stages["accuracy"].gate.accuracy_threshold == 0.0
    assert dev.stages["accuracy"].gsm8k.num_questions == 50
    assert dev.stages["throughput"].concurrencies == (1, 4, 16)
    gb = load_pipeline(ROOT / "pipelines" / "qwen35-gb200.yaml", ROOT)
    assert gb.runner.kind == "srtctl" and gb.stages["accuracy"].gate.accuracy_threshold == 0.88
    assert gb.stages["throughput"].time_limit_s == 4 * 3600 and gb.retry.max_attempts == 3


@pytest.mark.parametrize("text,where", [
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a]\n    gate: {threshold: 1.5}\n",
     r"p.yaml:5:\d+: stages.accuracy.gate.threshold: must be within \[0.0, 1.0\]"),
    ("stack: x\nrunner:\n  kind: k8s\nstages:\n  throughput: {recipes: [a]}\n",
     r"p.yaml:3:3: runner.kind: 'k8s' is not one of local, slurm, srtctl"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    concurrencies: [1, 0]\n",
     r"p.yaml:5:\d+: stages.throughput.concurrencies\[1\]: must be >= 1"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    time_limit: soon\n",
     r"p.yaml:5:5: stages.throughput.time_limit: 'soon' is not a duration"),
    ("stack: x\nstages:\n  throughput:\n    recipes: [a]\n    gate: {baselines: {b: {4: 10}}}\n",
     r"p.yaml:5:\d+: stages.throughput.gate.baselines.b: baseline for a recipe this stage does not run"),
    ("stack: x\nstages:\n  accuracy:\n    recipes: [a]\n    gate: {}\n    extra: 1\n",
     r"p.yaml:6:5: stages.accuracy.extra: unknown field"),
    ("stack: x\nretry: {retry_on: [COMPLETED]}\nstages: {throughput: {recipes: [a]}}\n",
     r"p.yaml:2:\d+: retry.retry_on\[0\]: 'COMPLETED' is not a retryable end state"),
    ("stages: {throughput: {recipes: [a]}}\n", r"p.yaml:1:1: stack: required"),
])
def test_errors_name_file_line_and_field(tmp_path, text, where):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=where):
        load_pipeline(f, tmp_path)


def test_durations():
    assert [parse_duration(x) for x in (90, "90s", "30m", "2h", "01:30:00", "05:00")] == [90, 90, 1800, 7200, 5400, 300]
