"""Normalized stage results, and parsers for the files the clients and srt-slurm write.

Throughput: vLLM's serving benchmark (`vllm bench serve --save-result`, vllm/benchmarks/serve.py)
writes one JSON per run with, among others: num_prompts, max_concurrency, completed, failed,
total_input_tokens, total_output_tokens, request_throughput, output_throughput,
total_token_throughput, duration, and {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms.
srt-slurm's sa-bench (a fork of vLLM's benchmark_serving.py) writes the same keys to
`<log dir>/sa-bench_isl_<ISL>_osl_<OSL>/results_concurrency_<C>_gpus_<G>[_ctx_<P>_gen_<D>].json`;
older vLLM versions and sa-bench may lack `failed`, in which case failed = num_prompts - completed.

Per-user tokens/s (the x axis of the Pareto plot) is 1000 / median TPOT (ms): the decode speed a
single stream sees, which is what "tok/s/user" means in the usual throughput-vs-interactivity
plots. When TPOT is missing or zero (e.g. output length 1) it falls back to
output_throughput / concurrency. Per-GPU throughput is total_token_throughput / gpus.

Accuracy: servestack's gsm8k client writes `repeats[]` with accuracy_strict (gated) and
accuracy_flexible; srt-slurm's gsm8k_eval.py writes {accuracy, num_questions, invalid_rate}.

The normalized results themselves are records/stageresults.py's (results.json's schema).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servestack.clients import agreement
from servestack.errors import InputError
from servestack.records.stageresults import (  # noqa: F401  (re-exported: where the stages have always found them)
    AccuracyRun,
    Check,
    Failure,
    StageResult,
    ThroughputPoint,
    Verdict,
)
from servestack.runners.srtlogs import SRT_RESULT_RE


def _load_json(source: Path | dict[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(source, dict):
        return source, "<dict>"
    path = Path(source)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "", "result file not found") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, "", f"not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise InputError(path, "", "expected a JSON object")
    return data, str(path)


def _num_or_none(data: dict[str, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(where, key, f"expected a number, got {value!r}")
    return float(value)


def _num(data: dict[str, Any], key: str, where: str) -> float:
    value = _num_or_none(data, key, where)
    if value is None:
        raise InputError(where, key, "missing from the benchmark result")
    return value


def throughput_point(concurrency: int, repeat: int = 0) -> str:
    """A throughput point's name (its result file's stem): the concurrency, and `-r<k>` for a repeat."""
    return str(concurrency) if repeat == 0 else f"{concurrency}-r{repeat}"


def parse_throughput_point(name: str) -> tuple[int, int]:
    """(concurrency, repeat) from a throughput point's name."""
    conc, _, repeat = name.partition("-r")
    if not conc.isdigit() or (repeat and not repeat.isdigit()):
        raise ValueError(f"not a throughput point name (<concurrency>[-r<repeat>]): {name!r}")
    return int(conc), int(repeat or 0)


def parse_vllm_result(source: Path | dict[str, Any], *, recipe: str, gpus: int,
                      concurrency: int | None = None) -> ThroughputPoint:
    """Normalize one vLLM `bench serve --save-result` JSON (or sa-bench's, same keys)."""
    data, where = _load_json(source)
    if gpus < 1:
        raise InputError(where, "gpus", f"must be >= 1, got {gpus}")
    conc = data.get("max_concurrency")
    if conc is None:
        if concurrency is None:
            raise InputError(where, "max_concurrency", "missing (the run had no concurrency limit)")
        conc = concurrency
    elif concurrency is not None and int(conc) != concurrency:
        raise InputError(where, "max_concurrency", f"is {conc}, but the file is for concurrency {concurrency}")
    conc = int(conc)
    completed = int(_num(data, "completed", where))
    requested = data.get("num_prompts")
    requested = int(requested) if isinstance(requested, (int, float)) else completed
    failed = data.get("failed")
    failed = int(failed) if isinstance(failed, (int, float)) else max(0, requested - completed)
    total_tput = _num_or_none(data, "total_token_throughput", where)
    out_tput = _num(data, "output_throughput", where)
    if total_tput is None:  # very old results: derive from input throughput
        in_tput = _num(data, "input_throughput", where)
        total_tput = in_tput + out_tput
    tpot = _num_or_none(data, "median_tpot_ms", where)
    if tpot and tpot > 0:
        per_user, per_user_source = 1000.0 / tpot, "median_tpot"
    else:
        per_user, per_user_source = out_tput / conc if conc else 0.0, "output_throughput/concurrency"
    return ThroughputPoint(
        recipe=recipe,
        concurrency=conc,
        requested=requested,
        completed=completed,
        failed=failed,
        input_tokens=int(data.get("total_input_tokens") or 0),
        output_tokens=int(_num(data, "total_output_tokens", where)),
        duration_s=float(data.get("duration") or 0.0),
        request_throughput=float(data.get("request_throughput") or 0.0),
        output_throughput=out_tput,
        total_token_throughput=total_tput,
        gpus=gpus,
        tokens_per_s_per_gpu=total_tput / gpus,
        tokens_per_s_per_user=per_user,
        per_user_source=per_user_source,
        median_ttft_ms=_num(data, "median_ttft_ms", where),
        median_tpot_ms=tpot,
        median_itl_ms=_num(data, "median_itl_ms", where),
        p99_ttft_ms=_num(data, "p99_ttft_ms", where),
        p99_tpot_ms=_num(data, "p99_tpot_ms", where),
        p99_itl_ms=_num(data, "p99_itl_ms", where),
        source=where,
    )


def parse_srt_result(path: Path, *, recipe: str) -> ThroughputPoint:
    """One srt-slurm sa-bench result file; the GPU count comes from its file name."""
    m = SRT_RESULT_RE.search(Path(path).name)
    if not m:
        raise InputError(path, "", "not an sa-bench result name (results_concurrency_<C>_gpus_<G>[...].json)")
    gpus = int(m.group(2)) or 1
    return parse_vllm_result(path, recipe=recipe, gpus=gpus, concurrency=int(m.group(1)))


def parse_gsm8k_result(source: Path | dict[str, Any], *, recipe: str) -> list[AccuracyRun]:
    """servestack's gsm8k client result (one AccuracyRun per repeat) or srt-slurm's gsm8k_eval."""
    data, where = _load_json(source)
    if "repeats" in data:
        runs = []
        for i, rep in enumerate(data["repeats"]):
            if "accuracy_strict" not in rep or "n" not in rep:
                raise InputError(where, f"repeats[{i}]", "needs accuracy_strict and n")
            runs.append(AccuracyRun(
                recipe=recipe, repeat=int(rep.get("repeat", i)), accuracy=float(rep["accuracy_strict"]),
                n=int(rep["n"]), accuracy_flexible=rep.get("accuracy_flexible"),
                invalid=int(rep.get("invalid_strict", 0)), errors=int(rep.get("errors", 0)),
                seconds=rep.get("seconds"), source=where,
            ))
        return runs
    if "accuracy" in data and "num_questions" in data:  # srt-slurm gsm8k_eval.py --save-results
        n = int(data["num_questions"])
        return [AccuracyRun(recipe=recipe, repeat=0, accuracy=float(data["accuracy"]), n=n,
                            invalid=round(float(data.get("invalid_rate", 0.0)) * n),
                            seconds=data.get("latency"), source=where)]
    raise InputError(where, "", "not a GSM8K result (expected 'repeats' or 'accuracy' + 'num_questions')")


def load_answers(source: Path) -> dict[str, Any]:
    """One recipe's oracle answers (clients/agreement.py collect), checked for their schema."""
    data, where = _load_json(source)
    if data.get("schema") != agreement.SCHEMA or not isinstance(data.get("answers"), list) or not data["answers"]:
        raise InputError(where, "schema", f"expected {agreement.SCHEMA} answers (clients/agreement.py collect)")
    return data


def compare_answers(answers: dict[str, dict[str, Any]], reference: str) -> tuple[list[dict[str, Any]], list[AccuracyRun]]:
    """Every recipe's answers against the reference recipe's: the comparisons, and per recipe the
    fraction of prompts that agree as an AccuracyRun (n prompts, errors those that failed)."""
    if reference not in answers:
        return [], []
    comparisons, runs = [], []
    for recipe in sorted(answers):
        if recipe == reference:
            continue
        try:
            result = agreement.compare(answers[reference], answers[recipe])
        except ValueError as e:
            raise InputError(Path(f"{recipe}/answers"), "answers", f"not comparable with {reference}'s: {e}") from e
        comparisons.append({"recipe": recipe, "reference": reference, **result,
                            "warmup": {side: answers[side].get("warmup") for side in (reference, recipe)},
                            "refused_attempts": {side: answers[side].get("refused_attempts", 0)
                                                 for side in (reference, recipe)}})
        errors = sum(1 for row in result["rows"] if row["verdict"] == "error")
        agreed = result["requests"] - result["disagreeing"]
        runs.append(AccuracyRun(recipe=recipe, repeat=0, accuracy=agreed / result["requests"], n=result["requests"], errors=errors,
                                seconds=answers[recipe].get("seconds"), source=f"agreement with {reference}"))
    return comparisons, runs
