"""What each engine's log says about its start-up and its GPU path, for smoke.json and the `gpu` check.

`record_engines` runs at ready in both shapes, on CPU too: each engine's time to ready, what its log
up to ready says that time went on (gpulogs.startup: weights, torch.compile, FlashInfer/CuTe DSL
compiles, CUDA graphs, the rest) and its KV capacity, as smoke.json's `engines`. On a GPU the `gpu`
check adds the kernels each engine chose, its CUDA graphs, its NIXL transfers, and what it compiled
after ready, while serving (the first requests pay for it: `first_token_latency`'s p99).
"""

from __future__ import annotations

from typing import Any

from servestack.smoke import gpulogs
from servestack.smoke.summary import FAIL, NOT_RUN, PASS
from servestack.smoke.target import Target


def _engine_logs(t: Target) -> dict[str, str]:
    return {role: read() for role, read in t.logs.items() if role != "frontend"}


def record_engines(t: Target, logs: dict[str, str] | None = None) -> dict[str, gpulogs.Startup]:
    """Each engine's start-up, from its log as it was at ready, into t.metrics["engines"]."""
    logs = _engine_logs(t) if logs is None else logs
    found = {role: gpulogs.startup(log[:t.logged_at_ready[role]] if role in t.logged_at_ready else log, t.ready_s.get(role))
             for role, log in logs.items()}
    t.metrics["engines"] = {role: startup.to_json() for role, startup in found.items()}
    return found


def compiled_while_serving(t: Target, role: str, log: str) -> tuple[gpulogs.JitBuild, ...]:
    """The FlashInfer modules and CuTe DSL kernels the engine compiled after ready (none when ready's
    place in its log is not known)."""
    return gpulogs.jit_builds(log[t.logged_at_ready[role]:]) if role in t.logged_at_ready else ()


def check_gpu_path(t: Target) -> tuple[str, str]:
    """On a GPU, every engine logged the kernels it chose (GDN prefill, attention) and captured its
    CUDA graphs; what each logged (its kernels, graphs, start-up broken down, KV capacity, NIXL
    transfers, and what it compiled while serving) goes to smoke.json as `gpu`."""
    if not t.gpus:
        return NOT_RUN, "the engines ran on CPU: no GPU kernels, CUDA graphs or GPU buffers to record"
    logs = _engine_logs(t)
    engines = {role: gpulogs.engine_log(log) for role, log in logs.items()}
    starts = record_engines(t, logs)
    serving = {role: compiled_while_serving(t, role, log) for role, log in logs.items()}
    record: dict[str, Any] = {}
    for role, engine in engines.items():
        record[role] = {**engine.to_json(), "startup": starts[role].to_json(),
                        "compiled_while_serving": [{"name": b.name, "kind": b.kind, "seconds": b.seconds} for b in serving[role]]}
    t.metrics["gpu"] = record
    shown = "; ".join(f"{role}: GDN prefill {e.gdn_prefill}, attention {e.attention}, CUDA graphs "
                      f"{sum(e.cuda_graphs.modes.values())} in {e.cuda_graphs.seconds} s" for role, e in engines.items())
    started = "; ".join(f"{role} {s.describe()}" for role, s in starts.items())
    compiled = "; ".join(f"{role} compiled {', '.join(b.name for b in builds)} while serving" for role, builds in serving.items() if builds)
    shown += f"; start-up: {started}" + (f"; {compiled}" if compiled else "")
    gaps = {role: gpulogs.missing(e) for role, e in engines.items() if gpulogs.missing(e)}
    if gaps:
        return FAIL, "; ".join(f"{role} logged {', '.join(g)}" for role, g in gaps.items()) + f" ({shown})"
    # A FlashInfer module built before ready is one the image's prebuilt layer should have held: every
    # engine start pays for it (minutes), and on a fresh image its link once failed.
    at_start = {role: [b.name for b in s.jit if b.kind == "flashinfer"] for role, s in starts.items()}
    at_start = {role: names for role, names in at_start.items() if names}
    if at_start:
        return FAIL, ("; ".join(f"{role} compiled FlashInfer's {', '.join(names)} at start" for role, names in at_start.items())
                      + f", which the image's prebuilt layer does not hold for this GPU ({shown})")
    return PASS, shown
