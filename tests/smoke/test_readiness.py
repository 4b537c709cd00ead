"""The disaggregated shape's readiness, read from Dynamo 1.6.1's frontend (its /health and /metrics),
never from a log: the answers below are the frontend's own, taken from the dev-cpu image under
production's DYN_LOG=error (trimmed to the instances and series that matter)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from servestack.smoke.endpoints import Target, check_discovery
from servestack.smoke.firstrequest import FirstRequest
from servestack.smoke.readiness import DynamoWorkers, generate_instances, routed_workers

PREFILL_ID, DECODE_ID = 14566056576648331147, 10928097373238292493
MODEL = "servestack/tiny-qwen35"


def _instance(component: str, endpoint: str, instance_id: int) -> dict:
    return {"component": component, "endpoint": endpoint, "namespace": "dynamo", "instance_id": instance_id,
            "transport": {"tcp": f"127.0.0.1:40559/ca2507483d5dbf8b/dynamo/{component}/{endpoint}"},
            "device_type": "cuda", "request_plane_codec": "msgpack"}


def _health(*instances: dict) -> dict:
    endpoints = sorted({f"dyn://dynamo.{i['component']}.{i['endpoint']}" for i in instances})
    return {"status": "healthy", "endpoints": endpoints, "instances": list(instances)}


ONLY_PREFILL = _health(_instance("prefill", "clear_kv_blocks", PREFILL_ID), _instance("prefill", "generate", PREFILL_ID))
BOTH = _health(_instance("backend", "generate", DECODE_ID), _instance("backend", "get_perf_metrics", DECODE_ID),
               _instance("prefill", "generate", PREFILL_ID))
# The frontend's /metrics after one completion through the pair (dynamo_frontend_* series, trimmed).
ROUTED_METRICS = f"""\
# HELP dynamo_frontend_model_ready Whether the frontend can route at least one inference request for the model (1 = ready, 0 = not ready)
# TYPE dynamo_frontend_model_ready gauge
dynamo_frontend_model_ready{{model="{MODEL}"}} 1
dynamo_frontend_requests_total{{endpoint="completions",error_type="",model="{MODEL}",request_type="unary",status="success"}} 1
dynamo_frontend_worker_last_input_sequence_tokens{{dp_rank="none",worker_id="{PREFILL_ID}",worker_type="prefill"}} 6
dynamo_frontend_worker_last_inter_token_latency_seconds{{dp_rank="none",worker_id="{DECODE_ID}",worker_type="decode"}} 0.00766376
dynamo_frontend_worker_last_time_to_first_token_seconds{{dp_rank="none",worker_id="{PREFILL_ID}",worker_type="prefill"}} 0.516837497
"""
# Before any request: the per-worker gauges are not there yet.
QUIET_METRICS = ROUTED_METRICS.split("dynamo_frontend_worker_last")[0]
SERVED = {"choices": [{"text": "ns"}], "usage": {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}}


class Frontend:
    """Dynamo's frontend as the probe sees it: scripted /health answers (the last one repeats),
    /v1/models, /metrics, and POST /v1/completions."""

    def __init__(self, health: list[dict], metrics: list[str] | None = None, listed: bool = True) -> None:
        self.health, self.metrics, self.listed = list(health), list(metrics or [QUIET_METRICS]), listed
        self.posted: list[dict] = []

    @staticmethod
    def _answer(status: int, body) -> SimpleNamespace:
        text = body if isinstance(body, str) else json.dumps(body)
        return SimpleNamespace(status_code=status, text=text, json=lambda: json.loads(text))

    @staticmethod
    def _next(script: list):
        return script.pop(0) if len(script) > 1 else script[0]

    def get(self, url: str, timeout: float) -> SimpleNamespace:
        if url.endswith("/health"):
            return self._answer(200, self._next(self.health))
        if url.endswith("/v1/models"):
            return self._answer(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}] if self.listed else []})
        assert url.endswith("/metrics"), url
        return self._answer(200, self._next(self.metrics))

    def post(self, url: str, timeout: float, json: dict) -> SimpleNamespace:
        assert url.endswith("/v1/completions")
        self.posted.append(json)
        return self._answer(200, SERVED)


def test_the_frontends_health_names_each_workers_generate_instance() -> None:
    assert generate_instances(BOTH) == {"prefill": {str(PREFILL_ID)}, "decode": {str(DECODE_ID)}}
    assert generate_instances(ONLY_PREFILL) == {"prefill": {str(PREFILL_ID)}, "decode": set()}
    # Before discovery (or an answer that is not Dynamo's): nobody.
    for nothing in ({"status": "healthy", "endpoints": [], "instances": []}, None, [], {"instances": "x"}):
        assert generate_instances(nothing) == {"prefill": set(), "decode": set()}


def test_the_frontends_metrics_name_the_workers_it_routed_to_by_type() -> None:
    assert routed_workers(ROUTED_METRICS) == {"prefill": {str(PREFILL_ID)}, "decode": {str(DECODE_ID)}}
    assert routed_workers(QUIET_METRICS) == {}


def test_ready_waits_for_both_workers_and_a_completion_routed_through_both() -> None:
    frontend = Frontend([ONLY_PREFILL, BOTH], [QUIET_METRICS, ROUTED_METRICS])
    workers = DynamoWorkers(model=MODEL, started=time.monotonic(), settle_s=0.0, reads=1)
    first = FirstRequest(registered=workers, routed=workers.routed, model=MODEL, decode_log=lambda: "", timeout=60.0,
                         started=workers.started, deadline_s=600.0)
    assert not first(frontend, "http://f") and not frontend.posted  # the decode worker is not listed yet
    assert set(workers.registered_s) == {"prefill"}
    # Both listed, a completion served, but the frontend's metrics do not yet name the workers it used.
    assert not first(frontend, "http://f") and len(frontend.posted) == 1
    assert "metrics name no prefill and no decode worker" in first.failed[0].outcome
    assert first(frontend, "http://f")  # served and routed through both
    assert set(workers.registered_s) == {"prefill", "decode"} and workers.registered_s["prefill"] <= workers.registered_s["decode"]
    assert "through the prefill and the decode worker" in first.passed() and "1 failed before it" in first.passed()
    assert workers.to_json()["instances"] == {"prefill": [str(PREFILL_ID)], "decode": [str(DECODE_ID)]}


def test_a_completion_served_without_the_prefill_worker_is_not_ready() -> None:
    """Served by the decode worker alone (the prefill router not active): no prefill series."""
    aggregated = ROUTED_METRICS.replace(f'worker_id="{PREFILL_ID}",worker_type="prefill"', f'worker_id="{DECODE_ID}",worker_type="decode"')
    workers = DynamoWorkers(model=MODEL, started=time.monotonic(), settle_s=0.0, reads=2)
    frontend = Frontend([BOTH], [aggregated])
    assert workers(frontend, "http://f")
    why = workers.routed(frontend, "http://f")
    assert why is not None and "no prefill worker" in why and "decode" not in why.split("(")[0]
    # Listed, but the model is not: not registered.
    assert not DynamoWorkers(model=MODEL, started=time.monotonic())(Frontend([BOTH], listed=False), "http://f")


def test_the_discovery_check_reads_the_frontend_whatever_the_logs_say() -> None:
    workers = DynamoWorkers(model=MODEL, started=time.monotonic())
    assert workers(Frontend([BOTH]), "http://f")
    quiet_logs = {"frontend": lambda: "", "prefill": lambda: "", "decode": lambda: ""}  # DYN_LOG=error
    kept = Target(base="http://f", model=MODEL, http=Frontend([BOTH]), timeout=1.0, logs=quiet_logs, workers=workers)
    status, detail = check_discovery(kept)
    assert status == "pass" and f"prefill {PREFILL_ID}" in detail and f"decode {DECODE_ID}" in detail
    dropped = Target(base="http://f", model=MODEL, http=Frontend([ONLY_PREFILL]), timeout=1.0, logs=quiet_logs, workers=workers)
    status, detail = check_discovery(dropped)
    assert status == "fail" and f"the frontend no longer lists the decode worker ({DECODE_ID})" in detail and "prefill worker" not in detail


def test_dev_cpus_smoke_runs_with_productions_dynamo_log_level() -> None:
    """CPU CI serves the disaggregated shape with the log level production's image sets, so a
    readiness that needs a Dynamo INFO line cannot pass there and fail on the cluster."""
    from fixtures.records import committed_lock

    production = committed_lock("qwen35-gb200").environment["DYN_LOG"]
    assert committed_lock("dev-cpu").environment["DYN_LOG"] == production == "error"
