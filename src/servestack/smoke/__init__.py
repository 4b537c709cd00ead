"""`servestack smoke`: run the image by digest and prove it is what the lock says, and that it serves.

    result = run_smoke(Project.find(), "dev-cpu")          # image from build/dev-cpu/image.json
    result = run_smoke(project, "qwen35-gb200", image="127.0.0.1:5000/servestack/qwen35-gb200@sha256:...",
                       serve=False)
    sys.exit(result.exit_code)

Two probes, each a list of checks {name, status: pass|fail|not_run, detail}:

1. static (the `servestack/probe/static` package, stdlib only, bind-mounted read-only and run with the
   image's /opt/venv/bin/python, no network): locked versions installed, overlaid files' sha256,
   stack.json's lock is pins/<stack>.lock, each PR included/overlaid/unverified, every engine flag
   and environment variable the stack's recipes (and the stack itself) use is accepted by vLLM's own
   argument parser and env registry, the stack's modules import (GPU-only failures are `not_run`
   with the reason), and which installed modules import an excluded dependency.
   Foreign platforms (linux/arm64 here) run under qemu-user.
2. serving: the engine's OpenAI-compatible server in a named container, port published on
   127.0.0.1 only, with the smoke model; readiness with a deadline, then /health, /v1/models, one
   completion, one chat completion, a streamed completion (first-token latency) and /metrics. The
   container is removed on every exit path (failure, Ctrl-C, SIGTERM). Where it cannot run (no GPU
   for a GPU model, a foreign platform), every serving check is `not_run` with the reason.
3. disagg: the production shape from the same image: Dynamo's frontend, a prefill and a decode
   worker (vLLM's NixlConnector, KV on CPU), everything on loopback; ready when the frontend lists
   both workers and has routed a first completion through both (its /health and /metrics, never its
   log, which production's DYN_LOG=error keeps quiet); completions and chat through the frontend, and
   the decode worker's count of NIXL transfers as evidence the KV cache moved;
   each engine on CPUs of its own, and a failure naming it if a worker left Dynamo's discovery.

Writes build/<stack>/smoke.json and build/<stack>/smoke-junit.xml atomically and prints a summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from servestack import services
from servestack.errors import ServestackError
from servestack.image import load_image
from servestack.lock import load_lock
from servestack.records.imageref import ImageRef
from servestack.records.smokefile import SmokeRecord, write_smoke
from servestack.records.steps import ImageRecord
from servestack.services.dockerd import ensure_image
from servestack.smoke.ablation import pr_accounts
from servestack.smoke.checklist import (
    DisaggPlan,
    ServePlan,
    disagg_plan,
    engine_usage,
    probe_config,
    serve_command,
    serve_plan,
)
from servestack.smoke.containers import host_docker_platform
from servestack.smoke.gpu import GpuHost, detect_gpu_host, gpu_container_kwargs, host_gpus
from servestack.smoke.junit import render_junit
from servestack.smoke.nvidia_hook import check_nvidia_hook
from servestack.smoke.serving import (
    DEFAULT_READY_TIMEOUT,
    _not_run_disagg,
    _not_run_serving,
    run_disagg_probe,
    run_serving_probe,
)
from servestack.smoke.static import DEFAULT_STATIC_TIMEOUT, PROBE_PACKAGE, run_static_probe
from servestack.smoke.summary import FAIL, NOT_RUN, PASS, Check, SmokeResult
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_text, sha256_file
from servestack.util.interrupts import signals_unwind
from servestack.util.project import Project


def run_smoke(
    project: Project,
    stack: str,
    image: str | None = None,
    serve: bool = True,
    *,
    ready_timeout: float | None = None,
    static_timeout: float = DEFAULT_STATIC_TIMEOUT,
    serve_plan_override: ServePlan | None = None,
    disagg_override: DisaggPlan | None = None,
    require_serving: bool = False,
) -> SmokeResult:
    """Smoke-test the stack's image by digest; writes smoke.json + smoke-junit.xml; see module doc.

    Raises ServestackError for unusable input (a tag instead of a digest, no image.json, no lock);
    probe failures are in the result (`result.exit_code` is non-zero when any check failed).
    `require_serving` (the GPU canary): a serving or disaggregated check that could not run fails.
    `ready_timeout`: seconds each serving shape may take to serve; unset, the stack's
    `smoke_model.ready_timeout_s`, else DEFAULT_READY_TIMEOUT.
    """
    started = time.monotonic()
    recorded: ImageRecord | None = None
    if image is None:
        recorded = load_image(project, stack)
        image = recorded.reference
    reference = str(ImageRef.parse(image))
    lock = load_lock(project, stack)
    lock_sha256 = sha256_file(project.lock_file(stack))
    ready_timeout = ready_timeout or lock.smoke_model.ready_timeout_s or DEFAULT_READY_TIMEOUT
    platforms = sorted(lock.platforms)
    # An image for several platforms is smoked as this host's, where the lock has it: natively.
    host = host_docker_platform()
    platform = recorded.platform if recorded else (host if host in platforms else (platforms or [host])[0])
    if platform not in lock.platforms:
        raise ServestackError(f"{project.lock_file(stack)}: locks no wheels for the image's platform {platform}")

    checks: list[Check] = []
    metrics: dict[str, Any] = {"ready_timeout_s": ready_timeout}
    if recorded and recorded.lock_sha256 != lock_sha256:
        checks.append(Check(probe="static", name="image-json-lock", status=FAIL,
                            detail=f"build/{stack}/image.json says the image was built from lock {recorded.lock_sha256}, "
                            f"but pins/{stack}.lock is now {lock_sha256}: rebuild the image"))
    with signals_unwind():
        client = services.docker_client()
        if platform != host_docker_platform() and platform == "linux/arm64":
            services.ensure_binfmt_aarch64()
        try:
            t0 = time.monotonic()
            console.progress(f"smoke {stack}: pulling {reference} ...")
            ensure_image(client, reference, platform)
            pulled = True
            metrics["pull_s"] = round(time.monotonic() - t0, 2)
            console.progress(f"smoke {stack}: pulled ({metrics['pull_s']:.0f} s)")
        except ServestackError as e:
            pulled = False
            checks.append(Check(probe="static", name="pull", status=FAIL, detail=str(e)))
            checks += _not_run_serving("the image could not be pulled") + _not_run_disagg("the image could not be pulled")
        if pulled:
            console.progress(f"smoke {stack}: static probe in {reference} ({platform}) ...")
            t0 = time.monotonic()
            config = probe_config(project, stack, lock, platform, lock_sha256)
            checks += run_static_probe(client, reference, platform, config, stack=stack, timeout=static_timeout)
            if lock.gpu_node:
                image_env = (client.images.get(reference).attrs.get("Config") or {}).get("Env") or []
                checks.append(check_nvidia_hook(image_env, lock.gpu_node))
            metrics["static_probe_s"] = round(time.monotonic() - t0, 2)
            console.progress(f"smoke {stack}: static probe done ({metrics['static_probe_s']:.0f} s)")
        if not pulled:
            pass  # serving checks are already recorded as not run
        elif serve:
            gpus = host_gpus(client)
            metrics["gpu_host"] = {"devices": list(gpus.devices), "via": gpus.via, "evidence": gpus.evidence}
            served = serve_plan_override or serve_plan(lock, platform, gpus)
            split = disagg_override or disagg_plan(lock, platform, gpus)
            shapes: tuple[tuple[str, ServePlan | DisaggPlan, Callable[[], tuple[list[Check], dict[str, Any]]], str | None], ...] = (
                ("serving probe", served, lambda: run_serving_probe(
                    client, reference, platform, served, stack=stack, ready_timeout=ready_timeout), None),
                # The disaggregated shape is held to the aggregated server's oracle answers (read when it starts).
                ("disaggregated serving probe", split, lambda: run_disagg_probe(
                    client, reference, platform, split, stack=stack, ready_timeout=ready_timeout,
                    baseline=metrics.get("agreement_reference")), "disagg"),
            )
            for label, plan, run, key in shapes:
                console.progress(f"smoke {stack}: {label} " + ("..." if plan.runnable else f"not run: {plan.reason}"))
                found, measured = run()
                checks += found
                metrics.update({key: measured} if key else measured)
                if plan.runnable:
                    console.progress(f"smoke {stack}: {label} done ({time.monotonic() - started:.0f} s since start)")
        else:
            checks += _not_run_serving("serving probe disabled (--no-serve)") + _not_run_disagg("serving probe disabled (--no-serve)")
    if require_serving:
        checks += _required_serving(checks)
    wall = time.monotonic() - started
    out_dir = project.artifacts(stack)
    record = SmokeRecord(stack=stack, image=reference, platform=platform, lock_sha256=lock_sha256, wall_s=wall, metrics=metrics,
                         checks=tuple(checks), prs=tuple(pr_accounts(project, stack, checks)))
    result = SmokeResult(record=record, smoke_json=out_dir / "smoke.json", junit_xml=out_dir / "smoke-junit.xml")
    write_smoke(result.smoke_json, record)
    atomic_write_text(result.junit_xml, render_junit(stack, checks, wall))
    console.progress(result.summary())
    return result


def _required_serving(checks: list[Check]) -> list[Check]:
    """Where serving is the point (the GPU canary), a serving check that did not run is a failure
    of its own, naming what did not run and why; the checks themselves keep their status."""
    skipped = [c for c in checks if c.probe in ("serving", "disagg") and c.status == NOT_RUN]
    if not skipped:
        return []
    reasons = sorted({c.detail.splitlines()[0] if c.detail else "no reason given" for c in skipped})
    return [Check(probe="serving", name="required", status=FAIL, detail=f"{len(skipped)} serving checks did not run "
                  f"({', '.join(f'{c.probe}/{c.name}' for c in skipped[:6])}{' ...' if len(skipped) > 6 else ''}): "
                  + " | ".join(reasons[:3]))]


__all__ = [
    "FAIL",
    "NOT_RUN",
    "PASS",
    "PROBE_PACKAGE",
    "Check",
    "DisaggPlan",
    "GpuHost",
    "ServePlan",
    "SmokeResult",
    "detect_gpu_host",
    "disagg_plan",
    "engine_usage",
    "gpu_container_kwargs",
    "host_docker_platform",
    "render_junit",
    "run_disagg_probe",
    "run_serving_probe",
    "run_smoke",
    "run_static_probe",
    "serve_command",
    "serve_plan",
]
