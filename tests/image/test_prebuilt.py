"""The prebuilt layer: the stack names, per platform, the GPUs its modules are compiled for; a stack that
forgets a platform is refused before anything is built, and the compile is cached by what it depends on."""


import pytest

from fixtures.paths import ROOT
from servestack.errors import InputErrors, ServestackError
from servestack.image import prebuilt
from servestack.lock import load_lock
from servestack.records.stack import load_stack
from servestack.util.project import Project

STACK = """\
name: tiny
platforms: [linux/amd64, linux/arm64]
python: "3.11"
base:
  image: 127.0.0.1:5000/base:1
packages:
  - name: tinyserve
    version: 1.0.0
gpu_node:
  capabilities: [compute]
  prebuilt:
    modules: [flashinfer.jit.sampling:gen_sampling_module]
    archs:
      linux/amd64: ["9.0a", "10.0a"]
smoke_model:
  name: tiny
  make: {seed: 0}
"""


def test_a_platform_without_target_gpus_is_refused_naming_the_field_and_the_platform(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(STACK)
    with pytest.raises(InputErrors) as info:
        load_stack(path)
    (message,) = [str(e) for e in info.value.errors]
    assert "gpu_node.prebuilt.archs names no target GPUs for linux/arm64" in message
    assert str(path) in message


def test_an_arch_that_is_not_a_cuda_arch_list_word_is_refused(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(STACK.replace('linux/amd64: ["9.0a", "10.0a"]', 'linux/amd64: ["sm_90a"]\n      linux/arm64: ["10.0a"]'))
    with pytest.raises(InputErrors) as info:
        load_stack(path)
    assert any("prebuilt.archs" in str(e) and "sm_90a" in str(e) for e in info.value.errors)


def test_the_production_stack_prebuilds_the_sampler_for_hopper_and_blackwell_on_x86_and_blackwell_on_grace():
    lock = load_lock(Project(root=ROOT), "qwen35-gb200")
    assert prebuilt.targets(lock, "linux/amd64") == ("9.0a 10.0a", ["flashinfer.jit.sampling:gen_sampling_module"])
    assert prebuilt.targets(lock, "linux/arm64") == ("10.0a", ["flashinfer.jit.sampling:gen_sampling_module"])


def test_the_cpu_stack_prebuilds_nothing():
    assert prebuilt.targets(load_lock(Project(root=ROOT), "dev-cpu"), "linux/amd64") is None


def test_a_lock_without_the_platform_s_targets_is_refused_by_the_build():
    lock = load_lock(Project(root=ROOT), "qwen35-gb200")
    gpu_node = {**lock.gpu_node, "prebuilt": {**lock.gpu_node["prebuilt"], "archs": {"linux/amd64": ["9.0a"]}}}
    broken = type(lock)(**{**lock.__dict__, "gpu_node": gpu_node})
    with pytest.raises(ServestackError, match="gpu_node.prebuilt.archs has no entry for linux/arm64"):
        prebuilt.targets(broken, "linux/arm64")


def test_the_compile_is_keyed_by_the_image_below_the_targets_the_modules_and_the_script():
    base = prebuilt.cache_key("sha256:" + "a" * 64, "9.0a 10.0a", ["m:g"])
    assert base == prebuilt.cache_key("sha256:" + "a" * 64, "9.0a 10.0a", ["m:g"])
    assert len({base, prebuilt.cache_key("sha256:" + "b" * 64, "9.0a 10.0a", ["m:g"]),
                prebuilt.cache_key("sha256:" + "a" * 64, "10.0a", ["m:g"]),
                prebuilt.cache_key("sha256:" + "a" * 64, "9.0a 10.0a", ["m:h"])}) == 4


@pytest.mark.parametrize(("version", "refused"), [("7.2.22 (Debian 1:7.2+dfsg-7+deb12u18)", True),
                                                  ("10.0.13 (Debian 1:10.0.13+ds-0+deb13u1)", False)])
def test_a_foreign_platform_s_compile_is_refused_up_front_under_a_qemu_that_crashes_in_torch(monkeypatch, version, refused):
    class Answer:
        stdout = f"qemu-aarch64 version {version}\nCopyright (c) 2003-2025 Fabrice Bellard and the QEMU Project developers\n"

    monkeypatch.setattr(prebuilt, "_binfmt_entry", lambda: "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    monkeypatch.setattr(prebuilt, "run", lambda argv, timeout: Answer())
    refusal = prebuilt._emulator_refusal("linux/arm64")
    assert (refusal is not None) == refused
    if refused:
        assert "qemu 7.2.22" in refusal and "qemu-user 10 or newer" in refusal and "on a linux/arm64 machine" in refusal
