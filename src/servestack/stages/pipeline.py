"""pipelines/<name>.yaml: which recipes each stage runs, on which runner, gated how.

The models below are the file's format: each option is declared once, with its default, and
`load_pipeline` reports every problem at once with file:line:col, the field and what was expected
("did you mean" for a misspelled key). An example (every option, with its default where it has one):

    stack: dev-cpu
    runner:
      kind: local                  # a name in runners.selection.RUNNERS
      python: python3              # the image's interpreter
      slurm: {partition: null, account: null, container: auto, extra_sbatch: [], local_cluster: false}
      srtctl: {executable: srtctl, output_dir: null}
      disaggregated: null          # the runner for disaggregated recipes `kind` cannot start (srtctl)
    retry: {max_attempts: 3, poll_seconds: 5}  # retry_on: the end states resubmitted (runners.interface.RETRYABLE)
    model_dir: null                # host model dir mounted at /model (default: recipe model.path)
    model_paths: {tiny-qwen35: /opt/servestack/models/servestack/tiny-qwen35}  # alias -> dir in the image
    data_dir: data/gsm8k           # relative to the project root (default: the shipped GSM8K)
    server: {port: 8000, startup_timeout: 15m, extra_flags: {}}
    stages:
      accuracy:
        recipes: [agg-acc]
        time_limit: 30m
        gsm8k: {num_questions: 50, shots: 5, repeats: 1, concurrency: 8, max_tokens: 256}
        gate: {threshold: 0.0}
      throughput:
        recipes: [agg]
        time_limit: 30m
        concurrencies: [1, 4, 8]   # default: the recipe's benchmark.concurrencies
        input_len: 128             # default: recipe benchmark.isl
        output_len: 32             # default: recipe benchmark.osl
        prompts_per_concurrency: 4 # default: recipe benchmark.num_prompts_mult, else 10
        gate: {tolerance: 0.1, baselines: {agg: {1: 100.0}}}

Each runner's section (`runner.slurm`, `runner.srtctl`) is that runner's own settings model, from
the registry.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, PrivateAttr, create_model, model_validator

from servestack.clients import agreement
from servestack.compare.verdicts import Policy
from servestack.errors import FieldProblem
from servestack.records.imageref import names_a_digest
from servestack.runners.driver import RetryPolicy
from servestack.runners.interface import RETRYABLE, JobState
from servestack.runners.selection import RUNNERS, starting
from servestack.stages.gates import GateConfig
from servestack.util import yamlfile
from servestack.util.project import Project
from servestack.util.yamlfile import UserModel, exactly_one


def parse_duration(value: Any) -> int:
    """Seconds from 90 | "90s" | "30m" | "2h" | "1d" | "HH:MM:SS" | "MM:SS"."""
    if isinstance(value, bool):
        raise ValueError("expected a duration")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("must be positive")
        return int(value)
    s = str(value).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", s)
    if m:
        n = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        if n <= 0:
            raise ValueError("must be positive")
        return int(n)
    parts = s.split(":")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        secs = 0
        for p in parts:
            secs = secs * 60 + int(p)
        if secs <= 0:
            raise ValueError("must be positive")
        return secs
    raise ValueError(f"{value!r} is not a duration (90, '90s', '30m', '2h', 'HH:MM:SS')")


def _retry_state(value: Any) -> JobState:
    state = JobState.parse(str(value))
    if not state.unfinished_end:
        ends = " ".join(s.value for s in JobState if s.unfinished_end)
        raise ValueError(f"{value!r} is not an end state a job can be retried from ({ends})")
    return state


def _image_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r}: expected the absolute path of the model directory in the image")
    return value


Seconds = Annotated[int, BeforeValidator(parse_duration)]  # a duration in the file, seconds here
Positive = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Name = Annotated[str, Field(min_length=1)]


class RunnerSettings(UserModel):
    """`runner:`; `pipeline_model()` narrows `kind` and `disaggregated` to the registry's names and adds
    one section per runner that has settings."""

    kind: str = "local"
    disaggregated: str | None = None
    python: str = "python3"


class RetrySettings(UserModel):
    max_attempts: Positive = RetryPolicy.max_attempts
    retry_on: frozenset[Annotated[JobState, BeforeValidator(_retry_state)]] = RETRYABLE
    poll_seconds: Annotated[float, Field(ge=0.1, le=3600)] = 5.0

    def policy(self) -> RetryPolicy:
        return RetryPolicy(max_attempts=self.max_attempts, retry_on=self.retry_on)


class ServerSettings(UserModel):
    port: Positive = 8000
    startup_timeout: Seconds = 900
    extra_flags: dict[str, Any] = {}  # over the recipe's server flags


class Gsm8kSettings(UserModel):
    num_questions: Positive = 50
    shots: Annotated[int, Field(ge=0)] = 5
    repeats: Positive = 1
    concurrency: Positive = 8
    max_tokens: Positive = 256


class AccuracyGate(UserModel):
    """GSM8K: `threshold`, the minimum mean strict accuracy. Or the oracle for a model without trained
    weights (clients/agreement.py): `agreement_with`, the recipe whose greedy answers every other
    recipe of the stage must give (same tokens up to a near tie, log-probs within the bound)."""

    threshold: Fraction | None = None
    agreement_with: Name | None = None

    @model_validator(mode="after")
    def _one_gate(self) -> AccuracyGate:
        exactly_one(self, {"threshold": "GSM8K", "agreement_with": "the oracle's reference recipe"})
        return self

    def config(self) -> GateConfig:
        return GateConfig(accuracy_threshold=self.threshold)


class ThroughputGate(UserModel):
    tolerance: Fraction = 0.0
    baselines: dict[str, dict[Positive, Annotated[float, Field(ge=0.0)]]] = {}  # {recipe: {concurrency: tok/s/GPU}}
    # Held to another image's results (compare.py): a run id of this stack, a run directory, a
    # directory `servestack pull` wrote, or REGISTRY/REPO@sha256:... (its publication is pulled and
    # verified with baseline_key). A point fails when its tokens/s per GPU regressed beyond both
    # regression_threshold and the repeats' noise, or when the repeats are too few to tell.
    baseline: str | None = None
    baseline_key: Path | None = None
    # Measured alongside: the baseline (an image by digest) and this image in one interleaved
    # session, ABBA rounds per point until decided (interleave.py); else the baseline's stored results.
    alongside: bool = False
    regression_threshold: Fraction = 0.10
    regression_alpha: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.05
    min_rounds: Annotated[int, Field(ge=2)] = 3
    max_rounds: Annotated[int, Field(ge=2)] = 8  # the budget: a point open after it is "undecided"
    undecided_fails: bool = True  # a point the budget could not decide fails the gate

    @model_validator(mode="after")
    def _alongside_needs_an_image(self) -> ThroughputGate:
        if self.alongside and not names_a_digest(self.baseline):
            raise FieldProblem(("alongside",), "measuring alongside runs the baseline: name it as "
                               "baseline: REGISTRY/REPO@sha256:<64 hex>")
        return self

    def config(self) -> GateConfig:
        return GateConfig(baselines=self.baselines, tolerance=self.tolerance)

    def policy(self) -> Policy:
        return Policy(threshold=self.regression_threshold, alpha=self.regression_alpha, min_rounds=self.min_rounds,
                      max_rounds=max(self.max_rounds, self.min_rounds), undecided_fails=self.undecided_fails)


class _Stage(UserModel):
    name: ClassVar[str]
    recipes: Annotated[tuple[Name, ...], Field(min_length=1)]
    time_limit: Seconds = 3600
    gpus: Positive | None = None  # over the recipe-derived GPU count

    @property
    def kind(self) -> str:
        """What it measures and how it is judged: its entry in stages.kinds.STAGE_KINDS."""
        return self.name


class AccuracyStage(_Stage):
    name: ClassVar[str] = "accuracy"
    gate: AccuracyGate
    gsm8k: Gsm8kSettings = Gsm8kSettings()

    @model_validator(mode="after")
    def _reference_is_run(self) -> AccuracyStage:
        ref = self.gate.agreement_with
        if ref is not None and (ref not in self.recipes or len(self.recipes) < 2):
            raise FieldProblem(("gate", "agreement_with"), f"the reference must be one of this stage's recipes "
                               f"({', '.join(self.recipes)}), beside at least one other to hold to it")
        return self

    @property
    def kind(self) -> str:
        """GSM8K held to a threshold, or the oracle: held to the reference recipe's answers."""
        return "accuracy" if self.gate.agreement_with is None else "agreement"

    @property
    def points(self) -> tuple[str, ...]:
        """One answers file per recipe for the oracle; one result per GSM8K repeat."""
        if self.gate.agreement_with is not None:
            return (agreement.POINT,)
        return tuple(f"repeat-{i}" for i in range(self.gsm8k.repeats))



def _distinct(points: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if points is not None and len(set(points)) != len(points):
        raise ValueError("concurrency points repeat")
    return points


class ThroughputStage(_Stage):
    name: ClassVar[str] = "throughput"
    gate: ThroughputGate = ThroughputGate()
    # default: the recipe's benchmark.concurrencies, isl, osl, num_prompts_mult (else 10)
    concurrencies: Annotated[tuple[Positive, ...] | None, Field(min_length=1), AfterValidator(_distinct)] = None
    input_len: Positive | None = None
    output_len: Positive | None = None
    prompts_per_concurrency: Positive | None = None
    min_prompts: Positive = 1
    # Each point measured this many times: what a verdict against a stored baseline reads the noise
    # from (verdicts.py: 3 is the fewest it judges). Measured alongside, the rounds decide instead.
    repeats: Positive = 1

    @model_validator(mode="after")
    def _baselines_for_own_recipes(self) -> ThroughputStage:
        for recipe in self.gate.baselines:
            if recipe not in self.recipes:
                raise FieldProblem(("gate", "baselines", recipe), "baseline for a recipe this stage "
                                   f"does not run ({', '.join(self.recipes)})")
        return self


Stage = AccuracyStage | ThroughputStage


class Stages(UserModel):
    accuracy: AccuracyStage | None = None
    throughput: ThroughputStage | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> Stages:
        if not self.defined():
            raise ValueError(f"expected at least one of {', '.join(STAGES)}")
        return self

    def defined(self) -> dict[str, Stage]:
        """The stages this pipeline runs, in the order they run."""
        return {name: getattr(self, name) for name in STAGES if getattr(self, name) is not None}


STAGES = tuple(Stages.model_fields)  # the order stages run in


class Pipeline(UserModel):
    stack: Name  # pins/<stack>.yaml
    description: str | None = None
    runner: RunnerSettings = RunnerSettings()
    retry: RetrySettings = RetrySettings()
    model_dir: yamlfile.RelativePath | None = None  # host model dir mounted at /model
    data_dir: yamlfile.RelativePath | None = None  # GSM8K (default: the shipped copy)
    # srt-slurm's model_paths: recipe model.path alias -> the model directory inside the image
    model_paths: dict[str, Annotated[str, AfterValidator(_image_path)]] = {}
    server: ServerSettings = ServerSettings()
    stages: Stages
    _file: Path = PrivateAttr(default=Path("pipeline.yaml"))

    @property
    def file(self) -> Path:
        return self._file

    @property
    def name(self) -> str:
        return self._file.stem


@functools.lru_cache(maxsize=8)
def _model(runners: tuple[tuple[str, type[BaseModel] | None], ...], disaggregated: tuple[str, ...]) -> type[Pipeline]:
    sections: dict[str, Any] = {name: (settings, settings()) for name, settings in runners if settings}
    kinds = tuple(name for name, _ in runners)
    runner = create_model("RunnerSettings", __base__=RunnerSettings,
                          # The names come from the runner table at run time: pydantic reads them, mypy cannot.
                          kind=(Literal[kinds], "local"),  # type: ignore[arg-type]
                          # the runner for the disaggregated recipes when `kind` cannot start them
                          disaggregated=(Literal[disaggregated] | None, None),  # type: ignore[arg-type]
                          **sections)
    return create_model("Pipeline", __base__=Pipeline, runner=(runner, runner()))


def pipeline_model() -> type[Pipeline]:
    """The pipeline file's model for the runners registered now."""
    return _model(tuple((name, kind.settings) for name, kind in RUNNERS.items()), starting("disaggregated"))


def load_pipeline(file: Path, project_root: Path | None = None) -> Pipeline:
    """pipelines/<name>.yaml; paths in it are relative to the project root."""
    file = Path(file)
    root = project_root or file.resolve().parent.parent
    pipeline = yamlfile.load_model(file, pipeline_model(), "a mapping of pipeline fields (stack, runner, stages)",
                                   base=root)
    pipeline._file = file
    return pipeline


def regression_policy(project: Project, name: str) -> Policy:
    """pipelines/<name>.yaml's throughput gate's verdict policy: what `compare` and `bump` judge by;
    the defaults where there is no such file or it has no throughput stage."""
    file = project.pipelines / f"{name}.yaml"
    stage = load_pipeline(file, project.root).stages.throughput if file.exists() else None
    return stage.gate.policy() if stage is not None else Policy()
