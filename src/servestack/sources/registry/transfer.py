"""How long a conversation with a registry may take: an overall deadline and a stall rule.

`pull` and `verify` run under a deadline (`--timeout`, DEFAULT_TIMEOUT): every request, retry and
read of a body checks it, so no registry or proxy can hold them longer, however it answers. Under a
deadline a body must also keep moving: no byte for STALL_SECONDS, or less than MIN_RATE bytes a
second on average once past STALL_SECONDS, and the read stops, naming the registry and the path
(a registry that sends headers then nothing, or one byte every 10 s). A stall is not retried: the
same registry would stall again, and the caller decides (pull skips a candidate, or fails naming it).

Without a deadline (publish, the image step) requests keep the client's own timeout and retries:
a large upload may wait minutes for the registry to hash it.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import requests
import urllib3

from servestack.errors import Stalled

DEFAULT_TIMEOUT = 300.0  # seconds for one pull or verify's registry work; a healthy pull takes 1-3
STALL_SECONDS = 5.0  # no byte of a response for this long: the registry stalled
MIN_RATE = 32 * 1024  # bytes a second a body must average once it has taken longer than STALL_SECONDS
CONNECT_SECONDS = 5.0
READ_SIZE = 1 << 20
# What a retry's backoff waits with: one name, so a test can wait no time and see the waits asked for.
sleep = time.sleep


@dataclass(frozen=True, kw_only=True)
class Deadline:
    seconds: float
    end: float  # time.monotonic() at which it passes

    def remaining(self) -> float:
        return self.end - time.monotonic()


_CURRENT: ContextVar[Deadline | None] = ContextVar("servestack_registry_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """Every registry request made inside (in this thread) ends by SECONDS from now."""
    if not seconds > 0:
        raise ValueError(f"a deadline of {seconds} s")
    token = _CURRENT.set(Deadline(seconds=seconds, end=time.monotonic() + seconds))
    try:
        yield _CURRENT.get()  # type: ignore[misc]
    finally:
        _CURRENT.reset(token)


def current() -> Deadline | None:
    return _CURRENT.get()


def check(what: str) -> None:
    """Stalled once the deadline has passed."""
    limit = current()
    if limit is not None and limit.remaining() <= 0:
        raise Stalled(f"the {limit.seconds:g} s deadline (--timeout) passed before {what}")


def timeout(default: float) -> float | tuple[float, float]:
    """The requests timeout for one request: DEFAULT without a deadline; else connect and per-read
    timeouts within what is left of it."""
    limit = current()
    if limit is None:
        return default
    left = max(limit.remaining(), 0.01)
    return min(CONNECT_SECONDS, left), min(STALL_SECONDS, left)


def pause(seconds: float, what: str) -> None:
    """A retry's backoff, cut short (Stalled) when it would outlast the deadline."""
    limit = current()
    if limit is not None and limit.remaining() <= seconds:
        raise Stalled(f"the {limit.seconds:g} s deadline (--timeout) leaves no time to retry {what}")
    sleep(seconds)


def is_stall(exc: BaseException) -> bool:
    """Whether a requests exception is a timeout (under a deadline, a stall rather than a glitch)."""
    return current() is not None and isinstance(exc, (requests.exceptions.Timeout, socket.timeout))


def chunks(response: requests.Response, where: str) -> Iterator[bytes]:
    """RESPONSE's body as it arrives (each piece as soon as the socket gives it). Under a deadline,
    Stalled when no byte comes for STALL_SECONDS, when the average falls under MIN_RATE past
    STALL_SECONDS, or when the deadline passes; WHERE names the registry and the path. Other
    transport failures are requests' ConnectionError, which the client retries."""
    limit, started, received = current(), time.monotonic(), 0
    raw = response.raw
    while True:
        try:
            data = raw.read1(READ_SIZE, decode_content=True) if hasattr(raw, "read1") else raw.read(READ_SIZE)
        except (TimeoutError, urllib3.exceptions.ReadTimeoutError):
            if limit is None:
                raise requests.exceptions.ConnectionError(f"{where}: read timed out") from None
            raise Stalled(f"{where}: no byte for {STALL_SECONDS:g} s after {received} bytes") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise requests.exceptions.ConnectionError(f"{where}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not data:
            return
        received += len(data)
        yield data
        if limit is None:
            continue
        elapsed = time.monotonic() - started
        if limit.remaining() <= 0:
            raise Stalled(f"{where}: the {limit.seconds:g} s deadline (--timeout) passed after {received} bytes")
        if elapsed > STALL_SECONDS and received < MIN_RATE * elapsed:
            raise Stalled(f"{where}: {received} bytes in {elapsed:.0f} s, under the {MIN_RATE // 1024} KiB/s "
                          f"a registry must keep up")
