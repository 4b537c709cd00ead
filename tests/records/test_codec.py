"""A record's JSON derived from its one declaration (records.codec): written in declaration order, read back
equal, each quirk declared in the field's metadata, and a bad file named by file, field and expectation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from servestack.errors import InputError
from servestack.records.codec import Record, json_quirks, one_of
from servestack.records.fields import read_record, write_record


@dataclass(frozen=True, kw_only=True)
class Part(Record):
    name: str
    size: int | None = None


@dataclass(frozen=True, kw_only=True)
class Elsewhere(Record):
    digest: str


@dataclass(frozen=True, kw_only=True)
class Seen(Record):
    state: str | None
    files: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Sample(Record):
    kind: str = field(metadata=json_quirks(check=one_of("wheel", "image")))
    count: int
    ratio: float
    on: bool
    parts: tuple[Part, ...]
    by_name: dict[str, Part]
    per_platform: dict[str, tuple[Part, ...]]
    labels: tuple[str, ...]
    hashes: dict[str, str | None]
    data: dict[str, Any]
    origin: Part | Elsewhere = field(metadata=json_quirks(tags={"part": Part, "elsewhere": Elsewhere}))
    seen: Seen | None = field(default=None, metadata=json_quirks(inline=True))
    note: str | None = field(default=None, metadata=json_quirks(omit=True))
    aliases: tuple[str, ...] = field(default=(), metadata=json_quirks(omit=True, key="also_known_as"))
    file: str = field(default="", compare=False, metadata=json_quirks(written=False))


def _sample(**changes: Any) -> Sample:
    values: dict[str, Any] = {
        "kind": "wheel", "count": 3, "ratio": 0.5, "on": True, "parts": (Part(name="a", size=1), Part(name="b")),
        "by_name": {"z": Part(name="z"), "y": Part(name="y", size=2)},
        "per_platform": {"linux/amd64": (Part(name="c"),)}, "labels": ("x", "y"),
        "hashes": {"f": "0" * 64, "gone": None}, "data": {"any": [1, {"thing": None}]},
        "origin": Elsewhere(digest="sha256:" + "1" * 64), "seen": Seen(state="merged", files=("a.py",)),
        "note": "kept", "aliases": ("other",)}
    return Sample(**{**values, **changes})


def _read(path: Path) -> Sample:
    return read_record(path, Sample.from_json, "")


def test_a_record_is_written_in_declaration_order_with_its_quirks_and_read_back_equal(tmp_path):
    sample = _sample(file="where it was read")
    document = sample.to_json()
    assert list(document) == ["kind", "count", "ratio", "on", "parts", "by_name", "per_platform", "labels", "hashes",
                              "data", "origin", "state", "files", "note", "also_known_as"]
    assert document["parts"] == [{"name": "a", "size": 1}, {"name": "b", "size": None}]
    assert document["per_platform"] == {"linux/amd64": [{"name": "c", "size": None}]}
    assert document["origin"] == {"elsewhere": {"digest": "sha256:" + "1" * 64}}
    assert (document["state"], document["files"], document["also_known_as"]) == ("merged", ["a.py"], ["other"])
    path = tmp_path / "sample.json"
    write_record(path, document)
    again = _read(path)
    assert again == sample and again.origin == Elsewhere(digest="sha256:" + "1" * 64)
    written = path.read_bytes()
    write_record(path, again.to_json())
    assert path.read_bytes() == written


def test_a_field_at_its_default_is_left_out_when_declared_so_and_read_back_as_the_default(tmp_path):
    sample = _sample(seen=None, note=None, aliases=(), origin=Part(name="p"))
    document = sample.to_json()
    assert not {"state", "files", "note", "also_known_as"} & set(document)
    assert document["origin"] == {"part": {"name": "p", "size": None}}
    path = tmp_path / "sample.json"
    write_record(path, document)
    assert _read(path) == sample


@pytest.mark.parametrize("change, field, expected", [
    (lambda d: d.pop("count"), "count", "missing (expected an integer)"),
    (lambda d: d.update(on="yes"), "on", "expected true or false, found a string"),
    (lambda d: d["parts"][1].update(size="2"), "parts[1].size", "expected an integer or null, found a string"),
    (lambda d: d["per_platform"]["linux/amd64"][0].pop("name"), "per_platform.linux/amd64[0].name",
     "missing (expected a string)"),
    (lambda d: d["by_name"]["y"].update(colour="red"), "by_name.y.colour", "unknown field (expected one of: name, size)"),
    (lambda d: d.update(kind="sdist"), "kind", "expected one of wheel, image, found 'sdist'"),
    (lambda d: d.update(origin={"somewhere": {}}), "origin", "expected one of part, elsewhere as its one key"),
    (lambda d: d.update(files=[1]), "files", "expected a list of strings, found a list"),
    (lambda d: d.update(hashes={"f": 1}), "hashes", "expected an object of strings, found an object"),
    (lambda d: d.update(labels=None), "labels", "expected a list of strings, found null"),
])
def test_a_missing_or_ill_typed_field_is_named_with_its_file_and_what_was_expected(tmp_path, change, field, expected):
    document = json.loads(json.dumps(_sample().to_json()))
    change(document)
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError) as caught:
        _read(path)
    assert (str(caught.value.location), caught.value.field, caught.value.problem) == (str(path), field, expected)
