"""A stack file says what a serving stack is; mistakes are reported with file, line, column and field."""

from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.errors import InputErrors
from servestack.records.stack import load_stack
from servestack.util.project import Project

VALID = """\
name: tiny
platforms: [linux/amd64]
python: "3.11"
base:
  image: 127.0.0.1:5000/base:1
packages:
  - name: tinyserve
    version: 1.0.0
    prs:
      - repo: example/tinyserve
        number: 2
smoke_model:
  name: tiny
  make: {seed: 0}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(InputErrors) as info:
        load_stack(path)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("name", ["dev-cpu", "qwen35-gb200"])
def test_the_committed_stacks_are_valid(name):
    stack = load_stack(Project(root=ROOT).stack_file(name))
    assert stack.name == name


def test_a_valid_stack_loads_into_typed_fields(tmp_path):
    stack = load_stack(write(tmp_path, VALID))
    assert stack.packages[0].prs[0].repo == "example/tinyserve"
    assert stack.packages[0].requirement == "tinyserve==1.0.0"


def test_a_misspelled_field_names_file_line_column_and_suggests_the_fix(tmp_path):
    path = write(tmp_path, VALID.replace("    version: 1.0.0", "    verison: 1.0.0"))
    (message,) = [m for m in errors_of(path) if "verison" in m]
    assert message.startswith(f"{path}:8:5: packages[0].verison: unknown field; did you mean `version`?")


def test_a_wrong_type_names_the_field_and_what_was_expected(tmp_path):
    path = write(tmp_path, VALID.replace("number: 2", "number: two"))
    (message,) = errors_of(path)
    assert message.startswith(f"{path}:11:9: packages[0].prs[0].number:")
    assert "integer" in message and "'two'" in message


def test_a_package_needs_a_version_or_a_git_commit(tmp_path):
    path = write(tmp_path, VALID.replace("    version: 1.0.0\n", ""))
    (message,) = errors_of(path)
    assert "packages[0]" in message and "exactly one of `version`" in message


def test_an_unknown_platform_is_refused(tmp_path):
    path = write(tmp_path, VALID.replace("linux/amd64", "linux/ppc64le"))
    (message,) = errors_of(path)
    assert message.startswith(f"{path}:2:") and "platforms[0]" in message and "linux/arm64" in message


def test_a_missing_required_field_is_named(tmp_path):
    path = write(tmp_path, VALID.replace('python: "3.11"\n', ""))
    assert any(m.endswith("python: required field is missing") for m in errors_of(path))


def test_an_exclusion_needs_a_written_reason(tmp_path):
    path = write(tmp_path, VALID + "exclude:\n  - name: aisimulate\n    reason: no\n")
    (message,) = errors_of(path)
    assert "exclude[0].reason" in message


@pytest.mark.parametrize(
    "evidence, expected",
    [
        ("{file: a.py}", "exactly one of `contains`"),
        ("{file: a.py, contains: x, pattern: y}", "exactly one of `contains`"),
        ("{contains: x}", "give exactly one of `file`"),
        ("{flag: --x, env: VLLM_X}", "give exactly one of `file`"),
        ("{file: a.py, pattern: '('}", "`pattern` is not a regular expression"),
        ("{attribute: no_colon}", "attribute"),
        ("{flag: gdn-prefill-backend}", "flag"),
    ],
)
def test_bad_pr_evidence_names_the_item_and_what_was_expected(tmp_path, evidence, expected):
    path = write(tmp_path, VALID.replace("        number: 2\n", f"        number: 2\n        evidence:\n          - {evidence}\n"))
    (message,) = errors_of(path)
    assert "packages[0].prs[0].evidence[0]" in message and expected in message


def test_the_resolution_date_is_an_utc_moment(tmp_path):
    path = write(tmp_path, VALID.replace('python: "3.11"\n', 'python: "3.11"\nresolved_at: "2026-11-30"\n'))
    (message,) = errors_of(path)
    assert "resolved_at" in message


def test_a_package_index_must_be_defined(tmp_path):
    path = write(tmp_path, VALID.replace("    version: 1.0.0\n", "    version: 1.0.0\n    index: pytorch-cpu\n"))
    (message,) = errors_of(path)
    assert "names index 'pytorch-cpu'" in message and "['pypi']" in message


def test_a_fast_path_load_names_a_module(tmp_path):
    path = write(tmp_path, VALID + "fast_path:\n  loads: {nixl-cu13: nixl-cu13}\n")
    (message,) = errors_of(path)
    assert "fast_path.loads" in message and "nixl-cu13" in message and "pattern" in message
