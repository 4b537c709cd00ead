"""What a vLLM engine on a GPU says in its log about the path it took, read back for smoke.json.

The formats are vLLM's own (the lines in tests/smoke/test_gpu.py are written after them):

- GDN prefill: `vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`,
  `_log_gdn_backend_decision`: "Using %s GDN prefill kernel (requested=%s, head_k_dim=%s)." with
  FlashInfer, CuteDSL or Triton/FLA (the CPU build logs "Using CPU GDN prefill kernel");
- attention: `vllm/platforms/cuda.py`, `get_attn_backend_cls`: "Using %s attention backend out of
  potential backends: [...]." when vLLM chose, "Using %s backend." (an AttentionBackendEnum) when a
  flag chose;
- CUDA graphs: `vllm/v1/worker/gpu_model_runner.py`, `capture_model`: a tqdm bar per mode
  ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|...| 11/11") and then
  "Graph capturing finished in %.0f secs, took %.2f GiB"; an eager engine logs neither;
- start-up: `vllm/v1/engine/core.py`: "init engine (profile, create kv cache, warmup model) took
  %.2f seconds";
- NIXL: the connector's stats line, "KV Transfer metrics: Num successful transfers=..., Avg xfer
  time (ms)=..., ..., Avg MB per transfer=..., ..., Num failed transfers=...", once per interval.

What an engine's start-up went on (`startup`), each part as the engine logs it:
- weights: `gpu_model_runner.py` (and the V2 runner's `model_runner.py`) "Model loading took %s GiB
  memory and %.6f seconds"; the CPU build logs only the loader's "Loading weights took %.2f seconds";
- torch.compile: `compilation/monitor.py` "torch.compile took %.2f s in total", else the
  "(compilation: %.2f s)" of the init engine line;
- FlashInfer JIT: `flashinfer/jit/core.py` "Building JIT module %s; this can take several minutes on
  first use." (only when the module is not on disk) and `jit/cute_dsl_core.py` "Compiling CuTe-DSL
  kernel %s", in FlashInfer's own format ("2026-12-05 10:00:41,123 - INFO - core.py:564 -
  flashinfer.jit: ..."). Neither logs its end: a compile is taken to last until the next line of
  its process that carries a time (vLLM's "MM-DD HH:MM:SS", FlashInfer's or Dynamo's date and time),
  an upper bound (to the second) since the engine waits on it (jit_builds says which line);
- CUDA graphs: "Graph capturing finished in %.0f secs";
- KV capacity: `v1/core/kv_cache_utils.py` "%s KV cache size: %s tokens, Maximum concurrency for
  %s tokens per request: %.2fx" (GPU, or CPU for the CPU build).
The rest of the time to ready is what none of them names: starting Python and the engine's
processes, importing, profiling, allocating the KV cache, registering with Dynamo.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_GDN_PREFILL = re.compile(r"Using (?P<backend>\S+) GDN prefill kernel(?: \(requested=(?P<requested>[^,]+), "
                          r"head_k_dim=(?P<head_k_dim>[^)]+)\))?")
_ATTENTION = re.compile(r"Using (?P<backend>[A-Z][A-Z0-9_]*) attention backend out of potential backends: "
                        r"\[(?P<candidates>[^\]]*)\]|Using AttentionBackendEnum\.(?P<forced>[A-Z][A-Z0-9_]*) backend\.")
_CAPTURE_BAR = re.compile(r"Capturing CUDA graphs \((?P<mode>[^)]+)\):\s+100%[^|]*\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)")
_CAPTURE_DONE = re.compile(r"Graph capturing finished in (?P<secs>\d+) secs?, took (?P<gib>-?[\d.]+) GiB")
# vLLM 0.31 on an H200 wrote "took 42.54 s (compilation: 3.51 s)"; earlier releases "took 11.52 seconds".
_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<secs>[\d.]+) s(?:econds)?\b")
_KV_STATS = re.compile(r"KV Transfer metrics: (?P<fields>.*)$")
_KV_CAPACITY = re.compile(r"\b[A-Z]+ KV cache size: (?P<tokens>\d[\d,]*) tokens")
_MODEL_LOADING = re.compile(r"Model loading took [\d.]+ GiB memory and (?P<secs>[\d.]+) seconds")
_WEIGHTS_LOADING = re.compile(r"Loading weights took (?P<secs>[\d.]+) seconds")
_TORCH_COMPILE = re.compile(r"torch\.compile took (?P<secs>[\d.]+) s in total")
_INIT_COMPILATION = re.compile(r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s \(compilation: (?P<secs>[\d.]+) s")
_JIT_BUILD = re.compile(r"Building JIT module (?P<module>[^;\s]+)|Compiling CuTe-DSL kernel (?P<kernel>\S+)")
_PROCESS = re.compile(r"^\((?P<process>[^)]*pid=\d+)\) ")
# A line's time: FlashInfer's and Dynamo's date and time, or vLLM's "INFO 12-05 10:00:20" (no year).
_STAMP = re.compile(r"\b\d{4}-(?P<mon>\d\d)-(?P<day>\d\d)[T ](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d+))?"
                    r"|\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<vmon>\d\d)-(?P<vday>\d\d) (?P<vh>\d\d):(?P<vm>\d\d):(?P<vs>\d\d)\b")
_KV_FIELD = re.compile(r"([A-Za-z][\w ()/]*?)=([\d.]+)")


@dataclass(frozen=True, kw_only=True)
class CudaGraphs:
    """The engine's CUDA-graph capture: each mode's graphs, and the time and memory it took."""

    modes: dict[str, int]  # "mixed prefill-decode, PIECEWISE" -> graphs captured
    seconds: int | None
    gib: float | None

    @property
    def captured(self) -> bool:
        return self.seconds is not None


@dataclass(frozen=True, kw_only=True)
class NixlStats:
    """The NIXL transfers an engine logged, over all its stats intervals."""

    successful: int
    failed: int
    megabytes: float  # each interval's transfers times its average size
    mean_transfer_ms: float | None  # weighted by each interval's transfers


@dataclass(frozen=True, kw_only=True)
class EngineLog:
    """What one engine's log says about its GPU path; None where it said nothing."""

    gdn_prefill: str | None
    gdn_head_k_dim: int | None
    attention: str | None
    attention_candidates: tuple[str, ...]
    cuda_graphs: CudaGraphs
    init_engine_s: float | None
    nixl: NixlStats

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"cuda_graphs": {**asdict(self.cuda_graphs), "captured": self.cuda_graphs.captured}}


def _lines(log: str) -> list[str]:
    # tqdm redraws its bar with carriage returns: each redraw is a line of its own.
    return re.split(r"[\r\n]+", log)


def gdn_prefill(log: str) -> tuple[str | None, int | None]:
    """The GDN prefill kernel the engine chose, and the head_k_dim it chose it for."""
    m = _GDN_PREFILL.search(log)
    if not m:
        return None, None
    dim = m["head_k_dim"]
    return m["backend"], int(dim) if dim and dim.isdigit() else None


def attention(log: str) -> tuple[str | None, tuple[str, ...]]:
    """The attention backend the engine chose, and the valid ones it chose from (empty when forced)."""
    m = _ATTENTION.search(log)
    if not m:
        return None, ()
    if m["forced"]:
        return m["forced"], ()
    return m["backend"], tuple(c.strip().strip("'\"") for c in m["candidates"].split(",") if c.strip())


def cuda_graphs(log: str) -> CudaGraphs:
    modes: dict[str, int] = {}
    for line in _lines(log):
        if bar := _CAPTURE_BAR.search(line):
            modes[bar["mode"]] = int(bar["total"])
    done = _CAPTURE_DONE.search(log)
    return CudaGraphs(modes=modes, seconds=int(done["secs"]) if done else None,
                      gib=float(done["gib"]) if done else None)


def nixl_stats(log: str) -> NixlStats:
    successful = failed = 0
    megabytes = weighted_ms = 0.0
    for line in _lines(log):
        m = _KV_STATS.search(line)
        if not m:
            continue
        values = {k.strip(): float(v) for k, v in _KV_FIELD.findall(m["fields"])}
        count = int(values.get("Num successful transfers", 0))
        successful += count
        failed += int(values.get("Num failed transfers", 0))
        megabytes += count * values.get("Avg MB per transfer", 0.0)
        weighted_ms += count * values.get("Avg xfer time (ms)", 0.0)
    return NixlStats(successful=successful, failed=failed, megabytes=round(megabytes, 3),
                     mean_transfer_ms=round(weighted_ms / successful, 3) if successful else None)


def engine_log(log: str) -> EngineLog:
    prefill, head_k_dim = gdn_prefill(log)
    backend, candidates = attention(log)
    init = _INIT_ENGINE.search(log)
    return EngineLog(gdn_prefill=prefill, gdn_head_k_dim=head_k_dim, attention=backend,
                     attention_candidates=candidates, cuda_graphs=cuda_graphs(log),
                     init_engine_s=float(init["secs"]) if init else None, nixl=nixl_stats(log))


def missing(engine: EngineLog) -> list[str]:
    """What a GPU engine serving with CUDA graphs should have logged and did not."""
    gaps = []
    if engine.gdn_prefill is None:
        gaps.append("no GDN prefill kernel")
    if engine.attention is None:
        gaps.append("no attention backend")
    if not engine.cuda_graphs.captured:
        gaps.append("no CUDA-graph capture (an eager engine, or one that never finished capturing)")
    return gaps


def kv_cache_tokens(log: str) -> int | None:
    """The engine's KV cache capacity in tokens, as it logged it."""
    m = _KV_CAPACITY.search(log)
    return int(m["tokens"].replace(",", "")) if m else None


def _stamp(line: str) -> float | None:
    """Seconds since the start of the year (every month taken as 31 days: only differences are used)."""
    m = _STAMP.search(line)
    if not m:
        return None
    if m["mon"]:
        mon, day, h, mi, sec, frac = m["mon"], m["day"], m["h"], m["m"], m["s"], m["frac"] or "0"
    else:
        mon, day, h, mi, sec, frac = m["vmon"], m["vday"], m["vh"], m["vm"], m["vs"], "0"
    return ((int(mon) * 31 + int(day)) * 24 + int(h)) * 3600 + int(mi) * 60 + int(sec) + float(f"0.{frac}")


@dataclass(frozen=True, kw_only=True)
class JitBuild:
    """A FlashInfer module or CuTe DSL kernel compiled while the engine waited."""

    name: str
    kind: str  # "flashinfer" (a JIT module: nvcc and the linker) or "cute-dsl"
    seconds: float | None  # until the log's next timed line; None: nothing timed came after it


def _process(line: str) -> str | None:
    """The process vLLM's multiprocessing prefixes a line with ("EngineCore pid=212"), if any."""
    m = _PROCESS.match(line)
    return m["process"] if m else None


def jit_builds(log: str) -> tuple[JitBuild, ...]:
    """Each compile's start, and its end: the next timed line of the process that logged it (of any
    process where its line has no process prefix), else the next timed line that starts no compile
    (another rank asking for the same module does not end this one)."""
    lines = _lines(log)
    builds = []
    for index, line in enumerate(lines):
        m = _JIT_BUILD.search(line)
        if not m:
            continue
        began, process = _stamp(line), _process(line)
        later = [(text, t) for text in lines[index + 1:] if (t := _stamp(text)) is not None]
        ended = next((t for text, t in later if process is None or _process(text) == process), None)
        if ended is None:
            ended = next((t for text, t in later if not _JIT_BUILD.search(text)), None)
        seconds = round(ended - began, 3) if began is not None and ended is not None and ended >= began else None
        builds.append(JitBuild(name=m["module"] or m["kernel"], kind="flashinfer" if m["module"] else "cute-dsl",
                               seconds=seconds))
    return tuple(builds)


def _longest(pattern: re.Pattern[str], log: str) -> float | None:
    """The longest of the times the pattern's lines give: tensor-parallel ranks each log theirs, at
    the same time (the smoke model's engine has one rank)."""
    found = [float(m["secs"]) for m in pattern.finditer(log)]
    return round(max(found), 3) if found else None


@dataclass(frozen=True, kw_only=True)
class Startup:
    """An engine's time to ready (smoke measured it) and what its log says that time went on."""

    ready_s: float | None  # from its container's start to serving: /health, or listed by Dynamo's frontend
    weights_s: float | None
    torch_compile_s: float | None
    jit: tuple[JitBuild, ...]
    cuda_graphs_s: float | None
    init_engine_s: float | None  # vLLM's own total of profiling, KV cache, compiling, capturing, warming up
    kv_cache_tokens: int | None

    @property
    def jit_s(self) -> float:
        """One after another; a module several ranks asked for at once (FlashInfer builds it once,
        behind a file lock) counts once, its longest."""
        longest: dict[str, float] = {}
        for b in self.jit:
            longest[b.name] = max(longest.get(b.name, 0.0), b.seconds or 0.0)
        return round(sum(longest.values()), 3)

    @property
    def rest_s(self) -> float | None:
        if self.ready_s is None:
            return None
        named = (self.weights_s or 0.0) + (self.torch_compile_s or 0.0) + self.jit_s + (self.cuda_graphs_s or 0.0)
        return round(max(0.0, self.ready_s - named), 3)

    def to_json(self) -> dict[str, Any]:
        return {"ready_s": self.ready_s, "weights_s": self.weights_s, "torch_compile_s": self.torch_compile_s,
                "jit_s": self.jit_s, "jit": [asdict(b) for b in self.jit], "cuda_graphs_s": self.cuda_graphs_s,
                "rest_s": self.rest_s, "init_engine_s": self.init_engine_s, "kv_cache_tokens": self.kv_cache_tokens}

    def describe(self) -> str:
        def part(label: str, value: float | None) -> str:
            return f"{label} {value:.1f} s" if value is not None else f"{label} -"

        built = f" ({', '.join(b.name for b in self.jit)})" if self.jit else ""
        ready = f"ready in {self.ready_s:.1f} s" if self.ready_s is not None else "time to ready unknown"
        kv = f"; KV cache {self.kv_cache_tokens:,} tokens" if self.kv_cache_tokens is not None else ""
        return (f"{ready}: {part('weights', self.weights_s)}, {part('torch.compile', self.torch_compile_s)}, "
                f"FlashInfer/CuTe DSL compiles {self.jit_s:.1f} s{built}, {part('CUDA graphs', self.cuda_graphs_s)}, "
                f"{part('rest', self.rest_s)}{kv}")


def startup(log: str, ready_s: float | None) -> Startup:
    """`log`: the engine's log up to ready (later compiles are serving's, not start-up's)."""
    graphs = cuda_graphs(log)
    init = _INIT_ENGINE.search(log)
    return Startup(ready_s=round(ready_s, 2) if ready_s is not None else None,
                   weights_s=_longest(_MODEL_LOADING, log) if _MODEL_LOADING.search(log) else _longest(_WEIGHTS_LOADING, log),
                   torch_compile_s=_longest(_TORCH_COMPILE, log) if _TORCH_COMPILE.search(log) else _longest(_INIT_COMPILATION, log),
                   jit=jit_builds(log), cuda_graphs_s=float(graphs.seconds) if graphs.seconds is not None else None,
                   init_engine_s=float(init["secs"]) if init else None, kv_cache_tokens=kv_cache_tokens(log))
