"""The serving probe: start the engine's OpenAI server from the image by digest and check its endpoints."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from .containers import _container_name, _log_excerpt, _remove
from .plan import SERVER_PORT, ServePlan
from .records import FAIL, NOT_RUN, PASS, Check

log = logging.getLogger("servestack.smoke")

DEFAULT_READY_TIMEOUT = 300.0


SERVING_CHECKS = ("ready", "health", "models", "completions", "chat", "stream", "metrics")


def _not_run_serving(reason: str) -> list[Check]:
    return [Check("serving", name, NOT_RUN, reason) for name in SERVING_CHECKS]


def _http():
    import requests

    session = requests.Session()
    session.trust_env = False  # never through a proxy: the server is on loopback
    return session


def _usage_problem(usage: dict[str, Any] | None) -> str | None:
    if not isinstance(usage, dict):
        return "no usage in the response"
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not all(isinstance(x, int) for x in (p, c, t)):
        return f"usage counts missing: {usage}"
    if c <= 0:
        return f"completion_tokens is {c}"
    if p <= 0:
        return f"prompt_tokens is {p}"
    if t != p + c:
        return f"total_tokens {t} != prompt_tokens {p} + completion_tokens {c}"
    return None


def _timed_check(name: str, fn: Callable[[], tuple[str, str]]) -> Check:
    start = time.monotonic()
    try:
        status, detail = fn()
    except Exception as e:  # noqa: BLE001 - a broken endpoint is a failed check
        status, detail = FAIL, f"{type(e).__name__}: {e}"
    return Check("serving", name, status, detail, round(time.monotonic() - start, 3))


def run_serving_probe(
    client,
    reference: str,
    platform: str,
    plan: ServePlan,
    *,
    stack: str = "stack",
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    request_timeout: float = 120.0,
    port: int = SERVER_PORT,
) -> tuple[list[Check], dict[str, Any]]:
    """Start the server in a named container, probe its endpoints, always remove the container."""
    import docker.errors
    import docker.types

    metrics: dict[str, Any] = {}
    if plan.command is None:
        return _not_run_serving(plan.reason), metrics
    name = _container_name(stack, "serve")
    container = None
    checks: list[Check] = []
    http = _http()
    start = time.monotonic()
    try:
        kwargs: dict[str, Any] = {}
        if plan.gpus:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        try:
            container = client.containers.run(
                reference,
                plan.command,
                name=name,
                detach=True,
                platform=platform,
                ports={f"{port}/tcp": ("127.0.0.1", None)},
                # vLLM's engine core allocates its IPC buffers in /dev/shm; docker's default is 64 MiB.
                shm_size=plan.shm_size,
                environment=plan.environment,
                volumes=plan.volumes,
                **kwargs,
            )
        except docker.errors.APIError as e:
            return [Check("serving", "ready", FAIL, f"cannot start the server container: {e.explanation or e}")] + [
                Check("serving", n, NOT_RUN, "the server container did not start") for n in SERVING_CHECKS[1:]
            ], metrics
        metrics["container"] = name
        log.info("serving probe: %s (deadline %.0f s)", name, ready_timeout)

        # -- readiness
        deadline = start + ready_timeout
        ready_problem = None
        base = ""
        while True:
            container.reload()
            if not base:
                bindings = (container.ports or {}).get(f"{port}/tcp") or []
                if bindings:
                    base = f"http://127.0.0.1:{bindings[0]['HostPort']}"
            try:
                if base and http.get(base + "/health", timeout=5).status_code == 200:
                    break
            except Exception:  # noqa: BLE001,S110 - not listening yet
                pass
            container.reload()
            if container.status in ("exited", "dead"):
                code = container.attrs.get("State", {}).get("ExitCode")
                ready_problem = f"the server exited with {code} before becoming ready; {_log_excerpt(container)}"
                break
            if time.monotonic() > deadline:
                ready_problem = (
                    f"the server was not ready after {ready_timeout:.0f} s (GET /health never returned 200); "
                    f"{_log_excerpt(container)}"
                )
                break
            time.sleep(1.0)
        if ready_problem:
            checks.append(Check("serving", "ready", FAIL, ready_problem, round(time.monotonic() - start, 3)))
            checks += [Check("serving", n, NOT_RUN, "the server never became ready") for n in SERVING_CHECKS[1:]]
            return checks, metrics
        ready_s = time.monotonic() - start
        metrics["time_to_ready_s"] = round(ready_s, 2)
        checks.append(Check("serving", "ready", PASS, f"GET /health 200 after {ready_s:.1f} s", round(ready_s, 3)))

        model = plan.model

        def health() -> tuple[str, str]:
            r = http.get(base + "/health", timeout=request_timeout)
            return (PASS, "200") if r.status_code == 200 else (FAIL, f"HTTP {r.status_code}: {r.text[:300]}")

        def models() -> tuple[str, str]:
            r = http.get(base + "/v1/models", timeout=request_timeout)
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:300]}"
            ids = [m.get("id") for m in r.json().get("data", [])]
            return (PASS, f"serves {ids}") if model in ids else (FAIL, f"serves {ids}, not {model!r}")

        def completions() -> tuple[str, str]:
            r = http.post(base + "/v1/completions", timeout=request_timeout, json={
                "model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            })
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
            body = r.json()
            text = (body.get("choices") or [{}])[0].get("text")
            problem = _usage_problem(body.get("usage"))
            if not isinstance(text, str):
                problem = f"no text in choices: {body.get('choices')}"
            if problem:
                return FAIL, problem
            metrics["completion_usage"] = body["usage"]
            return PASS, f"usage {body['usage']}; text {text[:60]!r}"

        def chat() -> tuple[str, str]:
            r = http.post(base + "/v1/chat/completions", timeout=request_timeout, json={
                "model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                "temperature": 0, "ignore_eos": True,
            })
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
            body = r.json()
            message = ((body.get("choices") or [{}])[0].get("message") or {})
            problem = _usage_problem(body.get("usage"))
            if problem is None and not isinstance(message.get("content"), str):
                problem = f"no message content: {message}"
            if problem:
                return FAIL, problem
            metrics["chat_usage"] = body["usage"]
            return PASS, f"usage {body['usage']}; content {message['content'][:60]!r}"

        def stream() -> tuple[str, str]:
            t0 = time.monotonic()
            first = None
            chunks = 0
            with http.post(base + "/v1/completions", timeout=request_timeout, stream=True, json={
                "model": model, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                "stream": True,
            }) as r:
                if r.status_code != 200:
                    return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
                for line in r.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    piece = json.loads(data)
                    if any(c.get("text") for c in piece.get("choices", [])):
                        chunks += 1
                        if first is None:
                            first = time.monotonic() - t0
            total = time.monotonic() - t0
            if first is None:
                return FAIL, "the stream carried no token"
            metrics["first_token_latency_s"] = round(first, 4)
            metrics["stream_total_s"] = round(total, 4)
            return PASS, f"first token after {first * 1000:.0f} ms; {chunks} chunks in {total:.2f} s"

        def prometheus() -> tuple[str, str]:
            r = http.get(base + "/metrics", timeout=request_timeout)
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:300]}"
            families = sorted({
                line.split("{")[0].split(" ")[0]
                for line in r.text.splitlines()
                if line.startswith("vllm:")
            })
            if not families:
                return FAIL, f"no vllm: metrics in /metrics ({len(r.text)} bytes, starts {r.text[:120]!r})"
            generated = [
                float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
                if line.startswith("vllm:generation_tokens_total")
            ]
            extra = f"; vllm:generation_tokens_total {sum(generated):.0f}" if generated else ""
            return PASS, f"{len(families)} vllm: metric families{extra}"

        for check_name, fn in (("health", health), ("models", models), ("completions", completions), ("chat", chat),
                               ("stream", stream), ("metrics", prometheus)):
            checks.append(_timed_check(check_name, fn))
        return checks, metrics
    finally:
        http.close()
        if container is not None:
            _remove(container)
            metrics["serving_s"] = round(time.monotonic() - start, 2)
