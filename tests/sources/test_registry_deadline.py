"""The registry client under a deadline, against a local HTTP server that stalls (no daemon): a
response that sends headers then nothing, or one byte at a time, is cut off and named; without a
deadline the same client keeps its own timeouts (publish's uploads may wait on a registry)."""

from __future__ import annotations

import time

import pytest

from fixtures.hostile_registry import HostileRegistry, exactly
from servestack.errors import NetworkError
from servestack.sources.registry import Client, sha256_digest, transfer

BLOB = b"x" * 3700  # the size of the blob the issue saw read for 150 s
DIGEST = sha256_digest(BLOB)


def _silence(seconds: float):
    """Headers, then nothing for SECONDS (the server's thread returns then; the client is long gone)."""
    def body():
        time.sleep(seconds)
        yield b""
    return body


def _trickle(data: bytes, every: float):
    def body():
        for i in range(len(data)):
            yield data[i:i + 1]
            time.sleep(every)
    return body


@pytest.fixture
def stalling(monkeypatch):
    monkeypatch.setattr(transfer, "STALL_SECONDS", 0.5)
    hostile = HostileRegistry.start(upstream="127.0.0.1:9")  # nothing is passed through
    hostile.answer("/v2/", exactly(b"{}"), "application/json")
    yield hostile
    hostile.stop()


@pytest.mark.parametrize("body", [_silence(5), _trickle(BLOB, 0.2)], ids=["headers-then-silence", "a-byte-at-a-time"])
def test_a_stalled_blob_is_cut_off_naming_the_registry_and_the_blob(stalling, body):
    stalling.answer(f"/v2/servestack/x/blobs/{DIGEST}", body, "application/octet-stream")
    client = Client(stalling.address, "servestack/x")
    started = time.monotonic()
    with transfer.deadline(30), pytest.raises(NetworkError) as failed:
        client.get_blob(DIGEST)
    assert time.monotonic() - started < 3
    assert f"registry {stalling.address} stalled" in str(failed.value)
    assert f"/v2/servestack/x/blobs/{DIGEST}" in str(failed.value)


def test_the_deadline_ends_a_body_that_keeps_up_the_rate_and_a_retry_that_would_outlast_it(stalling, monkeypatch):
    monkeypatch.setattr(transfer, "MIN_RATE", 1)  # this trickle keeps up: only the deadline ends it
    stalling.answer(f"/v2/servestack/x/blobs/{DIGEST}", _trickle(BLOB, 0.001), "application/octet-stream")
    client = Client(stalling.address, "servestack/x")
    started = time.monotonic()
    with transfer.deadline(1.0), pytest.raises(NetworkError, match=r"the 1 s deadline \(--timeout\) passed"):
        client.get_blob(DIGEST)
    assert time.monotonic() - started < 2
    with transfer.deadline(0.2), pytest.raises(NetworkError, match="deadline"):  # a refused port: retries cut short
        Client("127.0.0.1:9", "servestack/x", backoff=0.5).get_blob(DIGEST)


def test_a_healthy_answer_under_a_deadline_is_read_whole(stalling):
    stalling.answer(f"/v2/servestack/x/blobs/{DIGEST}", exactly(BLOB), "application/octet-stream")
    with transfer.deadline(10):
        assert Client(stalling.address, "servestack/x").get_blob(DIGEST) == BLOB
