"""The tiny offline model served by a real vLLM server (opt-in: SERVESTACK_VLLM_PYTHON names a python
with vllm)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from servestack.inputs.tinymodel import TinyModelSpec, make_model
from servestack.smoke.engine_settings import VLLM_CPU_ENV, vllm_server_argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.mark.e2e
def test_vllm_serves_the_tiny_model(tmp_path: Path) -> None:
    python = os.environ.get("SERVESTACK_VLLM_PYTHON")
    if not python:
        pytest.skip("SERVESTACK_VLLM_PYTHON (a python with vllm) is not set")
    model = tmp_path / "model"
    make_model(model, TinyModelSpec())
    port = _free_port()
    env = {**os.environ, **VLLM_CPU_ENV}
    argv = vllm_server_argv(python, model, port=port, eager=True)
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                pytest.fail(f"vLLM exited with {server.returncode}:\n{(tmp_path / 'server.log').read_text()[-4000:]}")
            try:
                if _get(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("vLLM did not become healthy within 600 s")
            time.sleep(1)
        models = json.loads(_get(base + "/v1/models")[1])
        assert [m["id"] for m in models["data"]] == ["tiny"]
        out = _post(base + "/v1/completions",
                    {"model": "tiny", "prompt": "Hello, world!", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert out["usage"]["completion_tokens"] == 8
        assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 8
        assert isinstance(out["choices"][0]["text"], str)
        chat = _post(base + "/v1/chat/completions",
                     {"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4,
                      "temperature": 0, "ignore_eos": True})
        usage = chat["usage"]
        # "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", tokenized by our tokenizer
        tokenized = _post(base + "/tokenize", {"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}],
                                              "add_generation_prompt": True})
        assert usage["prompt_tokens"] == tokenized["count"]
        assert usage["completion_tokens"] == 4
        assert usage["total_tokens"] == usage["prompt_tokens"] + 4
        metrics = _get(base + "/metrics")[1].decode()
        assert 'vllm:generation_tokens_total{engine="0",model_name="tiny"} 12.0' in metrics
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
