"""When the disaggregated shape is ready: both workers registered with the frontend AND a first
small completion served through it (prefill, KV over NIXL, decode), retried until the deadline.
What "registered" and "through both workers" mean is read from the frontend's own API
(readiness.py), never from a log.

Why a served request and not only registration: the decode worker's first request for a prefill
worker starts vLLM 0.31's NIXL handshake with that worker's side channel, whose reply it waits for
at most 5 s (a hard-coded zmq RCVTIMEO, nixl/base_worker.py `_nixl_handshake`; no setting). On a
loaded 2-core machine the reply can come later: the request then fails (Dynamo answers HTTP 500),
nothing is cached, and the next request handshakes again. Every failed attempt is kept, with the
decode worker's own reason from its log, for the `ready` check's detail and smoke.json: a retried
start is visible, and a pair that never serves still fails `ready`, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from servestack.smoke.endpoints import decode_failure_reason, nixl_failures, post_completion, summarize

if TYPE_CHECKING:
    import requests

# A short prompt and two tokens: enough for the prefill worker to compute the prompt's KV, the
# decode worker to pull it and decode from it.
FIRST_REQUEST = {"prompt": "Warm up:", "max_tokens": 2, "temperature": 0, "ignore_eos": True}


@dataclass(frozen=True, kw_only=True)
class FailedAttempt:
    attempt: int  # 1-based
    at_s: float  # when it was sent, seconds since the probe started
    took_s: float
    outcome: str  # "HTTP 500: {...}", or the request's exception
    decode: tuple[str, ...]  # the decode worker's NIXL failures logged meanwhile

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "at_s": self.at_s, "took_s": self.took_s, "outcome": self.outcome,
                "decode_nixl_failures": list(self.decode)}

    def describe(self) -> str:
        decode = f"; decode worker: {summarize(list(self.decode))}" if self.decode else ""
        return f"#{self.attempt} at {self.at_s:.0f} s ({self.took_s:.1f} s): {self.outcome}{decode}"


@dataclass(kw_only=True)
class FirstRequest:
    """The `ready` condition of the disaggregated probe, called once a second until it holds or the
    deadline passes (serving._await_ready): False until `registered` holds, then one completion
    through the frontend per call until one is served."""

    registered: Callable[[Any, str], bool]
    model: str
    decode_log: Callable[[], str]
    timeout: float  # for one request
    started: float  # time.monotonic() when the probe started
    deadline_s: float  # since `started`: no request outlives it
    # After a served completion: None when it went through both workers, else why not (readiness.py).
    routed: Callable[[Any, str], str | None] | None = None
    failed: list[FailedAttempt] = field(default_factory=list)
    registered_s: float | None = None
    served_s: float | None = None

    def __call__(self, http: requests.Session, base: str) -> bool:
        if self.registered_s is None:
            if not self.registered(http, base):
                return False
            self.registered_s = round(time.monotonic() - self.started, 2)
        logged_before = len(self.decode_log())
        sent = time.monotonic()
        timeout = max(1.0, min(self.timeout, self.started + self.deadline_s - sent))
        try:
            # Served when the answer carries sane usage (no text is asked of it); 200 characters of a
            # failed one, as every attempt is listed.
            outcome = post_completion(http, base, self.model, FIRST_REQUEST, timeout, shown=200)[1]
        except Exception as e:  # noqa: BLE001 - a refused, reset or timed-out request is a failed attempt
            outcome = f"{type(e).__name__}: {str(e)[:200]}"
        if outcome is None and self.routed is not None:
            try:
                outcome = self.routed(http, base)
            except Exception as e:  # noqa: BLE001 - metrics that cannot be read prove nothing
                outcome = f"served, but the frontend's /metrics could not be read: {type(e).__name__}: {str(e)[:200]}"
        if outcome is None:
            self.served_s = round(time.monotonic() - self.started, 2)
            return True
        self.failed.append(FailedAttempt(
            attempt=len(self.failed) + 1, at_s=round(sent - self.started, 1), took_s=round(time.monotonic() - sent, 1), outcome=outcome,
            decode=tuple(nixl_failures(self.decode_log()[logged_before:]))))
        return False

    @property
    def attempts(self) -> int:
        return len(self.failed) + (self.served_s is not None)

    def passed(self) -> str:
        """The `ready` detail once a completion was served."""
        retried = f"; {len(self.failed)} failed before it: {self.history()}" if self.failed else ""
        through = " through the prefill and the decode worker (the frontend's metrics name both)" if self.routed else ""
        return (f"both workers registered after {self.registered_s:.1f} s; a first completion through the "
                f"frontend was served{through} after {self.served_s:.1f} s, on attempt {self.attempts}{retried}")

    def never(self, problem: str) -> str:
        """The `ready` detail when the deadline passed or a container exited first."""
        if self.registered_s is None:
            return problem
        tried = (f"{len(self.failed)} completion(s) through the frontend failed: {self.history()}; "
                 f"decode worker: {decode_failure_reason(self.decode_log())}") if self.failed else \
            "no completion was sent"
        return (f"both workers registered after {self.registered_s:.1f} s but the pair never served a request: "
                f"{tried}; {problem}")

    def history(self, most: int = 4) -> str:
        """The failed attempts: the first ones and the last, when there were more than `most`."""
        if len(self.failed) <= most:
            return "; ".join(f.describe() for f in self.failed)
        left_out = len(self.failed) - most
        return "; ".join([*(f.describe() for f in self.failed[:most - 1]), f"({left_out} more)",
                          self.failed[-1].describe()])

    def to_json(self) -> dict[str, Any]:
        return {"registered_s": self.registered_s, "served_s": self.served_s, "attempts": self.attempts,
                "failed": [f.to_json() for f in self.failed]}
