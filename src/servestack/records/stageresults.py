"""A stage's results as typed values: `<run>/<stage>/results.json`, and each entry of the run's
`results.json` ("stages"). The stages write them; compare reads them back, as a stored side or a
published baseline.

Each record's JSON is its declaration (records/codec.py): a `StageResult` and a `Verdict` add `passed`
(and the result its schema) for the file's readers. Throughput and accuracy lists are written sorted, so a
rerun that finished its points in another order writes the same bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from servestack.records.codec import Record, decode, encode, json_quirks
from servestack.records.fields import Fields

SCHEMA = "servestack.stage-result/1"


@dataclass(frozen=True, kw_only=True)
class ThroughputPoint(Record):
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



@dataclass(frozen=True, kw_only=True)
class AccuracyRun(Record):
    recipe: str
    repeat: int
    accuracy: float  # the gated number (strict match)
    n: int
    accuracy_flexible: float | None = None
    invalid: int = 0
    errors: int = 0
    seconds: float | None = None
    source: str = ""



@dataclass(frozen=True, kw_only=True)
class Failure(Record):
    """A gate that did not hold, by how much."""
    gate: str  # missing | completed | failed | output_tokens | accuracy | throughput | errors
    recipe: str
    point: str | None  # "c=16", "repeat 0", None for recipe-wide
    message: str
    measured: float | None = None
    required: float | None = None



@dataclass(frozen=True, kw_only=True)
class Check(Record):
    """One gate applied to one measurement."""
    gate: str
    recipe: str
    point: str | None
    measured: float
    required: float
    passed: bool



@dataclass(frozen=True, kw_only=True)
class Verdict(Record):
    """A stage's gates: what held (`checks`) and what did not (`failures`); the gates add to both."""
    stage: str
    failures: list[Failure] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {**encode(self), "passed": self.passed}  # for readers of the file; read back from its parts

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        return decode(cls, f, also=("passed",))


@dataclass(frozen=True, kw_only=True)
class StageResult(Record):
    """What one stage measured and how it was judged; `results.json` is its `to_json()`."""

    stack: str
    pipeline: str
    stage: str
    image: str
    runner: str
    out_dir: Path = field(metadata=json_quirks(written=False))  # where its files are: a reader says where it found them
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
        # Lists in a fixed order: a rerun that finished its points in another order writes the same bytes.
        ordered = dataclasses.replace(self, throughput=self.points_in_order, accuracy=self.runs_in_order,
                                      missing=sorted(self.missing))
        return {**encode(ordered), "schema": SCHEMA, "passed": self.passed}

    @classmethod
    def from_json(cls, f: Fields, *, out_dir: Path) -> Self:  # type: ignore[override]
        return decode(cls, f, also=("schema", "passed"), given={"out_dir": out_dir})
