"""Runs inside the stack's image: vLLM (and Dynamo) resolve each role's command line and environment and judge it.

`python engine_driver.py < request.json > answers.json`; it imports nothing of servestack. The request:

    {"device": {"kind": "cpu"} | {"kind": "cuda", "major": 10, "minor": 0, "name": "...", "memory_gb": 186, "count": 4},
     "model_dir": "/standin",   # a config.json of the recipe's architecture (no weights): what vLLM reads
     "roles": {KEY: {"argv": [...], "env": {...}}}}

vLLM and Dynamo are imported once; each role is then judged in a child forked with its own environment:
Dynamo's own `dynamo.vllm.args.parse_args` (its flags, connector names, disaggregation modes, then vLLM's
engine parser and `AsyncEngineArgs.from_cli_args`) or vLLM's own server parser for `vllm serve`, then
`create_engine_config` (vLLM's range and consistency errors), then the attention backend vLLM selects on
the device and `compute_nixl_compatibility_hash` with its factors and the handshake's fields. A CUDA
device is simulated as the static probe simulates one: vLLM's CUDA platform, reporting the target's
compute capability, memory and count instead of asking a driver.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types
from typing import Any

_PREFIX = ("python3", "-m", "dynamo.vllm")


def _simulate(device: dict) -> str:
    if device.get("kind") != "cuda":
        return "cpu"
    try:  # with the driver stub on the loader's path vLLM's CUDA ops load; an image without one gets none
        import vllm._C_stable_libtorch  # noqa: F401
    except ImportError:
        sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    major, minor = int(device["major"]), int(device["minor"])

    class SimulatedDevice(CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return str(device.get("name", "simulated"))

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(device.get("memory_gb", 80)) * 2**30

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return int(device.get("count", 1))

        @classmethod
        def log_warnings(cls) -> None:
            return None

    platforms._current_platform = SimulatedDevice()
    _simulate_driver_version()
    return f"vLLM's CUDA platform simulating SM{major}{minor} ({device.get('name', '')})"


def _simulate_driver_version() -> None:
    """The driver stub answers cuDriverGetVersion with 0 (CUDA 0.0), which libraries that pick a toolkit flavor
    by it (the CUTLASS DSL) refuse: the simulated node's driver reports the CUDA the image's torch was built
    for, the least a node running this image has."""
    import ctypes

    import torch

    major, minor = (int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    version = major * 1000 + minor * 10
    real = ctypes.CDLL

    class DriverCDLL(real):  # type: ignore[misc, valid-type]
        def __init__(self, name: str | None, *args: Any, **kwargs: Any) -> None:
            super().__init__(name, *args, **kwargs)
            if name is not None and os.path.basename(str(name)).startswith("libcuda.so"):
                def get_version(ref: Any) -> int:  # a byref() to the caller's c_int
                    ref._obj.value = version
                    return 0

                self.cuDriverGetVersion = get_version

    # Every later ctypes.CDLL in this process, the engine's included, gets the subclass (a patch mypy refuses).
    ctypes.CDLL = DriverCDLL  # type: ignore[misc]


def _message(e: BaseException) -> str:
    text = str(e)
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic: the validator's own sentence, not the repr of every input
        try:
            text = "; ".join(": ".join(p for p in (".".join(str(part) for part in x.get("loc") or ()),
                                                    str(x.get("msg", "")).removeprefix("Value error, ")) if p)
                             for x in errors())
        except Exception:
            pass
    return f"{type(e).__name__}: {text}".strip()


def _judge(argv: list[str], model_dir: str) -> dict:
    dynamo = tuple(argv[:3]) == _PREFIX
    args = list(argv[3:] if dynamo else argv[2:])
    if dynamo:
        i = args.index("--model")
        args[i + 1] = model_dir
    else:
        args[0] = model_dir
    stage = "parse"
    try:
        if dynamo:
            from dynamo.vllm import args as dynamo_args

            config = dynamo_args.parse_args(args)
            engine_args = config.engine_args
            served = config.served_model_name
        else:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.entrypoints.launchers.cli_args import make_arg_parser
            from vllm.utils.argparse_utils import FlexibleArgumentParser

            parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *args[:1], *args[1:]])
            engine_args = AsyncEngineArgs.from_cli_args(parsed)
            served = (engine_args.served_model_name or [None])[0]
        stage = "config"
        vllm_config = engine_args.create_engine_config()
        stage = "hash"
        return {"ok": True, "served_model_name": served, **_nixl(vllm_config)}
    except SystemExit as e:  # argparse's refusal: its message went to stderr
        return {"ok": False, "stage": stage, "error": f"argument parser refused the command line (exit {e.code})"}
    except BaseException as e:
        return {"ok": False, "stage": stage, "error": _message(e), "trace": traceback.format_exc()[-2000:]}


def _nixl(vllm_config: Any) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata

    kv = vllm_config.kv_transfer_config
    out: dict = {"connector": getattr(kv, "kv_connector", None),
                 "tp_size": vllm_config.parallel_config.tensor_parallel_size,
                 "dp_size": vllm_config.parallel_config.data_parallel_size,
                 "block_size": vllm_config.cache_config.block_size}
    if kv is None or "Nixl" not in str(kv.kv_connector):
        return out
    from vllm.v1.attention.selector import get_attn_backend

    model = vllm_config.model_config
    with set_current_vllm_config(vllm_config):
        backend = get_attn_backend(model.get_head_size(), model.dtype, vllm_config.cache_config.cache_dtype).get_name()
    captured: dict = {}
    import vllm.config.utils as config_utils

    real = config_utils.hash_factors

    def capture(factors: dict[str, Any]) -> Any:
        captured.update(factors)
        return real(factors)

    config_utils.hash_factors = capture
    try:
        digest = metadata.compute_nixl_compatibility_hash(vllm_config, backend)
    finally:
        config_utils.hash_factors = real
    out.update({"hash": digest, "factors": {k: str(v) for k, v in captured.items()}, "attn_backend_name": backend})
    return out


def _with_driver_stub(device: dict) -> None:
    """A CUDA image run without a GPU: vLLM's CUDA extensions need `libcuda.so.1` to load. The image's CUDA
    driver stub (nvidia/cu*/lib/stubs/libcuda.so, off the loader's path) stands in, as the static probe
    links against it; the process re-executes itself once with it on LD_LIBRARY_PATH."""
    import glob
    import tempfile

    if device.get("kind") != "cuda" or os.environ.get("RECIPE_JUDGE_CUDA_STUB") is not None:
        return
    stubs = sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cu*", "lib",
                                          "stubs", "libcuda.so")))
    where = ""
    if stubs:
        where = tempfile.mkdtemp(prefix="cuda-stub-")
        os.symlink(stubs[-1], os.path.join(where, "libcuda.so.1"))
    env = {**os.environ, "RECIPE_JUDGE_CUDA_STUB": where,
           "LD_LIBRARY_PATH": ":".join(p for p in (where, os.environ.get("LD_LIBRARY_PATH", "")) if p)}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _baseline(model_dir: str) -> str | None:
    """Why this image cannot judge anything (the stand-in model alone does not configure), or None. Asked in
    this process, before the forks: what vLLM learns of the model here (its architecture's inspection, the
    slowest step) each role's child inherits."""
    from vllm.model_executor.models import registry

    # vLLM inspects a model class in a child Python "to avoid initializing CUDA"; there is no CUDA here, so
    # its own inspection runs in this process, once, and every role's fork has the class already imported.
    registry._run_in_subprocess = lambda fn: fn()
    # With NIXL named, the connector, the attention backend and their kernels' modules are imported here too.
    answer = _judge(["vllm", "serve", model_dir, "--kv-transfer-config",
                     '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'], model_dir)
    return None if answer.get("ok") else str(answer.get("error"))


def main() -> int:
    raw = sys.stdin.read() if os.environ.get("RECIPE_JUDGE_REQUEST") is None else \
        open(os.environ["RECIPE_JUDGE_REQUEST"]).read()
    request = json.loads(raw)
    if os.environ.get("RECIPE_JUDGE_REQUEST") is None and (request.get("device") or {}).get("kind") == "cuda":
        import tempfile

        fd, path = tempfile.mkstemp(suffix=".json")  # stdin is spent: the re-executed process reads the request here
        os.write(fd, raw.encode())
        os.close(fd)
        os.environ["RECIPE_JUDGE_REQUEST"] = path
    _with_driver_stub(request.get("device") or {})
    out = os.fdopen(os.dup(1), "w")  # the answer's own channel: vLLM and Dynamo print to stdout
    os.dup2(2, 1)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    t = time.monotonic()
    import vllm  # noqa: F401 - imported once, before the forks
    print(f"servestack-judge: import vllm {time.monotonic() - t:.1f} s", file=sys.stderr)
    platform = _simulate(request.get("device") or {})
    try:
        from dynamo.vllm import args as _  # noqa: F401
    except ImportError:
        pass
    answers: dict = {}
    t = time.monotonic()
    unavailable = _baseline(request["model_dir"])
    print(f"servestack-judge: baseline {time.monotonic() - t:.1f} s", file=sys.stderr)
    if unavailable:
        json.dump({"platform": platform, "unavailable": unavailable, "answers": {}}, out)
        out.close()
        return 0
    base_env = dict(os.environ)
    pending = list(request["roles"].items())
    running: dict[int, tuple[str, int]] = {}  # pid -> (key, the pipe's read end)
    while pending or running:
        while pending and len(running) < max(1, os.cpu_count() or 1):
            key, role = pending.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                os.environ.clear()
                os.environ.update({**base_env, **role["env"]})
                started = time.monotonic()
                answer = _judge(role["argv"], request["model_dir"])
                answer["seconds"] = round(time.monotonic() - started, 1)
                with os.fdopen(write, "w") as f:
                    json.dump(answer, f)
                os._exit(0)
            os.close(write)
            running[pid] = (key, read)
        pid, status = os.wait()
        if pid not in running:
            continue  # a process the baseline left behind, not a role's
        key, read = running.pop(pid)
        with os.fdopen(read) as f:
            text = f.read()
        answers[key] = json.loads(text) if text else {"ok": False, "stage": "crash", "error": f"the judge died ({status})"}
    json.dump({"platform": platform, "answers": answers}, out)
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
