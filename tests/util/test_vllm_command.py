"""Every server servestack starts gets its flags through one rule, written the way recipes write them."""

from __future__ import annotations

from servestack.util.vllm_command import flags_to_argv, server_argv


def test_flags_are_written_the_way_recipes_write_them():
    assert flags_to_argv({
        "max-num-batched-tokens": 16384,
        "enforce_eager": True,
        "disable-log-requests": False,
        "quantization": None,
        "kv-transfer-config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        "middleware": ["a", "b"],
        "-O3": True,
    }) == [
        "--max-num-batched-tokens", "16384",
        "--enforce-eager",
        "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
        "--middleware", "a", "--middleware", "b",
        "-O3",
    ]


def test_the_server_runs_as_a_module_so_the_cpu_build_works_too():
    assert server_argv("/opt/venv/bin/python", {"model": "/model", "port": 8000}) == [
        "/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/model", "--port", "8000"]
