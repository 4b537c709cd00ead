"""The GDN backend check against vLLM's real resolver, in the dev-cpu image (its file-level checks,
torch's CUDA and the cu13 CUTLASS DSL, are test_probe_evidence.py's)."""

from __future__ import annotations

import json
import subprocess

import pytest

from fixtures.paths import ROOT
from servestack import lock, services
from servestack.smoke.checklist import probe_config
from servestack.smoke.static import run_static_probe
from servestack.util.fsutil import sha256_file
from servestack.util.project import Project


@pytest.mark.e2e
def test_the_gdn_check_catches_a_torch_without_cuda_13_in_a_real_image() -> None:
    """dev-cpu's image has vLLM with the real GDN resolver and a CPU torch: asked about an SM100
    device with qwen35-gb200's fast path, vLLM itself must answer Triton, and the probe must fail."""
    project = Project(root=ROOT)
    if not (ROOT / "build/dev-cpu/image.json").exists():
        subprocess.run(["nox", "-s", "build", "image"], cwd=ROOT, check=True, timeout=3600)
    reference = json.loads((ROOT / "build/dev-cpu/image.json").read_text())["reference"]
    config = probe_config(project, "dev-cpu", lock.load_lock(project, "dev-cpu"), "linux/amd64",
                          sha256_file(project.lock_file("dev-cpu")))
    config = {**config, "modules": [], "engine": None, "entry_points": [],
              "fast_path": lock.load_lock(project, "qwen35-gb200").fast_path}
    checks = {c.name: c for c in run_static_probe(services.docker_client(), reference, "linux/amd64", config, stack="dev-cpu")}
    gdn = checks["fast-path:gdn-prefill"]
    assert gdn.status == "fail" and "chooses triton; the stack requires flashinfer" in gdn.detail
    assert "simulated SM100 device (head_k_dim 128, CUDA runtime major 0" in gdn.detail
    assert checks["fast-path:torch-cuda"].status == "fail"
