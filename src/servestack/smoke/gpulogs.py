"""What a vLLM engine on a GPU says in its log about the path it took, read back for smoke.json.

The formats are vLLM's own (the lines in tests/test_smoke_gpu.py are written after them):

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
