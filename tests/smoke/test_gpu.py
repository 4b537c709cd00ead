"""Smoke on an NVIDIA host, up to the GPU boundary: which GPUs docker can give (nvidia runtime or
CDI), the container arguments each role gets, the plans and commands of the made model with
production's settings, and what the engines' logs say about the GPU path they took."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.records import committed_lock
from servestack import smoke
from servestack.records.lockfile import LockedPackage, LockedWheel, SmokeModel
from servestack.records.stack import SmokeModel as StackSmokeModel
from servestack.smoke import gpulogs
from servestack.smoke.endpoints import Target, check_gpu_path
from servestack.smoke.gpu import GpuHost, detect_gpu_host, gpu_container_kwargs, no_gpu

ONE_GPU = GpuHost(devices=("0",), via="nvidia-runtime", evidence="test: one GPU")
TWO_GPUS = GpuHost(devices=("0", "1"), via="nvidia-runtime", evidence="test: two GPUs")
ONE_CDI_GPU = GpuHost(devices=("0",), via="cdi", evidence="test: one CDI GPU")

# `nvidia-ctk cdi generate` output, trimmed: index names, a UUID name for the same GPU, and `all`.
CDI_SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
  - name: GPU-6f5a1f3c-0000-0000-0000-000000000000
    containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
  - name: all
    containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
containerEdits: {env: [NVIDIA_VISIBLE_DEVICES=void]}
"""


def _proc_gpus(tmp_path: Path, n: int) -> Path:
    proc = tmp_path / "proc-nvidia-gpus"
    for i in range(n):
        (proc / f"0000:{i + 0x18:02x}:00.0").mkdir(parents=True)
    return proc


# --------------------------------------------------------------------------- detecting the GPUs


def test_the_nvidia_runtime_gives_every_gpu_the_driver_lists(tmp_path: Path) -> None:
    info = {"Runtimes": {"runc": {"path": "runc"}, "nvidia": {"path": "nvidia-container-runtime"}}}
    host = detect_gpu_host(info, proc_gpus=_proc_gpus(tmp_path, 2))
    assert (host.devices, host.via) == (("0", "1"), "nvidia-runtime")
    assert "nvidia runtime" in host.evidence and "2 GPU(s)" in host.evidence


def test_cdi_devices_come_from_the_spec_directories_docker_reads(tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(CDI_SPEC)
    (tmp_path / "cdi" / "other.json").write_text(json.dumps({"kind": "vendor.com/fpga", "devices": [{"name": "0"}]}))
    info = {"Runtimes": {"runc": {}}, "CDISpecDirs": [str(tmp_path / "cdi")]}
    host = detect_gpu_host(info, proc_gpus=tmp_path / "absent")
    # One GPU: its UUID name and `all` name the same device as the index.
    assert (host.devices, host.via) == (("0",), "cdi")
    assert "nvidia.com/gpu=0" in host.evidence


@pytest.mark.parametrize(("info", "why"), [
    ({"Runtimes": {"runc": {}}}, "CDI needs docker 25 or newer"),  # an old daemon: no CDISpecDirs at all
    ({"Runtimes": {"runc": {}}, "CDISpecDirs": []}, "CDI needs docker 25 or newer"),  # CDI switched off
    ({"Runtimes": {"nvidia": {}}, "CDISpecDirs": []}, "lists no GPU"),  # the toolkit, but no GPU bound
])
def test_without_gpus_the_host_says_why(tmp_path: Path, info: dict, why: str) -> None:
    host = detect_gpu_host(info, proc_gpus=_proc_gpus(tmp_path, 0))
    assert host.count == 0 and host.via is None and why in host.evidence, host.evidence


def test_a_cdi_directory_without_nvidia_specs_gives_no_gpu(tmp_path: Path) -> None:
    (tmp_path / "vendor.json").write_text(json.dumps({"kind": "vendor.com/fpga", "devices": [{"name": "0"}]}))
    host = detect_gpu_host({"CDISpecDirs": [str(tmp_path)]}, proc_gpus=tmp_path / "absent")
    assert host.count == 0 and "names nvidia.com/gpu devices" in host.evidence


# --------------------------------------------------------------------------- container arguments


def _request(kwargs: dict) -> dict:
    [request] = kwargs["device_requests"]
    return dict(request)


def test_with_the_nvidia_runtime_a_role_gets_its_gpu_as_docker_run_gpus_would() -> None:
    server = gpu_container_kwargs(ONE_GPU, "server")
    assert _request(server) == {"Driver": "", "Count": 0, "DeviceIDs": ["0"], "Capabilities": [["gpu"]], "Options": {}}
    assert server["ipc_mode"] == "host"  # CUDA IPC between the two engines' containers
    # One GPU: both engines share it. Two: prefill GPU 0, decode GPU 1.
    assert _request(gpu_container_kwargs(ONE_GPU, "decode"))["DeviceIDs"] == ["0"]
    assert _request(gpu_container_kwargs(TWO_GPUS, "prefill"))["DeviceIDs"] == ["0"]
    assert _request(gpu_container_kwargs(TWO_GPUS, "decode"))["DeviceIDs"] == ["1"]
    assert _request(gpu_container_kwargs(TWO_GPUS, "all"))["DeviceIDs"] == ["0", "1"]
    assert gpu_container_kwargs(TWO_GPUS, "frontend") == {}


def test_with_cdi_a_role_gets_its_gpu_by_device_name() -> None:
    request = _request(gpu_container_kwargs(ONE_CDI_GPU, "prefill"))
    assert (request["Driver"], request["DeviceIDs"], request["Capabilities"]) == ("cdi", ["nvidia.com/gpu=0"], [])
    assert gpu_container_kwargs(no_gpu("none"), "server") == {}


# --------------------------------------------------------------------------- plans and commands

GPU_WHEELS = ("vllm", "ai-dynamo", "nixl", "nixl-cu13")
TINY = SmokeModel(name="servestack/tiny-qwen35", make={"seed": 0})


def _gpu_lock(environment: dict[str, str] | None = None, model: SmokeModel = TINY):
    """The production stack's shape: vLLM's CUDA build, Dynamo and NIXL, and a made smoke model."""
    return committed_lock(
        packages={n: LockedPackage(version="1", requirement=f"{n}==1", commit=None) for n in ("vllm", "ai-dynamo", "nixl")},
        platforms={"linux/amd64": tuple(LockedWheel(name=n, version="1", filename=f"{n}-1-py3-none-any.whl", sha256="0" * 64, size=1,
                                                    index="pypi") for n in GPU_WHEELS)},
        environment=environment or {}, smoke_model=model)


def _flag(argv: list[str] | tuple[str, ...], flag: str) -> str:
    return argv[list(argv).index(flag) + 1]


@pytest.fixture
def amd64_host(monkeypatch) -> None:
    monkeypatch.setattr(smoke.checklist, "host_docker_platform", lambda: "linux/amd64")


PRODUCTION_SWITCHES = ("--async-scheduling", "--language-model-only", "--no-enable-prefix-caching",
                       "--no-disable-hybrid-kv-cache-manager")


def test_the_aggregated_server_serves_the_made_model_on_a_gpu_with_productions_flags(amd64_host) -> None:
    plan = smoke.serve_plan(_gpu_lock(), "linux/amd64", ONE_GPU)
    argv = plan.command
    assert argv[:3] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == "/opt/servestack/models/servestack/tiny-qwen35"
    assert "--enforce-eager" not in argv  # CUDA graphs on, as production
    assert all(switch in argv for switch in PRODUCTION_SWITCHES)
    assert _flag(argv, "--mamba-ssm-cache-dtype") == "bfloat16" and _flag(argv, "--gpu-memory-utilization") == "0.3"
    assert plan.environment["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert not any(k.startswith("VLLM_CPU_") for k in plan.environment)  # nothing of the CPU build's
    assert _request(plan.container)["DeviceIDs"] == ["0"] and plan.gpus == 1
    assert (plan.oracle_vocab, plan.gdn_layers) == (1024 - 7, 3)  # the oracle runs as on CPU
    # The image's own environment is what is tested: the production stack sets the layout itself.
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in smoke.serve_plan(
        _gpu_lock({"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}), "linux/amd64", ONE_CDI_GPU).environment


def test_the_disaggregated_workers_share_one_gpu_with_nixl_over_gpu_buffers(amd64_host) -> None:
    shape = smoke.disagg_plan(_gpu_lock(), "linux/amd64", ONE_GPU)
    frontend, prefill, decode = shape.roles
    assert frontend.container == {} and frontend.command[1:3] == ("-m", "dynamo.frontend")
    for worker, mode in ((prefill, "prefill"), (decode, "decode")):
        assert _flag(worker.command, "--disaggregation-mode") == mode
        assert json.loads(_flag(worker.command, "--kv-transfer-config")) == {
            "kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cuda", "kv_load_failure_policy": "fail"}
        assert "--enforce-eager" not in worker.command and all(s in worker.command for s in PRODUCTION_SWITCHES)
        assert _request(worker.container)["DeviceIDs"] == ["0"]
        # On a GPU no CPU pinning, and UCX free to pick its CUDA transports.
        assert worker.cpus is None and "VLLM_CPU_OMP_THREADS_BIND" not in worker.environment
        assert "UCX_TLS" not in worker.environment and worker.environment["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
        assert worker.environment["DYN_DISCOVERY_BACKEND"] == "file"  # every plane still on loopback
    assert shape.gpus == 1 and "share GPU 0" in shape.placement


def test_with_two_gpus_prefill_takes_gpu_0_and_decode_gpu_1(amd64_host) -> None:
    _frontend, prefill, decode = (shape := smoke.disagg_plan(_gpu_lock(), "linux/amd64", TWO_GPUS)).roles
    assert (_request(prefill.container)["DeviceIDs"], _request(decode.container)["DeviceIDs"]) == (["0"], ["1"])
    assert shape.gpus == 2 and shape.placement.startswith("prefill on GPU 0, decode on GPU 1")


def test_without_a_gpu_both_shapes_are_not_run_with_the_hosts_reason(amd64_host) -> None:
    why = "docker has no nvidia runtime (runtimes: runc), and docker reads no CDI spec directory"
    serve = smoke.serve_plan(_gpu_lock(), "linux/amd64", no_gpu(why))
    disagg = smoke.disagg_plan(_gpu_lock(), "linux/amd64", no_gpu(why))
    assert serve.command is None and why in serve.reason and "needs NVIDIA GPUs" in serve.reason
    assert not disagg.roles and why in disagg.reason
    # Not looked for at all is said so too, never taken for a GPU.
    assert "not looked for" in smoke.serve_plan(_gpu_lock(), "linux/amd64").reason


def test_a_real_checkpoint_is_served_tensor_parallel_over_every_gpu(amd64_host, tmp_path: Path) -> None:
    plan = smoke.serve_plan(_gpu_lock(model=SmokeModel(name="Q", path=str(tmp_path))), "linux/amd64", TWO_GPUS)
    assert _flag(plan.command, "--tensor-parallel-size") == "2" and _request(plan.container)["DeviceIDs"] == ["0", "1"]


def test_a_stack_may_make_the_smoke_model_beside_naming_its_checkpoint() -> None:
    both = StackSmokeModel(name="servestack/tiny-qwen35", make={"seed": 0}, path="/models/Qwen3.5-397B-A17B-NVFP4")
    assert both.make and both.path
    with pytest.raises(ValueError, match="give `make`"):
        StackSmokeModel(name="nothing")


def test_where_serving_is_required_a_check_that_did_not_run_fails_saying_why() -> None:
    from servestack.smoke import _required_serving

    checks = [smoke.Check(probe="static", name="lock", status="pass", detail=""),
              smoke.Check(probe="serving", name="ready", status="not_run", detail="needs NVIDIA GPUs and none"),
              smoke.Check(probe="disagg", name="ready", status="not_run", detail="needs NVIDIA GPUs and none")]
    [required] = _required_serving(checks)
    assert (required.probe, required.name, required.status) == ("serving", "required", "fail")
    assert "serving/ready, disagg/ready" in required.detail and "needs NVIDIA GPUs" in required.detail
    assert _required_serving(checks[:1]) == []


# --------------------------------------------------------------------------- what the engines logged

# An engine's start-up on a Hopper GPU, in vLLM 0.31's formats (gpulogs.py names the source of each).
ENGINE_LOG = """\
(EngineCore pid=212) INFO 12-05 10:00:20 [qwen_gdn_linear_attn.py:211] Using FlashInfer GDN prefill kernel (requested=auto, head_k_dim=128).
(EngineCore pid=212) INFO 12-05 10:00:20 [cuda.py:368] Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN'].
(EngineCore pid=212) INFO 12-05 10:00:24 [gpu_model_runner.py:4578] Model loading took 0.02 GiB memory and 1.2 seconds
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/11 [00:00<?, ?it/s]\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 11/11 [00:02<00:00,  5.1it/s]
Capturing CUDA graphs (decode, FULL): 100%|##########| 7/7 [00:01<00:00,  6.9it/s]
(EngineCore pid=212) INFO 12-05 10:00:31 [gpu_model_runner.py:5071] Graph capturing finished in 4 secs, took 0.31 GiB
(EngineCore pid=212) INFO 12-05 10:00:31 [core.py:273] init engine (profile, create kv cache, warmup model) took 11.52 seconds
(EngineCore pid=212) INFO 12-05 10:01:02 [metrics.py:103] KV Transfer metrics: Num successful transfers=3, Avg xfer time (ms)=0.8, P90 xfer time (ms)=1.1, Avg post time (ms)=0.1, P90 post time (ms)=0.2, Avg MB per transfer=2.5, Throughput (MB/s)=3100.0, Avg number of descriptors=12, Num failed transfers=0, Num KV expired reqs=0
(EngineCore pid=212) INFO 12-05 10:01:12 [metrics.py:103] KV Transfer metrics: Num successful transfers=1, Avg xfer time (ms)=1.6, P90 xfer time (ms)=1.6, Avg post time (ms)=0.1, P90 post time (ms)=0.1, Avg MB per transfer=0.5, Throughput (MB/s)=310.0, Avg number of descriptors=4, Num failed transfers=1, Num KV expired reqs=0
"""
# The same engine started eagerly, with the attention backend forced by a flag and GDN on Triton.
EAGER_LOG = """\
(EngineCore pid=90) INFO 12-05 10:00:20 [qwen_gdn_linear_attn.py:211] Using Triton/FLA GDN prefill kernel (requested=auto, head_k_dim=64).
(EngineCore pid=90) INFO 12-05 10:00:20 [cuda.py:330] Using AttentionBackendEnum.FLASH_ATTN backend.
(EngineCore pid=90) INFO 12-05 10:00:20 [vllm.py:958] Cudagraph is disabled under eager mode
"""


def test_the_engine_log_names_its_kernels_graphs_start_up_and_nixl_transfers() -> None:
    engine = gpulogs.engine_log(ENGINE_LOG)
    assert (engine.gdn_prefill, engine.gdn_head_k_dim) == ("FlashInfer", 128)
    assert (engine.attention, engine.attention_candidates) == ("FLASHINFER", ("FLASHINFER", "TRITON_ATTN"))
    assert engine.cuda_graphs.modes == {"mixed prefill-decode, PIECEWISE": 11, "decode, FULL": 7}
    assert (engine.cuda_graphs.seconds, engine.cuda_graphs.gib, engine.cuda_graphs.captured) == (4, 0.31, True)
    assert engine.init_engine_s == 11.52
    assert engine.nixl == gpulogs.NixlStats(successful=4, failed=1, megabytes=8.0, mean_transfer_ms=1.0)
    assert gpulogs.missing(engine) == []
    assert json.loads(json.dumps(engine.to_json()))["cuda_graphs"]["captured"] is True


# The aggregated engine's own lines on the lent H200 (benchmarks/results/h200-canary.md), verbatim.
H200_LOG = """\
(EngineCore pid=4336) INFO 12-05 02:40:12 [qwen_gdn_linear_attn.py:177] Using FlashInfer GDN prefill kernel (requested=auto, head_k_dim=128).
(EngineCore pid=4336) INFO 12-05 02:40:13 [cuda.py:526] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].
Capturing CUDA graphs (FULL): 100%|██████████| 2/2 [00:00<00:00, 52.13it/s]
(EngineCore pid=4336) INFO 12-05 02:40:32 [model_runner.py:1087] Graph capturing finished in 2 secs, took 0.21 GiB
(EngineCore pid=4336) INFO 12-05 02:40:57 [core.py:373] init engine (profile, create kv cache, warmup model) took 42.54 s (compilation: 3.51 s)
"""


def test_the_h200_s_own_log_names_what_the_static_probe_predicted_for_sm90() -> None:
    engine = gpulogs.engine_log(H200_LOG)
    # kernel_shapes predicted FlashInfer for a 128-dim GDN model on SM90, and FLASH_ATTN first on SM90.
    assert (engine.gdn_prefill, engine.gdn_head_k_dim, engine.attention) == ("FlashInfer", 128, "FLASH_ATTN")
    assert engine.cuda_graphs.captured and engine.init_engine_s == 42.54


def test_an_eager_engine_is_missing_its_cuda_graphs() -> None:
    engine = gpulogs.engine_log(EAGER_LOG)
    assert (engine.gdn_prefill, engine.gdn_head_k_dim, engine.attention) == ("Triton/FLA", 64, "FLASH_ATTN")
    assert not engine.cuda_graphs.captured and engine.nixl.successful == 0 and engine.nixl.mean_transfer_ms is None
    assert gpulogs.missing(engine) == ["no CUDA-graph capture (an eager engine, or one that never finished capturing)"]
    # The CPU build's own line still names its kernel.
    assert gpulogs.gdn_prefill("INFO 12-05 10:00:20 [gdn.py:1] Using CPU GDN prefill kernel") == ("CPU", None)


def _target(gpus: int, **logs: str) -> Target:
    return Target(base="http://127.0.0.1:1", model="m", http=None, timeout=1.0, logs={role: (lambda text=text: text) for role,
                                                                                      text in logs.items()},
                  gpus=gpus)


def test_the_gpu_check_records_each_engine_and_fails_an_eager_one() -> None:
    t = _target(1, frontend="frontend log", prefill=ENGINE_LOG, decode=ENGINE_LOG)
    status, detail = check_gpu_path(t)
    assert status == "pass" and "prefill: GDN prefill FlashInfer, attention FLASHINFER, CUDA graphs 18 in 4 s" in detail
    assert set(t.metrics["gpu"]) == {"prefill", "decode"} and t.metrics["gpu"]["decode"]["nixl"]["successful"] == 4
    status, detail = check_gpu_path(_target(1, server=EAGER_LOG))
    assert status == "fail" and detail.startswith("server logged no CUDA-graph capture")


def test_on_cpu_the_gpu_check_is_not_run_never_passed() -> None:
    status, detail = check_gpu_path(_target(0, server=ENGINE_LOG))
    assert status == "not_run" and "ran on CPU" in detail
