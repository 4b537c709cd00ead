"""The one YAML reader: positions, typed keys, duplicate keys, anchors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.errors import InputError
from servestack.util import yamlfile


def test_document_and_nodes_are_one_parse(tmp_path: Path):
    f = tmp_path / "doc.yaml"
    f.write_text("base: &b\n  x: 1\ngate:\n  baselines: {agg: {1: 100.0}}\nitems:\n  - <<: *b\n    y: [a, b]\n")
    doc = yamlfile.load(f)
    assert doc.data == {"base": {"x": 1}, "gate": {"baselines": {"agg": {1: 100.0}}}, "items": [{"x": 1, "y": ["a", "b"]}]}
    assert str(doc.location(("gate", "baselines", "agg", 1))) == f"{f}:4:{len('  baselines: {agg: {') + 1}"
    assert str(doc.location(("items", 0, "y"))) == f"{f}:7:5"
    assert str(doc.location(("items", 0, "nope"))) == f"{f}:6:5"  # the nearest known parent
    root = yamlfile.load_nodes(f)
    assert root.plain() == doc.data
    y = root.get("items").value[0].get("y")
    assert (y.line, y.column, y.key_line, y.key_column) == (7, 8, 7, 5)


def test_duplicate_keys_and_bad_yaml_are_errors_at_their_position(tmp_path: Path):
    f = tmp_path / "dup.yaml"
    f.write_text("stack: a\nstack: b\n")
    with pytest.raises(InputError) as info:
        yamlfile.load(f)
    assert (info.value.location.line, info.value.location.column, info.value.field) == (2, 1, "stack")
    f.write_text("a: [1\n")
    with pytest.raises(InputError, match="not valid YAML") as info:
        yamlfile.load(f)
    assert info.value.location.line is not None
    f.write_text("")
    assert yamlfile.load(f).data is None
    with pytest.raises(InputError, match="empty"):
        yamlfile.load_nodes(f)


def test_a_key_written_beside_a_merge_overrides_the_merged_one(tmp_path: Path):
    """YAML's merge key: `<<: *anchor` brings the anchor's keys in and a key written beside it wins
    (a family reuses a config's settings and changes its resources); two written keys still clash."""
    f = tmp_path / "merge.yaml"
    f.write_text("one: &one\n  resources: {nodes: 1}\n  frontend: dynamo\n"
                 "two:\n  <<: *one\n  resources: {nodes: 3}\n")
    doc = yamlfile.load(f)
    assert doc.data["two"] == {"frontend": "dynamo", "resources": {"nodes": 3}}
    assert str(doc.location(("two", "resources"))) == f"{f}:6:3"  # the written one
    # Reached again through an alias (a config merging the config that holds the override).
    f.write_text("one: &one\n  env: &env {a: 1, b: 1}\n  other:\n    <<: *env\n    a: 2\n"
                 "three:\n  <<: *one\n")
    assert yamlfile.load(f).data["three"] == {"env": {"a": 1, "b": 1}, "other": {"a": 2, "b": 1}}
    f.write_text("one: &one\n  a: 1\ntwo:\n  <<: *one\n  a: 2\n  a: 3\n")
    with pytest.raises(InputError) as info:
        yamlfile.load(f)
    assert (info.value.location.line, info.value.field) == (6, "a")


# ---------------------------------------------------------------- one base, one "exactly one of"

PACKAGE = ROOT / "src" / "servestack"


def test_every_user_file_model_stands_on_the_one_base():
    """Only `yamlfile.UserModel` derives from pydantic's BaseModel: every user file (stack, pipeline and
    its runners' sections, image plan) then refuses an unknown key and is frozen once read, alike."""
    direct = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", "")) == "BaseModel"
                                                      for b in node.bases):
                direct.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert direct == ["util/yamlfile.py:UserModel"]


def test_exactly_one_is_said_the_same_way_in_every_user_file(tmp_path: Path):
    from servestack.errors import InputErrors
    from servestack.records.stack import load_stack
    from servestack.stages.pipeline import load_pipeline

    stack = tmp_path / "s.yaml"
    stack.write_text("name: s\nplatforms: [linux/amd64]\npython: '3.11'\nbase: {}\n"
                     "packages: [{name: a, version: '1'}]\nsmoke_model: {name: m, make: {seed: 0}}\n")
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("stack: s\nstages: {accuracy: {recipes: [a], gate: {}}}\n")
    said = []
    for load, file in ((load_stack, stack), (lambda f: load_pipeline(f, tmp_path), pipeline)):
        with pytest.raises(InputErrors) as info:
            load(file)
        said += [e.problem for e in info.value.errors]
    assert said == ["give exactly one of `image` (a registry reference) or `debian` (a base built here)",
                    "give exactly one of `threshold` (GSM8K) or `agreement_with` (the oracle's reference recipe)"]


def test_no_module_words_its_own_exactly_one_check():
    """The sentence lives in `yamlfile.exactly_one`; a validator names only the choices."""
    worded = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in PACKAGE.rglob("*.py") if path.name != "yamlfile.py"
              for node in ast.walk(ast.parse(path.read_text(), str(path)))
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and "exactly one of" in node.value]
    assert worded == []
