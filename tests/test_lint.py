"""`nox -s lint` is a gate: with the project's own configuration, ruff fails an unused import and mypy a
type error, and both pass the same module once it is right. (The tree itself is linted by the session.)"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

CLEAN = '''"""A module as the house writes one."""

from pathlib import Path


def size(path: Path) -> int:
    return path.stat().st_size
'''


def _tool(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = BIN / name
    if not tool.exists():
        pytest.fail(f"{name} is not in {BIN}: it comes with the lint extra (pyproject.toml), which the test extra includes")
    return subprocess.run([str(tool), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _ruff(module: Path) -> subprocess.CompletedProcess[str]:
    return _tool("ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(module), cwd=module.parent)


def _mypy(module: Path) -> subprocess.CompletedProcess[str]:
    return _tool("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", str(module), cwd=module.parent)


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "sample.py"
    path.write_text(CLEAN)
    return path


def test_a_right_module_passes_both(module: Path):
    assert _ruff(module).returncode == 0, _ruff(module).stdout
    assert _mypy(module).returncode == 0, _mypy(module).stdout


def test_an_unused_import_fails_ruff(module: Path):
    module.write_text(CLEAN.replace("from pathlib import Path\n", "import json\nfrom pathlib import Path\n"))
    result = _ruff(module)
    assert result.returncode == 1 and "F401" in result.stdout and "json" in result.stdout, result.stdout


def test_a_type_error_fails_mypy(module: Path):
    module.write_text(CLEAN.replace("return path.stat().st_size", "return path.name"))
    result = _mypy(module)
    assert result.returncode == 1 and "[return-value]" in result.stdout, result.stdout


def test_an_unannotated_function_fails_mypy(module: Path):
    module.write_text(CLEAN + "\n\ndef half(n):\n    return n / 2\n")
    result = _mypy(module)
    assert result.returncode == 1 and "[no-untyped-def]" in result.stdout, result.stdout
