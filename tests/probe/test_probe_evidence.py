"""The static probe re-checks each PR's evidence and the stack's fast path against installed files.

The site is made of real wheels installed with pip (fixtures/fake_site.py). The GDN backend
resolver itself is vLLM's and needs vLLM installed: these tests cover the file-level checks
(torch's CUDA, the cu13 CUTLASS DSL); test_probe_evidence_e2e.py asks the real resolver in the dev-cpu image.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fixtures.fake_site import probe, site_with_torch, wheel

SERVER_EVIDENCE = [{"file": "beta_pkg/server.py", "contains": "return 'patched'"},
                   {"attribute": "beta_pkg.server:serve"}]


def _with_evidence(config: dict) -> dict:
    prs = [dict(pr, evidence=SERVER_EVIDENCE) if pr["number"] == 3 else pr for pr in config["pull_requests"]]
    return {**config, "pull_requests": prs}


def test_included_prs_are_reported_with_their_evidence_found_in_the_image(fake_site) -> None:
    check = probe(fake_site["tmp"], _with_evidence(fake_site["config"]))["pr:o/beta#3"]
    assert check["status"] == "pass"
    assert "evidence in the image: beta_pkg/server.py contains \"return 'patched'\" (beta_pkg/server.py:2)" in check["detail"]
    assert "attribute beta_pkg.server:serve (beta_pkg/server.py)" in check["detail"]


def test_evidence_missing_in_the_image_fails_the_pr(fake_site, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(fake_site["site"], site)
    (site / "beta_pkg" / "server.py").write_text("def handle():\n    return 'other'\n")
    config = {**_with_evidence(fake_site["config"]), "site_packages": str(site)}
    check = probe(fake_site["tmp"], config)["pr:o/beta#3"]
    assert check["status"] == "fail"
    assert "evidence missing in the image" in check["detail"] and "beta_pkg.server defines no serve" in check["detail"]


FAST_PATH = {"torch_cuda_major": 13, "packages": ["nvidia-cutlass-dsl-libs-cu13"]}


def test_a_cuda_13_torch_and_the_cu13_cutlass_dsl_pass(fake_site, tmp_path: Path) -> None:
    dsl = wheel(tmp_path, "nvidia_cutlass_dsl_libs_cu13", "4.7.1", {"nvidia_cutlass_dsl/cu13/__init__.py": ""})
    site = site_with_torch(tmp_path, "13.0", [dsl])
    checks = probe(tmp_path, {**fake_site["config"], "site_packages": str(site), "fast_path": FAST_PATH, "modules": [],
                               "wheels": [], "pull_requests": [], "excluded": []})
    assert checks["fast-path:torch-cuda"]["status"] == "pass" and "CUDA 13.0" in checks["fast-path:torch-cuda"]["detail"]
    assert checks["fast-path:package:nvidia-cutlass-dsl-libs-cu13"]["status"] == "pass"


def test_a_cuda_12_9_twin_is_caught(fake_site, tmp_path: Path) -> None:
    dsl12 = wheel(tmp_path, "nvidia_cutlass_dsl_libs_cu12", "4.7.1", {"nvidia_cutlass_dsl/cu12/__init__.py": ""})
    site = site_with_torch(tmp_path, "12.9", [dsl12])
    checks = probe(tmp_path, {**fake_site["config"], "site_packages": str(site), "fast_path": FAST_PATH, "modules": [],
                               "wheels": [], "pull_requests": [], "excluded": []})
    torch = checks["fast-path:torch-cuda"]
    assert torch["status"] == "fail" and "CUDA 12.9" in torch["detail"] and "needs CUDA >= 13" in torch["detail"]
    dsl = checks["fast-path:package:nvidia-cutlass-dsl-libs-cu13"]
    assert dsl["status"] == "fail" and "not installed" in dsl["detail"]


# Like nixl: the package imports the build for the CUDA major torch was built with.
TWIN_LOADER = """import importlib, importlib.util, pathlib, re
_text = (pathlib.Path(importlib.util.find_spec("torch").origin).parent / "version.py").read_text()
_pkg = importlib.import_module("twinpick_cu" + re.search(r"cuda[^=]*= '(\\d+)", _text).group(1))
"""


def _twin_probe(tmp: Path, fake_site: dict, cuda: str, builds: list[str]) -> dict:
    wheels = [wheel(tmp, "twinpick", "1.4.1", {"twinpick/__init__.py": TWIN_LOADER})]
    wheels += [wheel(tmp, f"twinpick_{b}", "1.4.1", {f"twinpick_{b}/__init__.py": "", f"twinpick_{b}/_bindings.py": ""})
               for b in builds]
    site = site_with_torch(tmp, cuda, wheels)
    fast_path = {"loads": {"twinpick": "twinpick-cu13"}}
    excluded = [{"name": "twinpick-cu12", "reason": "the CUDA 12 twin"}]
    return probe(tmp, {**fake_site["config"], "site_packages": str(site), "fast_path": fast_path, "modules": [],
                        "wheels": [], "pull_requests": [], "excluded": excluded})["fast-path:loads:twinpick"]


def test_a_package_that_loads_its_cu13_build_passes(fake_site, tmp_path: Path) -> None:
    check = _twin_probe(tmp_path, fake_site, "13.0", ["cu13"])
    assert check["status"] == "pass", check
    assert "import twinpick loads twinpick-cu13 (twinpick_cu13/__init__.py)" in check["detail"]
    assert "twinpick (1 files), twinpick-cu13 (1 files); nothing of the excluded twinpick-cu12" in check["detail"]


def test_a_package_that_loads_the_excluded_cuda_12_twin_fails(fake_site, tmp_path: Path) -> None:
    # A CUDA 12.9 torch makes the package pick its cu12 build: installed, it is caught loading it ...
    check = _twin_probe(tmp_path, fake_site, "12.9", ["cu12", "cu13"])
    assert check["status"] == "fail" and "loaded files of the excluded twinpick-cu12" in check["detail"], check


def test_a_package_that_needs_the_excluded_twin_fails_to_import(fake_site, tmp_path: Path) -> None:
    # ... and excluded (as the image has it), the import fails for want of it: a failure, not "not run".
    check = _twin_probe(tmp_path, fake_site, "12.9", ["cu13"])
    assert check["status"] == "fail", check
    assert "needs the excluded dependency 'twinpick_cu12'" in check["detail"]
