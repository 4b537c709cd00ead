#!/usr/bin/env python3
"""5-shot GSM8K against an OpenAI-compatible /v1/completions endpoint.

Standalone: standard library only (urllib), because it is bind-mounted into the image under test
and run with the image's own python:

    python /opt/servestack-clients/gsm8k.py --base-url http://127.0.0.1:8000 --model NAME \
        --dataset test.jsonl --fewshot-from train.jsonl --num-questions 50 --shots 5 \
        --repeats 1 --concurrency 8 --out result.json

Prompt (lm-evaluation-harness `gsm8k` style): the first `shots` training examples as
"Question: <q>\nAnswer: <worked answer ending in #### N>" joined by a blank line, then
"Question: <q>\nAnswer:". Greedy decoding (temperature 0), stop sequences
["Question:", "</s>", "<|im_end|>"].

Two extractions are scored, as lm-eval does:
  strict   - the first "#### (\\-?[0-9\\.\\,]+)" in the completion;
  flexible - the last number in the completion.
Both are reported; servestack gates on `strict` (the conservative one: a model that does not follow
the few-shot answer format is not counted as right by luck of a trailing number).

The result JSON is written atomically (temp file + rename): accuracy per repeat, n, invalid
counts, request errors and timing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SCHEMA = "servestack.gsm8k/1"
STOP = ["Question:", "</s>", "<|im_end|>"]
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
INVALID = None
# What a retry's backoff waits with: one name, so a test can wait no time and see the waits asked for.
sleep = time.sleep


def normalize_number(text: str | None) -> str | None:
    """'1,234.00' -> '1234', '$5.' -> '5', '-3.50' -> '-3.5'; None/garbage -> None."""
    if text is None:
        return None
    s = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if not s or s in {"-", "."}:
        return None
    try:
        value = float(s)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    if value == int(value):
        return str(int(value))
    return repr(value)


def extract_strict(completion: str) -> str | None:
    m = STRICT_RE.search(completion)
    return normalize_number(m.group(1)) if m else INVALID


def extract_flexible(completion: str) -> str | None:
    matches = FLEXIBLE_RE.findall(completion)
    for groups in reversed(matches):
        candidate = normalize_number(groups[0] or groups[1])
        if candidate is not None:
            return candidate
    return INVALID


def reference_answer(answer: str) -> str:
    """The gold number of a GSM8K answer ('... #### 72')."""
    value = extract_strict(answer)
    if value is None:
        raise ValueError(f"GSM8K answer without '#### N': {answer[-80:]!r}")
    return value


def read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{lineno}: not JSON: {exc}") from None
            if "question" not in row or "answer" not in row:
                raise SystemExit(f"{path}:{lineno}: needs 'question' and 'answer'")
            rows.append(row)
    return rows


def fewshot_prefix(train: list[dict], shots: int) -> str:
    return "".join(f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" for ex in train[:shots])


def build_prompt(prefix: str, question: str) -> str:
    return f"{prefix}Question: {question}\nAnswer:"


def complete(base_url: str, model: str, prompt: str, max_tokens: int, timeout: float,
             retries: int = 3) -> tuple[str, int]:
    """One greedy completion; returns (text, completion_tokens). Retries transient failures."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stop": STOP, "seed": 0,
    }).encode()
    url = base_url.rstrip("/") + "/v1/completions"
    last: Exception | None = None
    for attempt in range(retries):
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = json.loads(resp.read())
            text = data["choices"][0]["text"] or ""
            tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
            return text, tokens
        except urllib.error.HTTPError as exc:
            last = exc
            if exc.code < 500:  # a 4xx will not get better by asking again
                break
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
            last = exc
        sleep(min(2 ** attempt, 5))
    raise RuntimeError(f"{type(last).__name__}: {last}")


def score(completions: list[str | None], golds: list[str]) -> dict:
    """Score completions (None = the request failed) against gold answers."""
    n = len(golds)
    strict_ok = flex_ok = strict_invalid = flex_invalid = errors = 0
    for text, gold in zip(completions, golds, strict=False):
        if text is None:
            errors += 1
            strict_invalid += 1
            flex_invalid += 1
            continue
        s, f = extract_strict(text), extract_flexible(text)
        strict_invalid += s is None
        flex_invalid += f is None
        strict_ok += s is not None and s == gold
        flex_ok += f is not None and f == gold
    return {
        "n": n,
        "correct_strict": strict_ok,
        "correct_flexible": flex_ok,
        "accuracy_strict": strict_ok / n if n else 0.0,
        "accuracy_flexible": flex_ok / n if n else 0.0,
        "invalid_strict": strict_invalid,
        "invalid_flexible": flex_invalid,
        "errors": errors,
    }


def run_repeat(args: argparse.Namespace, prompts: list[str], golds: list[str], index: int) -> dict:
    completions: list[str | None] = [None] * len(prompts)
    tokens = [0] * len(prompts)
    error_samples: list[str] = []

    def one(i: int) -> None:
        try:
            completions[i], tokens[i] = complete(args.base_url, args.model, prompts[i], args.max_tokens, args.timeout)
        except RuntimeError as exc:
            if len(error_samples) < 5:
                error_samples.append(f"question {i}: {exc}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.concurrency)) as pool:
        list(pool.map(one, range(len(prompts))))
    seconds = time.monotonic() - t0
    result = {"repeat": index, **score(completions, golds), "seconds": round(seconds, 3),
              "output_tokens": sum(tokens), "error_samples": error_samples}
    if args.save_completions:
        result["completions"] = completions
    return result


def atomic_write_json(path: str, value: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--dataset", required=True, help="test.jsonl")
    p.add_argument("--fewshot-from", required=True, help="train.jsonl (first --shots examples are used)")
    p.add_argument("--num-questions", type=int, default=50)
    p.add_argument("--shots", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--first-repeat", type=int, default=0, help="index of the first repeat (for resumed runs)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--save-completions", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    test = read_jsonl(args.dataset)[: args.num_questions]
    train = read_jsonl(args.fewshot_from)
    if len(train) < args.shots:
        raise SystemExit(f"{args.fewshot_from}: only {len(train)} examples for {args.shots} shots")
    prefix = fewshot_prefix(train, args.shots)
    prompts = [build_prompt(prefix, row["question"]) for row in test]
    golds = [reference_answer(row["answer"]) for row in test]

    started = time.time()
    repeats = []
    for r in range(args.first_repeat, args.first_repeat + args.repeats):
        rep = run_repeat(args, prompts, golds, r)
        print(f"gsm8k repeat {r}: strict {rep['accuracy_strict']:.4f} flexible {rep['accuracy_flexible']:.4f} "
              f"n={rep['n']} invalid={rep['invalid_strict']} errors={rep['errors']} {rep['seconds']:.1f}s",
              flush=True)
        repeats.append(rep)
    mean = lambda key: sum(r[key] for r in repeats) / len(repeats) if repeats else 0.0  # noqa: E731
    result = {
        "schema": SCHEMA,
        "model": args.model,
        "base_url": args.base_url,
        "num_questions": len(prompts),
        "shots": args.shots,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stop": STOP,
        "concurrency": args.concurrency,
        "gated_on": "strict",
        "repeats": repeats,
        "accuracy_strict_mean": mean("accuracy_strict"),
        "accuracy_flexible_mean": mean("accuracy_flexible"),
        "started_at": started,
        "seconds": round(time.time() - started, 3),
    }
    atomic_write_json(args.out, result)
    # Every request failing means the server is not answering: that is an error, not a score of 0.
    if repeats and all(r["errors"] == r["n"] for r in repeats) and prompts:
        print("gsm8k: every request failed", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
