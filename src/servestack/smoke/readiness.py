"""Whether Dynamo's frontend has both workers and routes through them, read from its own HTTP API.

Never from a log: the production image sets `DYN_LOG=error`, which keeps every INFO line of
Dynamo's out of it (the frontend's "prefill router", discovery's "Expired path"). Dynamo 1.6.1's
frontend answers on its HTTP port, the one port the probe publishes:

- `GET /health` (lib/llm/src/http/service/health.rs): `{"status", "endpoints", "instances": [...]}`,
  every instance discovery holds, each `{"component", "endpoint", "namespace", "instance_id", ...}`.
  `python -m dynamo.vllm` registers a prefill worker as component `prefill` and a decode worker as
  `backend` (dynamo/vllm/args.py), each with a `generate` endpoint. On the dev-cpu image the prefill
  worker's instance came at 50 s, the decode worker's at 52 s, and `/v1/models` listed the model
  at 52 s, with `DYN_LOG=error`.
- `GET /metrics`: once it has routed a request, the frontend keeps gauges per worker, labelled with
  the worker's instance id and type: `dynamo_frontend_worker_last_time_to_first_token_seconds
  {worker_id="<the prefill instance>",worker_type="prefill"}` and
  `dynamo_frontend_worker_last_inter_token_latency_seconds{worker_id="<the decode instance>",
  worker_type="decode"}`. A request served without the prefill worker leaves no prefill series.

So the shape is ready when the model is listed, both workers' `generate` instances are, and a
first completion was served with the frontend's metrics naming those two instances as the workers
it routed to. The same `/health` tells the `discovery` check whether both are still registered at
the end.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    import requests

# role -> the component dynamo.vllm registers it as (dynamo/vllm/args.py, 1.6.1)
COMPONENTS = {"prefill": "prefill", "decode": "backend"}
# role -> the worker_type the frontend's per-worker metrics give it
WORKER_TYPES = {"prefill": "prefill", "decode": "decode"}
_WORKER_SERIES = re.compile(r"^dynamo_frontend_worker_last_\w+\{(?P<labels>[^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def model_listed(model: str) -> Callable[[Any, str], bool]:
    """`GET /v1/models` lists `model`."""
    def listed(http: requests.Session, base: str) -> bool:
        r = http.get(base + "/v1/models", timeout=5)
        return r.status_code == 200 and model in [m.get("id") for m in r.json().get("data", [])]

    return listed


def generate_instances(health: Any) -> dict[str, set[str]]:
    """role -> the instance ids (decimal, as the metrics write them) of its `generate` endpoint in
    the frontend's `/health` answer."""
    found: dict[str, set[str]] = {role: set() for role in COMPONENTS}
    instances = health.get("instances") if isinstance(health, dict) else None
    for instance in instances if isinstance(instances, list) else []:
        if not isinstance(instance, dict) or instance.get("endpoint") != "generate":
            continue
        for role, component in COMPONENTS.items():
            if instance.get("component") == component and instance.get("instance_id") is not None:
                found[role].add(str(instance["instance_id"]))
    return found


def routed_workers(metrics: str) -> dict[str, set[str]]:
    """worker_type -> the worker ids the frontend's per-worker gauges name."""
    routed: dict[str, set[str]] = {}
    for m in _WORKER_SERIES.finditer(metrics):
        labels = dict(_LABEL.findall(m["labels"]))
        if labels.get("worker_type") and labels.get("worker_id"):
            routed.setdefault(labels["worker_type"], set()).add(labels["worker_id"])
    return routed


def _shown(ids: dict[str, set[str]]) -> str:
    return ", ".join(f"{role} {sorted(found) or 'none'}" for role, found in ids.items()) or "none"


@dataclass(kw_only=True)
class DynamoWorkers:
    """Both workers as the frontend sees them. Called as FirstRequest's `registered` (once a second
    until it holds), `routed` after each served first completion, `gone` by the discovery check."""

    model: str
    started: float  # time.monotonic() when the probe started
    registered_s: dict[str, float] = field(default_factory=dict)  # role -> when its instance was first listed
    instances: dict[str, set[str]] = field(default_factory=dict)  # role -> instance ids, at the last look
    settle_s: float = 0.5  # between reads of /metrics after a served completion
    reads: int = 3

    def look(self, http: requests.Session, base: str) -> dict[str, set[str]]:
        r = http.get(base + "/health", timeout=5)
        try:
            body = r.json()
        except ValueError:
            body = None
        return generate_instances(body)

    def __call__(self, http: requests.Session, base: str) -> bool:
        found = self.look(http, base)
        at = round(time.monotonic() - self.started, 2)
        for role, ids in found.items():
            if ids:
                self.registered_s.setdefault(role, at)
        self.instances = found
        return all(found.values()) and model_listed(self.model)(http, base)

    def routed(self, http: requests.Session, base: str) -> str | None:
        """None when the frontend's metrics name a listed prefill and a listed decode instance as
        workers it routed to; else what they name instead (a served request that was not disaggregated)."""
        missing: list[str] = []
        routed: dict[str, set[str]] = {}
        for read in range(self.reads):
            if read:
                time.sleep(self.settle_s)
            routed = routed_workers(http.get(base + "/metrics", timeout=5).text)
            missing = [role for role, kind in WORKER_TYPES.items() if not routed.get(kind, set()) & self.instances.get(role, set())]
            if not missing:
                return None
        return (f"served, but the frontend's metrics name no {' and no '.join(missing)} worker among those it routed to "
                f"(per-worker series: {_shown(routed)}; listed instances: {_shown(self.instances)})")

    def gone(self, http: requests.Session, base: str) -> dict[str, set[str]]:
        """role -> the instances listed at ready that the frontend no longer lists (empty: none gone)."""
        now = self.look(http, base)
        return {role: lost for role, ids in self.instances.items() if (lost := ids - now.get(role, set()))}

    def describe(self) -> str:
        return ", ".join(f"{role} {' '.join(sorted(ids))}" for role, ids in self.instances.items())

    def to_json(self) -> dict[str, Any]:
        return {"registered_s": dict(self.registered_s), "instances": {role: sorted(ids) for role, ids in self.instances.items()}}
