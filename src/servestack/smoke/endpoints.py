"""The serving checks, as a table: each is a named function of the `Target` it probes.

The aggregated shape (vLLM's own OpenAI server) and the disaggregated one (Dynamo's frontend
with a prefill and a decode worker) share the endpoint checks; each adds its own evidence: vLLM's
/metrics for the first, the KV cache moving over NIXL for the second.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from servestack.clients import agreement
from servestack.smoke.checklist import FRONTEND_REQUEST_TIMEOUT_S
from servestack.smoke.containers import log_errors, log_message
from servestack.smoke.engines import check_gpu_path
from servestack.smoke.summary import FAIL, NOT_RUN, PASS
from servestack.smoke.target import Target
from servestack.util.workerlogs import kv_transfers


def usage_problem(usage: dict[str, Any] | None) -> str | None:
    if not isinstance(usage, dict):
        return "no usage in the response"
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not (isinstance(p, int) and isinstance(c, int) and isinstance(t, int)):
        return f"usage counts missing: {usage}"
    if c <= 0:
        return f"completion_tokens is {c}"
    if p <= 0:
        return f"prompt_tokens is {p}"
    if t != p + c:
        return f"total_tokens {t} != prompt_tokens {p} + completion_tokens {c}"
    return None


def check_health(t: Target) -> tuple[str, str]:
    r = t.http.get(t.base + "/health", timeout=t.timeout)
    return (PASS, "200") if r.status_code == 200 else (FAIL, f"HTTP {r.status_code}: {r.text[:300]}")


def check_models(t: Target) -> tuple[str, str]:
    r = t.http.get(t.base + "/v1/models", timeout=t.timeout)
    if r.status_code != 200:
        return FAIL, f"HTTP {r.status_code}: {r.text[:300]}"
    ids = [m.get("id") for m in r.json().get("data", [])]
    return (PASS, f"serves {ids}") if t.model in ids else (FAIL, f"serves {ids}, not {t.model!r}")


def post_completion(http: Any, base: str, model: str, request: dict[str, Any], timeout: float,
                    shown: int = 500) -> tuple[dict[str, Any] | None, str | None]:
    """POST /v1/completions (one request, `timeout` for it): the body and what is wrong with its usage
    (None: nothing), or no body and why (the HTTP status, or a body that is not a JSON object), with
    at most `shown` characters of the response. A request that raises (refused, timed out, not JSON)
    raises here: the caller says what that means for it."""
    r = http.post(base + "/v1/completions", timeout=timeout, json={"model": model, **request})
    if r.status_code != 200:
        return None, f"HTTP {r.status_code}: {r.text[:shown]}"
    body = r.json()
    if not isinstance(body, dict):
        return None, f"not an object: {r.text[:shown]}"
    return body, usage_problem(body.get("usage"))


def _completion(t: Target, metric: str, request: dict[str, Any]) -> tuple[str, str]:
    """A completion passes with text and sane usage, recorded as t.metrics[metric]."""
    body, problem = post_completion(t.http, t.base, t.model, request, t.timeout)
    if body is None:
        return FAIL, problem or "no body"
    text = (body.get("choices") or [{}])[0].get("text")
    if not isinstance(text, str):
        problem = f"no text in choices: {body.get('choices')}"
    if problem:
        return FAIL, problem
    t.metrics[metric] = body["usage"]
    return PASS, f"usage {body['usage']}; text {text[:60]!r}"


def check_completions(t: Target) -> tuple[str, str]:
    return _completion(t, "completion_usage", {
        "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
    })


def check_sampled(t: Target) -> tuple[str, str]:
    """A client's default request: temperature above 0 and no seed. vLLM 0.31's CPU sampler takes
    its torch.compile'd random sampler only when no request in the batch has a seed (a seeded one
    samples eagerly), so a seeded check would not reach the path that needs a C++ compiler."""
    return _completion(t, "sampled_usage", {
        "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.8, "ignore_eos": True,
    })


def check_chat(t: Target) -> tuple[str, str]:
    r = t.http.post(t.base + "/v1/chat/completions", timeout=t.timeout, json={
        "model": t.model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0, "ignore_eos": True,
    })
    if r.status_code != 200:
        return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
    body = r.json()
    message = ((body.get("choices") or [{}])[0].get("message") or {})
    problem = usage_problem(body.get("usage"))
    if problem is None and not isinstance(message.get("content"), str):
        problem = f"no message content: {message}"
    if problem:
        return FAIL, problem
    t.metrics["chat_usage"] = body["usage"]
    return PASS, f"usage {body['usage']}; content {message['content'][:60]!r}"


# Streamed completions at concurrency 1, one after another: on a GPU enough for a p99 of the first
# token's latency (a request that compiles a kernel while serving shows there); on CPU one.
STREAMS_ON_GPU = 20


def _stream(t: Target) -> tuple[float | None, int, float, str | None]:
    """One streamed completion: seconds to its first token (None: no token), its chunks, its total
    seconds, and what went wrong (None: nothing)."""
    t0 = time.monotonic()
    first = None
    chunks = 0
    with t.http.post(t.base + "/v1/completions", timeout=t.timeout, stream=True, json={
        "model": t.model, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
        "stream": True,
    }) as r:
        if r.status_code != 200:
            return None, 0, time.monotonic() - t0, f"HTTP {r.status_code}: {r.text[:500]}"
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
    return first, chunks, time.monotonic() - t0, None if first is not None else "the stream carried no token"


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0-100) of non-empty `values`."""
    ranked = sorted(values)
    return ranked[max(0, min(len(ranked) - 1, int(-(-len(ranked) * q // 100)) - 1))]


def check_stream(t: Target) -> tuple[str, str]:
    firsts: list[float] = []
    for index in range(STREAMS_ON_GPU if t.gpus else 1):
        first, chunks, total, problem = _stream(t)
        if problem:
            return FAIL, problem if not index else f"stream {index + 1}: {problem}"
        assert first is not None
        firsts.append(first)
        if not index:
            t.metrics["first_token_latency_s"] = round(first, 4)
            t.metrics["stream_total_s"] = round(total, 4)
            detail = f"first token after {first * 1000:.0f} ms; {chunks} chunks in {total:.2f} s"
    p50, p99 = percentile(firsts, 50), percentile(firsts, 99)
    t.metrics["first_token_latency"] = {"concurrency": 1, "requests": len(firsts), "p50_s": round(p50, 4), "p99_s": round(p99, 4)}
    if len(firsts) > 1:
        detail += f"; {len(firsts)} streams one at a time: first token p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
    return PASS, detail


def check_vllm_metrics(t: Target) -> tuple[str, str]:
    r = t.http.get(t.base + "/metrics", timeout=t.timeout)
    if r.status_code != 200:
        return FAIL, f"HTTP {r.status_code}: {r.text[:300]}"
    families = sorted({line.split("{")[0].split(" ")[0] for line in r.text.splitlines() if line.startswith("vllm:")})
    if not families:
        return FAIL, f"no vllm: metrics in /metrics ({len(r.text)} bytes, starts {r.text[:120]!r})"
    generated = [float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
                 if line.startswith("vllm:generation_tokens_total")]
    extra = f"; vllm:generation_tokens_total {sum(generated):.0f}" if generated else ""
    return PASS, f"{len(families)} vllm: metric families{extra}"


# vLLM 0.31's NixlConnector logs every failed handshake or transfer as one line (then the traceback
# when an exception caused it): "NIXL transfer failure: handshake_failed | Context: {..., 'remote_host':
# '127.0.0.1', 'remote_port': 20097, ...}" (nixl/base_worker.py _log_failure).
_NIXL_FAILURE = re.compile(r"NIXL transfer failure: (?P<kind>\S+?)\.?(?: (?P<msg>.*?))? \| Context: (?P<context>.*)$")
_REMOTE = re.compile(r"'remote_host': '(?P<host>[^']*)', 'remote_port': (?P<port>\d+)")


def nixl_failures(log: str) -> list[str]:
    """Each NIXL failure the worker logged, in order, as one line: its kind, the side channel it
    talked to and the exception that ended its traceback, e.g. "handshake_failed with
    127.0.0.1:20097: zmq.error.Again: Resource temporarily unavailable"."""
    failures: list[str] = []
    lines = log.splitlines()
    for index, line in enumerate(lines):
        m = _NIXL_FAILURE.search(log_message(line))
        if not m:
            continue
        remote = _REMOTE.search(m["context"])
        where = f" with {remote['host']}:{remote['port']}" if remote else ""
        # The traceback follows its failure line, up to the next failure line.
        following = []
        for later in lines[index + 1:]:
            if _NIXL_FAILURE.search(later):
                break
            following.append(later)
        cause = (log_errors("\n".join(following), most=1) or [m["msg"] or "no exception logged"])[0]
        failures.append(f"{m['kind']}{where}: {cause}")
    return failures


def summarize(lines: list[str], most: int = 4) -> str:
    """Distinct lines with how often each occurred, in first-seen order."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    shown = [f"{n} x {line}" if n > 1 else line for line, n in list(counts.items())[:most]]
    more = len(counts) - most
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def decode_failure_reason(log: str) -> str:
    """Why the decode worker failed requests, from its log: its NIXL failures, else its error lines,
    else its last lines (never a traceback's tail: the exception is in its last line)."""
    failures = nixl_failures(log)
    if failures:
        return "NIXL failures: " + summarize(failures)
    errors = log_errors(log)
    if errors:
        return "errors in its log: " + " | ".join(errors)
    return "no error in its log; last lines: " + " | ".join(log.rstrip().splitlines()[-5:])


def check_kv_transfer(t: Target) -> tuple[str, str]:
    """The decode worker pulled the prefill worker's KV blocks over NIXL, and no pull failed after
    `ready` (the failures logged before `ready` are the first request's failed attempts, `ready`'s to
    report: vLLM counts a failed handshake as a failed transfer, and its stats interval can log them
    after `ready`; any failed transfer beyond those is this check's).

    One successful pull per request is waited for, but at least one is required: on a loaded
    2-core machine the decode worker's per-interval stats once counted 2 pulls for 3 requests
    (every request served, none failed), so the count is reported, not matched."""
    first = t.metrics.get("first_request") or {}
    checked = sum(1 for k in ("completion_usage", "sampled_usage", "chat_usage", "first_token_latency_s") if k in t.metrics)
    requests_sent = checked + (first.get("served_s") is not None)
    deadline = time.monotonic() + t.kv_wait_s
    while True:
        counts = kv_transfers(t.logs["decode"]())
        if counts["successful"] >= max(requests_sent, 1) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    t.metrics["kv_transfers"] = counts["successful"]
    t.metrics["kv_transfers_failed"] = counts["failed"]
    decode = t.logs["decode"]()
    after_ready = nixl_failures(decode[t.decode_log_at_ready:])
    failed_first = len(first.get("failed") or [])
    # The failures logged before ready are the first request's (ready reports them); the stats may
    # count them only after ready (vLLM logs its stats every 10 s), so they excuse that many failed
    # transfers in the count and no more.
    unexplained = max(0, counts["failed"] - len(nixl_failures(decode[:t.decode_log_at_ready])))
    prefill = kv_transfers(t.logs["prefill"]())["successful"]
    explained = f", while {failed_first} failed first attempt(s) were retried (see ready)" if failed_first else ""
    detail = (f"the decode worker logged {counts['successful']} successful NIXL transfer(s) and {counts['failed']} "
              f"failed{explained} for {requests_sent} request(s) through the frontend (prefill worker: {prefill})")
    if after_ready:
        return FAIL, f"{detail}; after ready the decode worker logged NIXL failures: {summarize(after_ready)}"
    if unexplained or counts["successful"] < 1:
        return FAIL, f"{detail}; decode worker: {decode_failure_reason(decode)}"
    return PASS, detail


# Dynamo 1.6.1's file discovery (lib/runtime/src/storage/kv/file.rs): every process deletes any entry
# of a bucket it uses whose mtime is older than the 10 s TTL and logs `Expired path=...` (INFO); the
# frontend's watcher turns the deletion into a Removed event and drops the worker set for good
# ("Removed worker set from model"); the owner later logs "keep_alive failed". Measured here: the
# prefill worker expired the decode worker's entries while the decode worker, the frontend and the
# host-side lease holder all made no progress for ~30 s (the prefill worker's KV lease window).
_DROPPED = re.compile(r"^.*(?:Removed worker set|Removed empty model|keep_alive failed|Expired path=).*$", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def check_discovery(t: Target) -> tuple[str, str]:
    """Every worker stayed registered with the frontend for the whole probe: the frontend's /health
    still lists each instance it listed at ready (readiness.py; production's DYN_LOG=error leaves
    Dynamo's INFO lines out of the logs). Where the logs do say more, the detail names who expired
    whose entry ("[prefill] ... Expired path=..."), who dropped the worker set, and whose keep-alive
    found its files gone."""
    gone = t.workers.gone(t.http, t.base) if t.workers else {}
    lost = {role: [_ANSI.sub("", line)[:300] for line in _DROPPED.findall(read())] for role, read in t.logs.items()}
    lost = {role: lines for role, lines in lost.items() if lines}
    listed = f"the frontend still lists every worker it listed at ready ({t.workers.describe()}); " if t.workers else ""
    if not lost and not gone:
        return PASS, f"{listed}no worker left Dynamo's discovery (no expired entry, no worker set removed)"
    unlisted = "; ".join(f"the frontend no longer lists the {role} worker ({', '.join(sorted(ids))})" for role, ids in gone.items())
    logged = "; ".join(f"[{role}] " + " | ".join(lines[:3]) for role, lines in lost.items())
    return FAIL, ("a worker's Dynamo discovery entries expired (not refreshed for 10 s: the owner and the probe's "
                  "lease holder were starved) and the frontend dropped its worker set, so later requests get 404: "
                  + "; ".join(part for part in (unlisted, logged) if part))


# vLLM 0.31 (qwen_gdn_linear_attn.py) logs the kernels its Gated DeltaNet layers run, once per engine.
_GDN_KERNELS = re.compile(r"Using (\S+) GDN prefill kernel|GDN decode kernel: (\S+)")


def check_hybrid(t: Target) -> tuple[str, str]:
    """Every engine built the model's Gated DeltaNet layers (it logged their prefill and decode kernels)."""
    if not t.gdn_layers:
        return NOT_RUN, "the smoke model has no Gated DeltaNet layers"
    engines = {role: read() for role, read in t.logs.items() if role != "frontend"}
    found = {}
    for role, log in engines.items():
        kernels = _GDN_KERNELS.findall(log)
        found[role] = (next((p for p, _ in kernels if p), None), next((d for _, d in kernels if d), None))
    t.metrics["gdn_layers"] = t.gdn_layers
    t.metrics["gdn_kernels"] = {role: {"prefill": p, "decode": d} for role, (p, d) in found.items()}
    missing = [role for role, (p, d) in found.items() if not (p and d)]
    shown = ", ".join(f"{role}: prefill {p}, decode {d}" for role, (p, d) in found.items())
    if missing or not found:
        return FAIL, f"no Gated DeltaNet kernels logged by {', '.join(missing) or 'any engine'} ({shown})"
    return PASS, f"{t.gdn_layers} Gated DeltaNet layers served; kernels {shown}"


NO_ORACLE = "the smoke model is not one the project makes: the oracle's prompts are drawn from its vocabulary"


def _oracle_answers(t: Target) -> tuple[dict[str, Any], str]:
    """The oracle's answers from the target, and its failed prompts (empty: none). Needs t.oracle_vocab."""
    assert t.oracle_vocab is not None
    # As long as the frontend waits for a worker (a 2,000-token prefill on a starved core).
    answers = agreement.collect(t.base, t.model, t.oracle_vocab, timeout=max(t.timeout, FRONTEND_REQUEST_TIMEOUT_S))
    errors = [f"prompt {i} ({a['kind']}, {a['length']} tokens): {a['error']}" for i, a in enumerate(answers["answers"])
              if a.get("error")]
    return answers, summarize(errors)


def check_agreement_reference(t: Target) -> tuple[str, str]:
    """The aggregated server answers the oracle's prompts (1 to 2,000 token ids, and texts), at
    concurrency: the reference the disaggregated shape is held to, kept in smoke.json."""
    if t.oracle_vocab is None:
        return NOT_RUN, NO_ORACLE
    answers, problem = _oracle_answers(t)
    t.metrics["agreement_reference"] = answers
    if problem:
        return FAIL, f"the aggregated server failed oracle prompts: {problem}"
    said = (f"{len(answers['answers'])} prompts (lengths {min(agreement.LENGTHS)}-{max(agreement.LENGTHS)} token ids, "
            f"{len(agreement.TEXTS)} texts) answered greedily with log-probs in {answers['seconds']:.1f} s")
    # The control: the same server under the same load, held to its own answers one at a time. Where
    # batch composition alone parts it from them, the disaggregated shape may part there too.
    control = agreement.compare_loaded(answers, answers)
    t.metrics["agreement_control"] = control
    parted = f": {agreement.describe_loaded(control)}" if control["failed"] else ""
    return PASS, f"{said}; {agreement.loaded_summary(control)}, against its own answers one at a time{parted}"


def check_agreement(t: Target) -> tuple[str, str]:
    """The disaggregated shape gives the aggregated server's answers (clients/agreement.py: the same
    tokens up to a near tie, log-probs within its bound): the KV cache and the GDN state arrived whole."""
    if t.oracle_vocab is None:
        return NOT_RUN, NO_ORACLE
    if not t.baseline:
        return NOT_RUN, "the aggregated serving probe recorded no reference answers to compare with"
    answers, _ = _oracle_answers(t)  # a failed prompt is an "error" row of the comparison
    result = agreement.compare(t.baseline, answers)
    t.metrics["agreement"] = result
    t.metrics["agreement_answers"] = answers  # beside the reference's, for whoever reads a failure
    summary = agreement.summary(result)
    if answers["refused_attempts"]:
        summary += f"; {answers['refused_attempts']} attempts refused as unavailable (HTTP 503) and asked again"
    if not result["passed"]:
        return FAIL, f"{summary}: {agreement.describe_failures(result)}"
    return PASS, summary


ServingCheck = tuple[str, Callable[[Target], tuple[str, str]]]

ENDPOINT_CHECKS: tuple[ServingCheck, ...] = (
    ("health", check_health),
    ("models", check_models),
    ("completions", check_completions),
    ("sampled", check_sampled),
    ("chat", check_chat),
    ("stream", check_stream),
)
AGGREGATED_CHECKS: tuple[ServingCheck, ...] = (*ENDPOINT_CHECKS, ("metrics", check_vllm_metrics),
                                               ("hybrid", check_hybrid), ("gpu", check_gpu_path),
                                               ("agreement-reference", check_agreement_reference))
DISAGGREGATED_CHECKS: tuple[ServingCheck, ...] = (*ENDPOINT_CHECKS, ("hybrid", check_hybrid), ("gpu", check_gpu_path),
                                                  ("agreement", check_agreement),
                                                  ("kv-transfer", check_kv_transfer), ("discovery", check_discovery))
