"""The static probe's FlashInfer checks without the image: the fat binary parser on nvcc's own output
(tests/fixtures/fatbin, made by its make.py), the prebuilt-module check's logic over a FlashInfer
that answers as told, the stub check over a tree made here, and the link check's reading of
FlashInfer's build.ninja and ld's messages as they came from the real image. The checks run for real
inside the production image in test_gpu_node_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.probe.static import prebuilt
from servestack.probe.static.fatbin import cubin_problem, elf_section, fatbin_entries, parse_fatbin, sm_of
from servestack.probe.static.flashinfer_jit import _ninja_variable, arch_word, check_cuda_stub, linker_lines, run_child

FIXTURES = ROOT / "tests" / "fixtures" / "fatbin"
HAS_CC = pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler on this host")
ARCHS = {"linux/amd64": ["9.0a", "10.0a"], "linux/arm64": ["10.0a"]}


# --------------------------------------------------------------------------- the fat binary parser

def test_a_module_of_two_units_carries_one_compressed_cubin_per_architecture_in_each():
    entries = fatbin_entries(str(FIXTURES / "sm90a-sm100a.so"))
    assert [(e.kind, e.arch, e.compressed) for e in entries] == [("elf", "sm_90a", True), ("elf", "sm_100a", True)] * 2
    assert all(e.payload[:4] == b"\x28\xb5\x2f\xfd" and cubin_problem(e) is None for e in entries)


def test_suffixes_ptx_and_uncompressed_cubins_are_told_apart():
    entries = fatbin_entries(str(FIXTURES / "mixed.o"))
    assert [(e.kind, e.arch) for e in entries] == [("elf", "sm_90"), ("elf", "sm_100f"), ("ptx", "compute_100a"),
                                                   ("elf", "sm_90a")]
    plain = [e for e in entries if e.kind == "elf" and not e.compressed]
    assert plain and all(e.payload[:4] == b"\x7fELF" and cubin_problem(e) is None for e in plain)


def test_a_payload_that_is_not_a_cuda_elf_is_named():
    entry = next(e for e in fatbin_entries(str(FIXTURES / "mixed.o")) if e.arch == "sm_90a")
    host = type(entry)(kind="elf", arch="sm_90a", flags=entry.flags, payload=entry.payload[:18] + b"\x3e\x00",
                       offset=entry.offset)
    assert "machine 62, not CUDA" in cubin_problem(host)


def test_a_truncated_or_foreign_fat_binary_is_an_error_naming_the_offset():
    section = elf_section((FIXTURES / "sm100a.so").read_bytes(), ".nv_fatbin")
    with pytest.raises(ValueError, match="malformed fat binary"):
        parse_fatbin(section[:-100])
    with pytest.raises(ValueError, match="no fat binary at offset 0x0"):
        parse_fatbin(b"\x7fELF" + section[4:])
    assert elf_section((FIXTURES / "sm100a.so").read_bytes(), ".no_such_section") is None


@pytest.mark.parametrize("word, arch", [("9.0a", "sm_90a"), ("10.0a", "sm_100a"), ("12.0f", "sm_120f"), ("8.9", "sm_89")])
def test_flashinfer_s_architecture_words_in_nvcc_s_spelling(word, arch):
    assert sm_of(word) == arch


def test_the_stack_s_cuda_arch_as_flashinfer_s_word():
    assert arch_word("sm_100a") == "10.0a" and arch_word("sm_90a") == "9.0a" and arch_word("sm_89") == "8.9"
    with pytest.raises(ValueError):
        sm_of("sm_100a")


def test_a_module_without_one_target_s_cubin_is_named_with_what_it_carries():
    problems, carried = prebuilt.architecture_problems(str(FIXTURES / "sm100a.so"), ARCHS["linux/amd64"])
    assert problems == ["no sm_90a cubin"] and carried == ["sm_100a"]
    assert prebuilt.architecture_problems(str(FIXTURES / "sm90a-sm100a.so"), ARCHS["linux/amd64"]) == \
        ([], ["sm_100a", "sm_90a"])


# --------------------------------------------------------------------------- the prebuilt-module check

def fake_flashinfer(monkeypatch, site: Path, so: Path | None, *, aot: bool = True, resolved: Path | None = None) -> str:
    """A generator module whose spec answers as FlashInfer 0.7's JitSpecNvcc does for module `sampling`."""
    target = site / "flashinfer" / "data" / "aot" / "sampling" / "sampling.so"
    if so is not None:
        target.parent.mkdir(parents=True)
        shutil.copy(so, target)
    path = resolved or target
    spec = types.SimpleNamespace(name="sampling", is_aot=aot, aot_path=path, get_library_path=lambda: path,
                                 aot_artifacts=[types.SimpleNamespace(path=path)] if aot else [])
    module = types.ModuleType("fake_flashinfer_sampling")
    module.gen_sampling_module = lambda: spec
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return f"{module.__name__}:gen_sampling_module"


def run_prebuilt(site: Path, entry: str, platform: str = "linux/amd64", loads: dict | None = None) -> list[dict]:
    config = {"site_packages": str(site), "platform": platform,
              "gpu_node": {"prebuilt": {"modules": [entry], "archs": ARCHS}}}
    asked = []

    def load(entries, timeout):
        asked.extend(entries)
        return {e: (loads or {}).get(e, {"ok": True}) for e in entries}, "after torch with the stub as libcuda.so.1"
    checks = prebuilt.check_prebuilt(config, load=load)
    assert asked == ([entry] if (site / "flashinfer/data/aot/sampling/sampling.so").exists() else [])
    return checks


def test_a_prebuilt_module_with_every_target_passes(tmp_path, monkeypatch):
    entry = fake_flashinfer(monkeypatch, tmp_path, FIXTURES / "sm90a-sm100a.so")
    [c] = run_prebuilt(tmp_path, entry)
    assert c["name"] == "gpu-node:prebuilt:sampling" and c["status"] == "pass", c["detail"]
    assert "cubins for sm_90a, sm_100a (linux/amd64" in c["detail"]


def test_the_arm64_copy_needs_only_sm100a_and_the_amd64_copy_fails_naming_module_and_arch(tmp_path, monkeypatch):
    entry = fake_flashinfer(monkeypatch, tmp_path, FIXTURES / "sm100a.so")
    [arm] = run_prebuilt(tmp_path, entry, platform="linux/arm64")
    assert arm["status"] == "pass", arm["detail"]
    [amd] = run_prebuilt(tmp_path, entry)
    assert amd["status"] == "fail" and "sampling (" in amd["detail"]
    assert "no sm_90a cubin for linux/amd64" in amd["detail"]


def test_a_module_flashinfer_would_compile_at_start_fails(tmp_path, monkeypatch):
    entry = fake_flashinfer(monkeypatch, tmp_path, None, aot=False)
    [c] = run_prebuilt(tmp_path, entry)
    assert c["status"] == "fail" and "spec.is_aot is false" in c["detail"] and "does not exist" in c["detail"]


def test_a_module_flashinfer_resolves_elsewhere_fails(tmp_path, monkeypatch):
    elsewhere = tmp_path / "flashinfer_jit_cache" / "sampling.so"
    entry = fake_flashinfer(monkeypatch, tmp_path, FIXTURES / "sm90a-sm100a.so", resolved=elsewhere)
    [c] = run_prebuilt(tmp_path, entry)
    assert c["status"] == "fail" and f"resolves sampling to ['{elsewhere}']" in c["detail"]


def test_a_module_that_does_not_load_fails_with_the_loader_s_message(tmp_path, monkeypatch):
    entry = fake_flashinfer(monkeypatch, tmp_path, FIXTURES / "sm90a-sm100a.so")
    [c] = run_prebuilt(tmp_path, entry, loads={entry: {"ok": False, "why": "OSError: libcuda.so.1: cannot open"}})
    assert c["status"] == "fail" and "does not load after torch" in c["detail"] and "libcuda.so.1" in c["detail"]


def test_a_generator_that_is_gone_and_a_platform_without_architectures_fail(tmp_path):
    config = {"site_packages": str(tmp_path), "platform": "linux/amd64",
              "gpu_node": {"prebuilt": {"modules": ["fake_flashinfer_gone:gen_nothing"], "archs": ARCHS}}}
    [gone] = prebuilt.check_prebuilt(config, load=lambda e, t: ({}, ""))
    assert gone["status"] == "fail" and "its generator does not answer" in gone["detail"]
    [none] = prebuilt.check_prebuilt({**config, "platform": "linux/riscv64"}, load=lambda e, t: ({}, ""))
    assert none["status"] == "fail" and "no architectures for linux/riscv64" in none["detail"]
    assert prebuilt.check_prebuilt({"gpu_node": {}}) == []


# --------------------------------------------------------------------------- the stub and the link

def make_stub(path: Path, soname: str, answer: int = 34) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / "stub.c"
    source.write_text("".join(f"int {name}(void) {{ return {answer}; }}\n"
                              for name in ("cuInit", "cuDriverGetVersion", "cuDeviceGetCount")))
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(source)], check=True)


@HAS_CC
def test_the_stub_links_as_the_driver_answers_every_call_with_an_error_and_stays_off_the_loader_s_path(tmp_path, monkeypatch):
    home = tmp_path / "cu13"
    (home / "lib").mkdir(parents=True)
    (home / "lib64").symlink_to("lib")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert "no lib64/stubs/libcuda.so" in check_cuda_stub({}, directories=lambda h: [])["detail"]
    make_stub(home / "lib" / "stubs" / "libcuda.so", "libcuda.so")
    wrong = check_cuda_stub({}, directories=lambda h: [])
    assert wrong["status"] == "fail" and "SONAME 'libcuda.so', not libcuda.so.1" in wrong["detail"]
    make_stub(home / "lib" / "stubs" / "libcuda.so", "libcuda.so.1", answer=0)
    success = check_cuda_stub({}, directories=lambda h: [])
    assert success["status"] == "fail" and "cuDeviceGetCount, cuDriverGetVersion, cuInit with 0 (CUDA_SUCCESS)" in \
        success["detail"]
    make_stub(home / "lib" / "stubs" / "libcuda.so", "libcuda.so.1")
    passed = check_cuda_stub({}, directories=lambda h: [str(home / "lib")])
    assert passed["status"] == "pass" and "cuInit 34" in passed["detail"], passed["detail"]
    (tmp_path / "system").mkdir()
    os.symlink(home / "lib" / "stubs" / "libcuda.so", tmp_path / "system" / "libcuda.so.1")
    shadow = check_cuda_stub({}, directories=lambda h: [str(tmp_path / "system")])
    assert shadow["status"] == "fail" and str(tmp_path / "system" / "libcuda.so.1") in shadow["detail"]
    itself = check_cuda_stub({}, directories=lambda h: [str(home / "lib64" / "stubs")])
    assert itself["status"] == "fail" and "the stubs directory itself" in itself["detail"]


# FlashInfer 0.7.0.post1's build.ninja and ninja's failure, as they came from the production image (sha256:7357dcb1…).
NINJA = """cuda_arch_flags = -gencode=arch=compute_100a,code=sm_100a
ldflags = -shared $
    -L$cuda_home/lib64 $
    -L$cuda_home/lib64/stubs $
    -lcudart $
    -lcuda

rule compile
"""
FAILED = """RuntimeError: Ninja build failed. Ninja output:
ninja: Entering directory `/tmp/probe-jit-link-x/workspace/.cache/flashinfer/0.7.0.post1/100a/cached_ops/servestack_link_probe'
[1/2] /opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc --generate-dependencies-with-compile -c x.cu -o x.cuda.o
[2/2] c++ x.cuda.o -shared -L/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib64 -lcudart -lcuda -o x.so
FAILED: x.so
/usr/bin/ld: cannot find -lcudart: No such file or directory
/usr/bin/ld: cannot find -lcuda: No such file or directory
collect2: error: ld returned 1 exit status
ninja: build stopped: subcommand failed.
"""


def test_the_link_check_reads_flashinfer_s_ldflags_and_keeps_the_linker_s_own_words():
    assert _ninja_variable(NINJA, "ldflags") == "-shared -L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda"
    assert linker_lines(FAILED) == ["/usr/bin/ld: cannot find -lcudart: No such file or directory",
                                    "/usr/bin/ld: cannot find -lcuda: No such file or directory",
                                    "collect2: error: ld returned 1 exit status"]


def test_a_child_interpreter_runs_a_function_of_the_probe_by_its_own_import_path():
    assert run_child(arch_word, ["sm_100a"], dict(os.environ), 120)[0] == "10.0a"
    result, said = run_child(arch_word, ["not-an-arch"], dict(os.environ), 120)
    assert result is None and "exit 1" in said and "ValueError: cuda_arch 'not-an-arch'" in said
