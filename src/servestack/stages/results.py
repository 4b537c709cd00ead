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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servestack.clients import agreement
from servestack.errors import InputError
from servestack.runners.srtlogs import SRT_RESULT_RE


@dataclass(frozen=True, kw_only=True)
class ThroughputPoint:
    recipe: str
    concurrency: int
    requested: int  # num_prompts
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    duration_s: float
    request_throughput: float
    output_throughput: float  # output tokens/s, whole deployment
    total_token_throughput: float  # (input + output) tokens/s, whole deployment
    gpus: int
    tokens_per_s_per_gpu: float  # total_token_throughput / gpus
    tokens_per_s_per_user: float  # 1000 / median TPOT, else output_throughput / concurrency
    per_user_source: str  # "median_tpot" | "output_throughput/concurrency"
    median_ttft_ms: float | None
    median_tpot_ms: float | None
    median_itl_ms: float | None
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_itl_ms: float | None = None
    source: str = ""
    repeat: int = 0  # the point measured again (stages.throughput.repeats): 0, 1, ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class AccuracyRun:
    recipe: str
    repeat: int
    accuracy: float  # the gated number (strict match)
    n: int
    accuracy_flexible: float | None = None
    invalid: int = 0
    errors: int = 0
    seconds: float | None = None
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A gate that did not hold, by how much."""
    gate: str  # missing | completed | failed | output_tokens | accuracy | throughput | errors
    recipe: str
    point: str | None  # "c=16", "repeat 0", None for recipe-wide
    message: str
    measured: float | None = None
    required: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Check:
    """One gate applied to one measurement."""
    gate: str
    recipe: str
    point: str | None
    measured: float
    required: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class Verdict:
    stage: str
    failures: list[Failure] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "passed": self.passed,
                "failures": [f.to_dict() for f in self.failures],
                "checks": [c.to_dict() for c in self.checks]}


@dataclass(kw_only=True)
class StageResult:
    """What one stage measured and how it was judged; `results.json` is its `to_dict()`."""

    stack: str
    pipeline: str
    stage: str
    image: str
    runner: str
    out_dir: Path
    throughput: list[ThroughputPoint] = field(default_factory=list)
    accuracy: list[AccuracyRun] = field(default_factory=list)
    # The oracle's comparisons (clients/agreement.py compare, plus "recipe" and "reference"), one per
    # recipe held to the reference; its AccuracyRun is the fraction of prompts that agree.
    agreement: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # "<recipe>/<point>" with no result
    verdict: Verdict | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)  # job ids, attempts, end states
    # wall_seconds, client_seconds (inside the benchmark clients), server_startup_seconds,
    # benchmark_seconds, overhead_seconds (wall - client): see stages.run
    timing: dict[str, Any] = field(default_factory=dict)
    # {recipe: what makes two runs of it the same experiment}: input and output lengths, prompts,
    # accelerators, the runner, the recipe's resources and benchmark (stages.jobs.conditions;
    # compare.py compares only recipes whose conditions match)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparison: str = ""  # a baseline gate's comparison.md (comparisons.place), when held to one

    @property
    def passed(self) -> bool:
        return bool(self.verdict is not None and self.verdict.passed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "servestack.stage-result/1",
            "stack": self.stack,
            "pipeline": self.pipeline,
            "stage": self.stage,
            "image": self.image,
            "runner": self.runner,
            "passed": self.passed,
            "throughput": [p.to_dict() for p in sorted(self.throughput, key=lambda p: (p.recipe, p.concurrency, p.repeat))],
            "accuracy": [a.to_dict() for a in sorted(self.accuracy, key=lambda a: (a.recipe, a.repeat))],
            "agreement": self.agreement,
            "missing": sorted(self.missing),
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "jobs": self.jobs,
            "timing": self.timing,
            "conditions": self.conditions,
            "comparison": self.comparison,
        }


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


def _num(data: dict[str, Any], key: str, where: str, *, required: bool = True) -> float | None:
    value = data.get(key)
    if value is None:
        if required:
            raise InputError(where, key, "missing from the benchmark result")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(where, key, f"expected a number, got {value!r}")
    return float(value)


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
    total_tput = _num(data, "total_token_throughput", where, required=False)
    out_tput = _num(data, "output_throughput", where)
    if total_tput is None:  # very old results: derive from input throughput
        in_tput = _num(data, "input_throughput", where)
        total_tput = in_tput + out_tput
    tpot = _num(data, "median_tpot_ms", where, required=False)
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
        median_ttft_ms=_num(data, "median_ttft_ms", where, required=False),
        median_tpot_ms=tpot,
        median_itl_ms=_num(data, "median_itl_ms", where, required=False),
        p99_ttft_ms=_num(data, "p99_ttft_ms", where, required=False),
        p99_tpot_ms=_num(data, "p99_tpot_ms", where, required=False),
        p99_itl_ms=_num(data, "p99_itl_ms", where, required=False),
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
