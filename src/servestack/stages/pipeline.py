"""pipelines/<name>.yaml: which recipes each stage runs, on which runner, gated how.

    stack: dev-cpu
    runner:
      kind: local                  # local | slurm | srtctl
      python: python3              # the image's interpreter
      slurm: {partition: null, account: null, container: docker, extra_sbatch: []}
      srtctl: {executable: srtctl, output_dir: null}
    retry: {max_attempts: 3, retry_on: [PREEMPTED, NODE_FAIL, TIMEOUT, CANCELLED], poll_seconds: 5}
    model_dir: null                # host model dir mounted at /model (default: recipe model.path)
    model_paths: {tiny-qwen3: /opt/servestack/models/servestack/tiny-qwen3}  # alias -> dir in the image
    data_dir: data/gsm8k           # relative to the project root (default: the shipped GSM8K)
    server: {port: 8000, startup_timeout: 15m}
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

Every error names the file, line and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from .. import yamlfile
from ..runners.base import JobState
from ..runners.slurm import CONTAINER_MODES
from .gates import GateConfig

STAGES = ("accuracy", "throughput")
RUNNER_KINDS = ("local", "slurm", "srtctl")


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


@dataclass(frozen=True)
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    container: str = "auto"  # pyxis when the cluster has it, else docker (runners.slurm.preflight)
    extra_sbatch: tuple[str, ...] = ()
    local_cluster: bool = False  # start this machine's one-node Slurm (services.ensure_slurm)


@dataclass(frozen=True)
class SrtctlSettings:
    executable: tuple[str, ...] = ("srtctl",)
    output_dir: Path | None = None


@dataclass(frozen=True)
class RunnerSettings:
    kind: str = "local"
    python: str = "python3"
    slurm: SlurmSettings = SlurmSettings()
    srtctl: SrtctlSettings = SrtctlSettings()


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = 3
    on: frozenset[JobState] = frozenset({JobState.PREEMPTED, JobState.NODE_FAIL, JobState.TIMEOUT,
                                         JobState.CANCELLED})
    poll_seconds: float = 5.0


@dataclass(frozen=True)
class Gsm8kSettings:
    num_questions: int = 50
    shots: int = 5
    repeats: int = 1
    concurrency: int = 8
    max_tokens: int = 256


@dataclass(frozen=True)
class StageSettings:
    name: str
    recipes: tuple[str, ...]
    time_limit_s: int
    gate: GateConfig
    gsm8k: Gsm8kSettings = Gsm8kSettings()
    concurrencies: tuple[int, ...] | None = None
    input_len: int | None = None
    output_len: int | None = None
    prompts_per_concurrency: int | None = None
    min_prompts: int = 1
    gpus: int | None = None  # override the recipe-derived GPU count


@dataclass(frozen=True)
class Pipeline:
    file: Path
    name: str
    stack: str
    runner: RunnerSettings
    retry: RetrySettings
    stages: dict[str, StageSettings]
    model_dir: Path | None = None
    data_dir: Path | None = None
    server_port: int = 8000
    server_startup_timeout_s: int = 900
    extra_server_flags: dict[str, Any] = field(default_factory=dict)
    # srt-slurm's model_paths: recipe model.path alias -> the model directory inside the image
    model_paths: dict[str, str] = field(default_factory=dict)


def _expect_map(doc: yamlfile.Document, path: tuple, value: Any, known: set[str]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise doc.error(path, f"expected a mapping, got {type(value).__name__}")
    for k in value:
        if k not in known:
            raise doc.error((*path, k), f"unknown field (known: {', '.join(sorted(known))})")
    return value


def _int(doc: yamlfile.Document, path: tuple, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.error(path, f"expected an integer, got {value!r}")
    if value < minimum:
        raise doc.error(path, f"must be >= {minimum}, got {value}")
    return value


def _float(doc: yamlfile.Document, path: tuple, value: Any, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise doc.error(path, f"expected a number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise doc.error(path, f"must be within [{lo}, {hi}], got {value}")
    return float(value)


def _duration(doc: yamlfile.Document, path: tuple, value: Any) -> int:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise doc.error(path, str(exc)) from None


def _str_list(doc: yamlfile.Document, path: tuple, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise doc.error(path, "expected a non-empty list of names")
    return tuple(value)


def load_pipeline(file: Path, project_root: Path | None = None) -> Pipeline:
    file = Path(file)
    doc = yamlfile.load(file)
    root = project_root or file.resolve().parent.parent
    top = _expect_map(doc, (), doc.data, {"stack", "runner", "retry", "model_dir", "data_dir", "server",
                                           "stages", "description", "model_paths"})
    stack = top.get("stack")
    if not isinstance(stack, str) or not stack:
        raise doc.error(("stack",), "required: the stack name (pins/<stack>.yaml)")

    r = _expect_map(doc, ("runner",), top.get("runner"), {"kind", "python", "slurm", "srtctl"})
    kind = r.get("kind", "local")
    if kind not in RUNNER_KINDS:
        raise doc.error(("runner", "kind"), f"{kind!r} is not one of {', '.join(RUNNER_KINDS)}")
    s = _expect_map(doc, ("runner", "slurm"), r.get("slurm"),
                    {"partition", "account", "container", "extra_sbatch", "local_cluster"})
    container = s.get("container", "auto")
    if container not in CONTAINER_MODES:
        raise doc.error(("runner", "slurm", "container"), f"{container!r} is not one of {', '.join(CONTAINER_MODES)}")
    extra = s.get("extra_sbatch") or []
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise doc.error(("runner", "slurm", "extra_sbatch"), "expected a list of sbatch options")
    t = _expect_map(doc, ("runner", "srtctl"), r.get("srtctl"), {"executable", "output_dir"})
    exe = t.get("executable", "srtctl")
    if isinstance(exe, str):
        exe_t: tuple[str, ...] = (exe,)
    elif isinstance(exe, list) and exe and all(isinstance(x, str) for x in exe):
        exe_t = tuple(exe)
    else:
        raise doc.error(("runner", "srtctl", "executable"), "expected a command (string or list)")
    exe_t = tuple(str((root / x).resolve()) if x.startswith(("./", "../")) else x for x in exe_t)
    runner = RunnerSettings(
        kind=kind, python=str(r.get("python", "python3")),
        slurm=SlurmSettings(partition=s.get("partition"), account=s.get("account"), container=container,
                            extra_sbatch=tuple(extra), local_cluster=bool(s.get("local_cluster", False))),
        srtctl=SrtctlSettings(executable=exe_t,
                              output_dir=(root / t["output_dir"]) if t.get("output_dir") else None),
    )

    rt = _expect_map(doc, ("retry",), top.get("retry"), {"max_attempts", "retry_on", "poll_seconds"})
    on = rt.get("retry_on", ["PREEMPTED", "NODE_FAIL", "TIMEOUT", "CANCELLED"])
    if not isinstance(on, list):
        raise doc.error(("retry", "retry_on"), "expected a list of Slurm job states")
    states = set()
    for i, name in enumerate(on):
        st = JobState.parse(str(name))
        if st in (JobState.UNKNOWN, JobState.PENDING, JobState.RUNNING, JobState.COMPLETED):
            raise doc.error(("retry", "retry_on", i), f"{name!r} is not a retryable end state "
                                                "(PREEMPTED NODE_FAIL TIMEOUT CANCELLED FAILED OUT_OF_MEMORY)")
        states.add(st)
    retry = RetrySettings(
        max_attempts=_int(doc, ("retry", "max_attempts"), rt.get("max_attempts", 3), 1),
        on=frozenset(states),
        poll_seconds=_float(doc, ("retry", "poll_seconds"), rt.get("poll_seconds", 5.0), 0.1, 3600),
    )

    srv = _expect_map(doc, ("server",), top.get("server"), {"port", "startup_timeout", "extra_flags"})
    extra_flags = srv.get("extra_flags") or {}
    if not isinstance(extra_flags, dict):
        raise doc.error(("server", "extra_flags"), "expected a mapping of server flags")

    stages_raw = _expect_map(doc, ("stages",), top.get("stages"), set(STAGES))
    if not stages_raw:
        raise doc.error(("stages",), f"required: at least one of {', '.join(STAGES)}")
    stages: dict[str, StageSettings] = {}
    for name, raw in stages_raw.items():
        p = ("stages", name)
        known = {"recipes", "time_limit", "gate", "gpus"}
        known |= {"gsm8k"} if name == "accuracy" else {"concurrencies", "input_len", "output_len",
                                                      "prompts_per_concurrency", "min_prompts"}
        st = _expect_map(doc, p, raw, known)
        recipes = _str_list(doc, (*p, "recipes"), st.get("recipes"))
        g = st.get("gate") or {}
        if name == "accuracy":
            g = _expect_map(doc, (*p, "gate"), g, {"threshold"})
            if "threshold" not in g:
                raise doc.error((*p, "gate", "threshold"), "required: the minimum mean GSM8K accuracy (0..1)")
            gate = GateConfig(accuracy_threshold=_float(doc, (*p, "gate", "threshold"), g["threshold"], 0.0, 1.0))
            gs = _expect_map(doc, (*p, "gsm8k"), st.get("gsm8k"),
                             {"num_questions", "shots", "repeats", "concurrency", "max_tokens"})
            gsm = Gsm8kSettings(
                num_questions=_int(doc, (*p, "gsm8k", "num_questions"), gs.get("num_questions", 50), 1),
                shots=_int(doc, (*p, "gsm8k", "shots"), gs.get("shots", 5), 0),
                repeats=_int(doc, (*p, "gsm8k", "repeats"), gs.get("repeats", 1), 1),
                concurrency=_int(doc, (*p, "gsm8k", "concurrency"), gs.get("concurrency", 8), 1),
                max_tokens=_int(doc, (*p, "gsm8k", "max_tokens"), gs.get("max_tokens", 256), 1),
            )
            extra_kw: dict[str, Any] = {"gsm8k": gsm}
        else:
            g = _expect_map(doc, (*p, "gate"), g, {"tolerance", "baselines"})
            tol = _float(doc, (*p, "gate", "tolerance"), g.get("tolerance", 0.0), 0.0, 1.0)
            baselines: dict[str, dict[int, float]] = {}
            braw = g.get("baselines") or {}
            if not isinstance(braw, dict):
                raise doc.error((*p, "gate", "baselines"), "expected {recipe: {concurrency: tokens/s per GPU}}")
            for rec, pts in braw.items():
                bp = (*p, "gate", "baselines", rec)
                if rec not in recipes:
                    raise doc.error(bp, f"baseline for a recipe this stage does not run ({', '.join(recipes)})")
                if not isinstance(pts, dict):
                    raise doc.error(bp, "expected {concurrency: tokens/s per GPU}")
                baselines[rec] = {_int(doc, (*bp, c), c, 1): _float(doc, (*bp, c), v, 0.0) for c, v in pts.items()}
            gate = GateConfig(baselines=baselines, tolerance=tol)
            concs = st.get("concurrencies")
            if concs is not None:
                if not isinstance(concs, list) or not concs:
                    raise doc.error((*p, "concurrencies"), "expected a non-empty list of integers")
                concs = tuple(_int(doc, (*p, "concurrencies", i), c, 1) for i, c in enumerate(concs))
                if len(set(concs)) != len(concs):
                    raise doc.error((*p, "concurrencies"), "concurrency points repeat")
            extra_kw = {
                "concurrencies": concs,
                "input_len": _int(doc, (*p, "input_len"), st["input_len"], 1) if "input_len" in st else None,
                "output_len": _int(doc, (*p, "output_len"), st["output_len"], 1) if "output_len" in st else None,
                "prompts_per_concurrency": (_int(doc, (*p, "prompts_per_concurrency"), st["prompts_per_concurrency"], 1)
                                            if "prompts_per_concurrency" in st else None),
                "min_prompts": _int(doc, (*p, "min_prompts"), st.get("min_prompts", 1), 1),
            }
        stages[name] = StageSettings(
            name=name, recipes=recipes,
            time_limit_s=_duration(doc, (*p, "time_limit"), st.get("time_limit", "1h")),
            gate=gate, gpus=_int(doc, (*p, "gpus"), st["gpus"], 1) if "gpus" in st else None, **extra_kw,
        )

    mp = top.get("model_paths") or {}
    if not isinstance(mp, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.startswith("/")
                                           for k, v in mp.items()):
        raise doc.error(("model_paths",), "expected {alias: absolute path of the model directory in the image}")
    model_paths = dict(mp)

    def path_field(key: str) -> Path | None:
        v = top.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise doc.error((key,), "expected a path")
        return (root / v).resolve()

    return Pipeline(
        file=file, name=file.stem, stack=stack, runner=runner, retry=retry, stages=stages,
        model_dir=path_field("model_dir"), data_dir=path_field("data_dir"),
        server_port=_int(doc, ("server", "port"), srv.get("port", 8000), 1),
        server_startup_timeout_s=_duration(doc, ("server", "startup_timeout"), srv.get("startup_timeout", 900)),
        extra_server_flags=dict(extra_flags),
        model_paths=model_paths,
    )
