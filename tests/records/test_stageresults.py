"""records/stageresults.py: a stage's results.json read back is the record that wrote it, byte for
byte, and a broken one is named by its field where compare reads it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures.paths import DATA as TEST_DATA
from servestack import compare
from servestack.errors import InputError
from servestack.records.fields import Fields
from servestack.records.stageresults import AccuracyRun, Check, Failure, StageResult, Verdict
from servestack.stages.results import parse_vllm_result

DATA = TEST_DATA / "dev-cpu"


def _result(tmp_path: Path) -> StageResult:
    point = parse_vllm_result(DATA / "4.json", recipe="agg", gpus=1, concurrency=4)
    verdict = Verdict(stage="throughput",
                      failures=[Failure(gate="missing", recipe="agg", point="c=16", message="no result for this point")],
                      checks=[Check(gate="throughput", recipe="agg", point="c=4", measured=12.5, required=10.0, passed=True)])
    return StageResult(stack="dev-cpu", pipeline="dev-cpu", stage="throughput", image="img@sha256:" + "0" * 64,
                       runner="local", out_dir=tmp_path, throughput=[replace(point, repeat=1), point],
                       accuracy=[AccuracyRun(recipe="agg", repeat=0, accuracy=0.5, n=2, seconds=None)],
                       agreement=[{"recipe": "disagg", "reference": "agg", "rows": []}], missing=["agg/16"],
                       verdict=verdict, jobs=[{"job_id": "1", "runner": "local"}], timing={"wall_seconds": 1.0},
                       conditions={"agg": {"isl": 128}}, comparison="comparison.md")


def test_results_json_read_back_writes_the_same_bytes(tmp_path):
    written = json.dumps(_result(tmp_path).to_json(), sort_keys=True)
    again = StageResult.from_json(Fields(json.loads(written), "results.json"), out_dir=tmp_path)
    assert json.dumps(again.to_json(), sort_keys=True) == written
    assert again.verdict is not None and not again.passed and again.verdict.checks[0].passed


def test_a_field_an_older_file_lacks_takes_its_declared_default(tmp_path):
    data = _result(tmp_path).to_json()
    for key in ("comparison", "conditions", "agreement"):
        del data[key]
    del data["throughput"][0]["repeat"]
    read = StageResult.from_json(Fields(data, "results.json"), out_dir=tmp_path)
    assert (read.comparison, read.conditions, read.agreement, read.throughput[0].repeat) == ("", {}, [], 0)


def test_a_point_without_a_required_field_is_named_where_compare_reads_it(tmp_path):
    data = _result(tmp_path).to_json()
    del data["throughput"][1]["completed"]
    with pytest.raises(InputError, match=r"stages\[0\]\.throughput\[1\]\.completed: missing"):
        compare.side_from_results({"stages": [data]}, "A", tmp_path / "results.json")
