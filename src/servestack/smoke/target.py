"""What the serving checks talk to (endpoints.py's table, engines.py): one shape, ready to serve."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servestack.smoke.readiness import DynamoWorkers


@dataclass(kw_only=True)
class Target:
    """What the checks talk to; `metrics` collects what they measure for smoke.json."""

    base: str  # http://127.0.0.1:<published port>
    model: str
    http: Any  # a requests.Session that never goes through a proxy
    timeout: float
    metrics: dict[str, Any] = field(default_factory=dict)
    logs: dict[str, Callable[[], str]] = field(default_factory=dict)  # role -> its whole log so far
    kv_wait_s: float = 30.0  # vLLM logs KV transfer stats once per stats interval (10 s)
    decode_log_at_ready: int = 0  # how much of the decode worker's log was written before the checks
    # The oracle (clients/agreement.py): prompt ids are drawn below this many (None: no oracle for
    # this model, e.g. a GPU stack's real checkpoint), and the aggregated server's answers to compare with.
    oracle_vocab: int | None = None
    baseline: dict[str, Any] | None = None
    gdn_layers: int = 0  # the model's Gated DeltaNet layers (0: not a hybrid)
    gpus: int = 0  # GPUs the engines run on (0: on CPU)
    ready_s: dict[str, float] = field(default_factory=dict)  # engine role -> seconds from its start to serving
    logged_at_ready: dict[str, int] = field(default_factory=dict)  # role -> how much of its log was written by ready
    workers: DynamoWorkers | None = None  # the disaggregated workers as the frontend listed them at ready
