"""The production stack's image for this machine's platform, built from its lock and smoked natively.

In CI that is the linux/amd64 image (the x86 twin of GB200's arm64 one): its static probe asks each
kernel vLLM would pick on SM90 and SM100 about the GPU-shaped smoke model's shapes and the
checkpoint's, reads the native-library and import closures, builds a cubin with the image's own
nvcc, and checks that compiler against the CUDA runtime beside it; FlashInfer's own JIT compiles
and links a module, and the sampler FlashInfer would compile at start is prebuilt for SM90 and SM100. Without a GPU the serving
probes are `not run`, never passed. The lent H200 served this image's files (the record is in
benchmarks/results/h200-canary.md).
"""

from __future__ import annotations

import pytest

from servestack import smoke

pytestmark = pytest.mark.e2e

STACK = "qwen35-gb200"


@pytest.fixture(scope="module", autouse=True)
def _unpacked_only_while_needed(production_image):
    """The production image unpacked is ~14 GB of the CI machine's disk: gone once this module is done."""
    yield
    import docker.errors

    from servestack import services

    prebuilt = production_image["record"].prebuilt or {}
    for reference in (production_image["reference"], prebuilt.get("built_in")):
        try:
            if reference:
                services.docker_client().images.remove(reference, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_the_production_image_reproduces_its_digest_and_its_static_probe_passes_natively(production_image):
    record = production_image["record"]
    assert record.expected is not None and record.expected.status == "reproduced", record.expected

    result = smoke.run_smoke(production_image["project"], STACK)
    checks = {f"{c.probe}/{c.name}": c for c in result.record.checks}
    failed = {name: c.detail[:400] for name, c in checks.items() if c.status == "fail"}
    assert not failed, failed
    for name in ("static/kernels:gdn-prefill:SM90:tiny-qwen35", "static/kernels:gdn-prefill:SM100:tiny-qwen35",
                 "static/kernels:gdn-prefill:SM90:Qwen3.5-397B-A17B-NVFP4",
                 "static/kernels:attention:SM90:Qwen3.5-397B-A17B-NVFP4",
                 "static/gpu-node:cuda-release", "static/gpu-node:cuda-compiler", "static/gpu-node:nixl-capi",
                 "static/gpu-node:cuda-stub", "static/gpu-node:jit-link", "static/gpu-node:prebuilt:sampling"):
        assert checks[name].status == "pass", (name, checks[name].detail)
    serving = [c for c in result.record.checks if c.probe in ("serving", "disagg")]
    assert serving and all(c.status == "not_run" for c in serving)
    assert "needs NVIDIA GPUs" in checks["serving/ready"].detail
