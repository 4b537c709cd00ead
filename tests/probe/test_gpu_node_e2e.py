"""The GPU-node checks on the real qwen35-gb200 image: each passes on the image as built, and fails,
naming what is missing, on the same image with that one piece taken out.

A piece that is a file is taken out of a fixture image (the built image with the file removed,
committed, or with a command run: a link made, a prebuilt module's cubin for one architecture
relabelled in its .nv_fatbin); a piece that is the image's environment is taken out with `env -u`
in front of the check, as an image whose config lacks it would start. Each check runs inside the image, as the
smoke's static probe runs it: the probe package mounted read-only, the root read-only, no home,
a tmpfs on /tmp, no network. The image is this machine's platform's (conftest's production_image:
linux/amd64 in CI, natively), built from the lock once per session.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack import services
from servestack.lock import load_lock
from servestack.platforms import PLATFORMS, host_platform
from servestack.probe.static.run import section_environment
from servestack.services.dockerd import ensure_image
from servestack.smoke.checklist import VENV_PYTHON
from servestack.smoke.nvidia_hook import check_nvidia_hook
from servestack.smoke.static import NODE_HOME, PROBE_MOUNT, PROBE_PACKAGE, _emulated_arm64_cpus
from servestack.util.project import Project

pytestmark = pytest.mark.e2e

STACK = "qwen35-gb200"
SITE = "/opt/venv/lib/python3.11/site-packages"
CUDA_BIN = f"{SITE}/nvidia/cu13/bin"


@pytest.fixture(scope="module")
def gb200(production_image):
    reference, platform = production_image["reference"], production_image["platform"]
    client = services.docker_client()
    ensure_image(client, reference, platform)
    lock = load_lock(Project(root=ROOT), STACK)
    config = {"gpu_node": lock.gpu_node, "unavailable": [u.to_json() for u in lock.unavailable]}
    derived = []
    yield {"client": client, "reference": reference, "config": config, "image_env": _image_env(client, reference),
           "derived": derived, "platform": platform, "multiarch": f"{PLATFORMS[platform].machine}-linux-gnu"}
    for image in derived:
        client.images.remove(image, force=True)
    # The production image unpacked is ~14 GB of the CI machine's disk: gone once this module is done.
    client.images.remove(reference, force=True)


def _image_env(client, reference: str) -> list[str]:
    return (client.images.get(reference).attrs.get("Config") or {}).get("Env") or []


def without_files(gb200, *paths: str) -> str:
    """A fixture image: the built image with PATHS removed."""
    client = gb200["client"]
    container = client.containers.run(gb200["reference"], ["rm", "-f", *paths], detach=True, platform=gb200["platform"],
                                      network_disabled=True)
    try:
        assert container.wait(timeout=300)["StatusCode"] == 0
        image = container.commit(repository="servestack-test/gpu-node-fixture")
    finally:
        container.remove(force=True)
    gb200["derived"].append(image.id)
    return image.id


def run_check(gb200, function: str, *, image: str | None = None, unset: tuple[str, ...] = (),
              set_env: dict[str, str] | None = None, config: dict | None = None) -> dict:
    """One check of the probe's gpu_node section (`module:function`) inside IMAGE, as the smoke runs it."""
    client = gb200["client"]
    module, name = function.split(":")
    code = (f"import json, sys; sys.path.insert(0, {PROBE_MOUNT!r}); "
            f"from {PROBE_PACKAGE.name}.{module} import {name}; "
            f"print(json.dumps({name}(json.load(open({PROBE_MOUNT + '/config.json'!r})))))")
    config = config if config is not None else gb200["config"]
    told = {**section_environment("gpu_node", config), **(set_env or {})}  # as the probe's section is told
    env_args = ["env", *[f"--unset={v}" for v in unset], *[f"{k}={v}" for k, v in told.items()]]
    with tempfile.TemporaryDirectory(prefix="servestack-gpu-node-") as tmp:
        shutil.copytree(PROBE_PACKAGE, Path(tmp) / PROBE_PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        Path(tmp).chmod(0o755)
        volumes = {tmp: {"bind": PROBE_MOUNT, "mode": "ro"}}
        if gb200["platform"] == "linux/arm64" and host_platform() != "linux/arm64":
            volumes[_emulated_arm64_cpus(Path(tmp))] = {"bind": "/sys/devices/system/cpu", "mode": "ro"}
        container = client.containers.run(
            image or gb200["reference"], [*env_args, VENV_PYTHON, "-c", code], detach=True, platform=gb200["platform"],
            network_disabled=True, volumes=volumes, read_only=True, tmpfs={"/tmp": "rw,exec,nosuid,nodev,mode=1777"},
            environment={"HOME": NODE_HOME, "PYTHONDONTWRITEBYTECODE": "1"},
            cpu_shares=256)  # whatever else runs here comes first
        try:
            status = container.wait(timeout=1800)
            out = container.logs(stdout=True, stderr=False).decode(errors="replace").strip().splitlines()
            assert status["StatusCode"] == 0 and out, container.logs(tail=30).decode(errors="replace")
            return json.loads(out[-1])
        finally:
            container.remove(force=True)


def test_enroot_s_nvidia_hook_asks_for_compute_and_utility_and_nothing_without_the_image_s_nvidia_environment(gb200):
    env, gpu_node = gb200["image_env"], gb200["config"]["gpu_node"]
    passed = check_nvidia_hook(env, gpu_node)
    if not os.environ.get("SERVESTACK_VENDOR"):
        # A fresh clone has no vendored enroot: the check cannot run here, and says so instead of failing.
        assert passed.status == "not_run" and "SERVESTACK_VENDOR" in passed.detail, passed.detail
        return
    assert passed.status == "pass" and "--compute" in passed.detail and "--utility" in passed.detail
    for name in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA"):
        failed = check_nvidia_hook([v for v in env if not v.startswith(name + "=")], gpu_node)
        assert failed.status == "fail", name


def test_both_libibverbs_copies_find_the_mlx5_provider_and_each_fails_without_its_own(gb200):
    assert run_check(gb200, "gpu_node:check_verbs_providers")["status"] == "pass"
    bundled = run_check(gb200, "gpu_node:check_verbs_providers",
                        image=without_files(gb200, "/usr/lib64/libibverbs/libmlx5-rdmav34.so"))
    assert bundled["status"] == "fail" and "/usr/lib64/libibverbs/libmlx5-rdmav34.so, which is not in the image" in bundled["detail"]
    provider = f"/usr/lib/{gb200['multiarch']}/libibverbs/libmlx5-rdmav34.so"
    debian = run_check(gb200, "gpu_node:check_verbs_providers", image=without_files(gb200, provider))
    assert debian["status"] == "fail" and provider in debian["detail"]


def test_dynamo_finds_libnixl_capi_by_bare_name_only_with_the_image_s_loader_path(gb200):
    found = run_check(gb200, "gpu_node:check_nixl_capi")
    assert found["status"] == "pass" and ".nixl_cu13.mesonpy.libs/libnixl_capi.so" in found["detail"]
    lost = run_check(gb200, "gpu_node:check_nixl_capi", unset=("LD_LIBRARY_PATH",))
    assert lost["status"] == "fail" and "runs NIXL stubs" in lost["detail"]


def test_every_cache_is_writable_with_a_read_only_root_and_no_home_only_with_the_image_s_cache_settings(gb200):
    assert run_check(gb200, "gpu_caches:check_caches")["status"] == "pass"
    unset = ("XDG_CACHE_HOME", "TRITON_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT",
             "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH", "XDG_CONFIG_HOME")
    homeless = run_check(gb200, "gpu_caches:check_caches", unset=unset)
    assert homeless["status"] == "fail" and f"writes {NODE_HOME}/" in homeless["detail"]


def test_nvcc_builds_an_sm100a_cubin_of_its_runtime_s_release_and_without_it_vllm_leaves_flashinfer_s_kernels(gb200):
    assert run_check(gb200, "gpu_node:check_cuda_release")["status"] == "pass"
    assert run_check(gb200, "gpu_node:check_cuda_compiler")["status"] == "pass"
    assert run_check(gb200, "gpu_kernels:check_flashinfer_path")["status"] == "pass"
    no_nvcc = without_files(gb200, f"{CUDA_BIN}/nvcc")
    compiler = run_check(gb200, "gpu_node:check_cuda_compiler", image=no_nvcc)
    assert compiler["status"] == "fail" and "no nvcc" in compiler["detail"]
    path = run_check(gb200, "gpu_kernels:check_flashinfer_path", set_env={"PATH": "/opt/venv/bin:/usr/bin:/bin"})
    assert path["status"] == "fail" and "CUTLASS" in path["detail"]


def test_the_kernel_list_passes_only_where_the_lock_accepts_the_missing_prebuilt_kernels(gb200):
    listed = run_check(gb200, "gpu_kernels:check_kernels")
    assert listed["status"] == "pass"
    assert "gen_sampling_module" in listed["detail"] and "fused_moe_trtllm_sm100" in listed["detail"]
    unaccepted = run_check(gb200, "gpu_kernels:check_kernels", config={**gb200["config"], "unavailable": []})
    assert unaccepted["status"] == "fail" and "flashinfer-cubin and flashinfer-jit-cache not installed" in unaccepted["detail"]


# --------------------------------------------------------------------------- what FlashInfer compiles, links and loads

CUDA_HOME = f"{SITE}/nvidia/cu13"


def derived(gb200, *argv: str) -> str:
    """A fixture image: the built image after ARGV ran in it (as root, writable), committed."""
    client = gb200["client"]
    container = client.containers.run(gb200["reference"], list(argv), detach=True, platform=gb200["platform"],
                                      network_disabled=True)
    try:
        assert container.wait(timeout=300)["StatusCode"] == 0, container.logs(tail=20).decode(errors="replace")
        image = container.commit(repository="servestack-test/gpu-node-fixture")
    finally:
        container.remove(force=True)
    gb200["derived"].append(image.id)
    return image.id


def without_arch(gb200, path: str, arch: str) -> str:
    """A fixture image whose shared object PATH carries no ARCH cubin: each such entry of its .nv_fatbin
    relabelled sm_80 (its header's arch and suffix flag), the rest of the file as built."""
    import io
    import tarfile

    from servestack.probe.static.fatbin import FLAG_ARCH_SPECIFIC, FLAG_FAMILY, elf_section_range, parse_fatbin

    client = gb200["client"]
    container = client.containers.create(gb200["reference"], ["true"], platform=gb200["platform"])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            data = bytearray(tar.extractfile(member).read())
        offset, size = elf_section_range(bytes(data), ".nv_fatbin")
        entries = [e for e in parse_fatbin(bytes(data[offset:offset + size])) if e.kind == "elf" and e.arch == arch]
        assert entries, f"{path} has no {arch} cubin to take out"
        for entry in entries:
            at = offset + entry.offset
            data[at + 28:at + 32] = (80).to_bytes(4, "little")
            flags = int.from_bytes(data[at + 40:at + 48], "little") & ~(FLAG_ARCH_SPECIFIC | FLAG_FAMILY)
            data[at + 40:at + 48] = flags.to_bytes(8, "little")
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            member.size = len(data)
            tar.addfile(member, io.BytesIO(bytes(data)))
        assert container.put_archive(os.path.dirname(path), out.getvalue())
        image = container.commit(repository="servestack-test/gpu-node-fixture")
    finally:
        container.remove(force=True)
    gb200["derived"].append(image.id)
    return image.id


def test_flashinfer_s_own_jit_compiles_and_links_a_module_and_the_wheels_bare_layout_fails_with_the_linker_s_message(gb200):
    assert run_check(gb200, "flashinfer_jit:check_cuda_stub")["status"] == "pass"
    linked = run_check(gb200, "flashinfer_jit:check_jit_link")
    assert linked["status"] == "pass" and "needs libcudart.so.13 and libcuda.so.1" in linked["detail"], linked["detail"]
    # The CUDA 13 wheels as installed: lib/ with libcudart.so.13 only (today's image before issue 49).
    bare = without_files(gb200, f"{CUDA_HOME}/lib64", f"{CUDA_HOME}/lib/libcudart.so")
    failed = run_check(gb200, "flashinfer_jit:check_jit_link", image=bare)
    assert failed["status"] == "fail" and "cannot find -lcudart" in failed["detail"], failed["detail"]
    assert "cannot find -lcuda" in failed["detail"]
    no_stub = run_check(gb200, "flashinfer_jit:check_cuda_stub", image=bare)
    assert no_stub["status"] == "fail" and "no lib64/stubs/libcuda.so" in no_stub["detail"]


def test_a_libcuda_on_the_loader_s_path_fails_the_stub_check(gb200):
    shadow = f"/usr/lib/{gb200['multiarch']}/libcuda.so.1"
    on_path = derived(gb200, "ln", "-s", f"{CUDA_HOME}/lib/stubs/libcuda.so", shadow)
    found = run_check(gb200, "flashinfer_jit:check_cuda_stub", image=on_path)
    assert found["status"] == "fail" and shadow in found["detail"] and "CUDA_ERROR_STUB_LIBRARY" in found["detail"]
    stubs = run_check(gb200, "flashinfer_jit:check_cuda_stub", set_env={"LD_LIBRARY_PATH": f"{CUDA_HOME}/lib64/stubs"})
    assert stubs["status"] == "fail" and "the stubs directory itself" in stubs["detail"]


def test_every_prebuilt_module_is_what_flashinfer_loads_with_a_cubin_per_target_and_one_missing_fails_naming_it(gb200):
    prebuilt = gb200["config"]["gpu_node"].get("prebuilt")
    assert prebuilt, "the lock's gpu_node names no prebuilt modules (issue 49: the sampler is built into the image)"
    checks = run_check(gb200, "prebuilt:check_prebuilt")
    assert len(checks) == len(prebuilt["modules"]) and all(c["status"] == "pass" for c in checks), checks
    assert "gpu-node:prebuilt:sampling" in {c["name"] for c in checks}
    first = prebuilt["archs"][gb200["platform"]][0]
    arch = "sm_" + first.replace(".", "")
    sampling = f"{SITE}/flashinfer/data/aot/sampling/sampling.so"
    missing = run_check(gb200, "prebuilt:check_prebuilt", image=without_arch(gb200, sampling, arch))
    by_name = {c["name"]: c for c in missing}
    failed = by_name["gpu-node:prebuilt:sampling"]
    assert failed["status"] == "fail" and f"no {arch} cubin for {gb200['platform']}" in failed["detail"], failed["detail"]
    assert "flashinfer.jit.sampling:gen_sampling_module" in failed["detail"]
    # Without the file, FlashInfer would compile the module at start: the check says so, it does not fall back.
    gone = run_check(gb200, "prebuilt:check_prebuilt", image=without_files(gb200, sampling))
    failed = {c["name"]: c for c in gone}["gpu-node:prebuilt:sampling"]
    assert failed["status"] == "fail" and "spec.is_aot is false" in failed["detail"], failed["detail"]
