"""A stage's results as typed values: `<run>/<stage>/results.json`, and each entry of the run's
`results.json` ("stages"). The stages write them; compare reads them back, as a stored side or a
published baseline.

Each record's JSON is its declaration: `to_json` writes every field (a `StageResult` adds its schema
and `passed`), `from_json` reads every field back, with its declared default where an older file has
none. Throughput and accuracy lists are written sorted, so a rerun that finished its points in
another order writes the same bytes.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from servestack.records.fields import Fields

SCHEMA = "servestack.stage-result/1"

R = TypeVar("R")


def _record_class(hint: Any) -> Any:
    """The record type a field holds, itself or as `X | None`; None for plain JSON data."""
    if get_origin(hint) in (Union, types.UnionType):
        hint = next((a for a in get_args(hint) if a is not type(None)), None)
    return hint if isinstance(hint, type) and hasattr(hint, "from_json") else None


def _declared(cls: type[R], f: Fields, given: dict[str, Any] | None = None) -> R:
    """`cls` with each field read from `f` as declared: records by their own reader, lists of records
    item by item, the rest as plain JSON; a field the file lacks takes its declared default."""
    hints = get_type_hints(cls)
    values: dict[str, Any] = dict(given or {})
    for fl in dataclasses.fields(cls):  # type: ignore[arg-type]
        if fl.name in values:
            continue
        if not f.has(fl.name):
            if fl.default is not dataclasses.MISSING:
                values[fl.name] = fl.default
            elif fl.default_factory is not dataclasses.MISSING:
                values[fl.name] = fl.default_factory()
            else:
                f.json(fl.name)  # raises: missing, and what was expected
            continue
        hint = hints[fl.name]
        item = _record_class(get_args(hint)[0]) if get_origin(hint) is list and get_args(hint) else None
        record = _record_class(hint)
        if item is not None:
            values[fl.name] = list(f.items(fl.name, item.from_json))
        elif record is not None and f.json(fl.name) is not None:
            values[fl.name] = record.from_json(f.obj(fl.name))
        else:
            values[fl.name] = f.json(fl.name)
    return cls(**values)


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, f: Fields) -> ThroughputPoint:
        return _declared(cls, f)


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, f: Fields) -> AccuracyRun:
        return _declared(cls, f)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A gate that did not hold, by how much."""
    gate: str  # missing | completed | failed | output_tokens | accuracy | throughput | errors
    recipe: str
    point: str | None  # "c=16", "repeat 0", None for recipe-wide
    message: str
    measured: float | None = None
    required: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, f: Fields) -> Failure:
        return _declared(cls, f)


@dataclass(frozen=True, kw_only=True)
class Check:
    """One gate applied to one measurement."""
    gate: str
    recipe: str
    point: str | None
    measured: float
    required: float
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, f: Fields) -> Check:
        return _declared(cls, f)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A stage's gates: what held (`checks`) and what did not (`failures`); the gates add to both."""
    stage: str
    failures: list[Failure] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "passed": self.passed,
                "failures": [f.to_json() for f in self.failures],
                "checks": [c.to_json() for c in self.checks]}

    @classmethod
    def from_json(cls, f: Fields) -> Verdict:
        return _declared(cls, f)


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """What one stage measured and how it was judged; `results.json` is its `to_json()`."""

    stack: str
    pipeline: str
    stage: str
    image: str
    runner: str
    out_dir: Path  # where its files are (not written: a reader says where it found them)
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

    @property
    def points_in_order(self) -> list[ThroughputPoint]:
        """The throughput points by recipe, concurrency and repeat, as results.json lists them."""
        return sorted(self.throughput, key=lambda p: (p.recipe, p.concurrency, p.repeat))

    @property
    def runs_in_order(self) -> list[AccuracyRun]:
        """The accuracy runs by recipe and repeat, as results.json lists them."""
        return sorted(self.accuracy, key=lambda a: (a.recipe, a.repeat))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "stack": self.stack,
            "pipeline": self.pipeline,
            "stage": self.stage,
            "image": self.image,
            "runner": self.runner,
            "passed": self.passed,
            "throughput": [p.to_json() for p in self.points_in_order],
            "accuracy": [a.to_json() for a in self.runs_in_order],
            "agreement": self.agreement,
            "missing": sorted(self.missing),
            "verdict": self.verdict.to_json() if self.verdict is not None else None,
            "jobs": self.jobs,
            "timing": self.timing,
            "conditions": self.conditions,
            "comparison": self.comparison,
        }

    @classmethod
    def from_json(cls, f: Fields, *, out_dir: Path) -> StageResult:
        return _declared(cls, f, {"out_dir": out_dir})
