"""Disaggregated smoke, judged from what the workers say: KV transfers, discovery leases, NIXL failures, the first request."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

DIGEST = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32

# vLLM 0.31's NixlConnector stats line, as its decode worker logs it (one per stats interval).
KV_LOG = """\
(EngineCore pid=80) INFO 11-30 21:10:02 [metrics.py:103] KV Transfer metrics: Num successful transfers=1, Avg xfer time (ms)=3.1, P90 xfer time (ms)=3.1, Avg post time (ms)=0.4, P90 post time (ms)=0.4, Avg MB per transfer=0.03, Throughput (MB/s)=9.6, Avg number of descriptors=2, Num failed transfers=0, Num KV expired reqs=0
(EngineCore pid=80) INFO 11-30 21:10:12 [metrics.py:103] KV Transfer metrics: Num successful transfers=2, Avg xfer time (ms)=1.0, P90 xfer time (ms)=1.2, Avg post time (ms)=0.2, P90 post time (ms)=0.3, Avg MB per transfer=0.03, Throughput (MB/s)=30.0, Avg number of descriptors=2, Num failed transfers=0, Num KV expired reqs=0
"""


def test_kv_transfers_are_summed_over_the_workers_stats_intervals() -> None:
    from servestack.smoke.endpoints import Target, check_kv_transfer
    from servestack.util.workerlogs import kv_transfers

    assert kv_transfers(KV_LOG) == {"successful": 3, "failed": 0}
    assert kv_transfers("no stats yet") == {"successful": 0, "failed": 0}
    sent = {"completion_usage": {}, "sampled_usage": {}, "chat_usage": {}, "first_token_latency_s": 0.1}
    target = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent),
                    logs={"decode": lambda: KV_LOG, "prefill": lambda: ""},
                    kv_wait_s=0)
    status, detail = check_kv_transfer(target)
    assert status == "pass" and "3 successful NIXL transfer(s)" in detail and target.metrics["kv_transfers"] == 3
    aggregated = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent),
                        logs={"decode": lambda: "", "prefill": lambda: ""},
                        kv_wait_s=0)
    status, detail = check_kv_transfer(aggregated)  # served without the KV moving: no evidence, a failure
    assert status == "fail" and "0 successful" in detail
    partial = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent),
                     logs={"decode": lambda: KV_LOG.splitlines()[0],
                                                                          "prefill": lambda: ""}, kv_wait_s=0)
    status, detail = check_kv_transfer(partial)  # the KV moved, none failed: the count is reported
    assert status == "pass" and "1 successful NIXL transfer(s) and 0 failed for 4 request(s)" in detail
    failed = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent), kv_wait_s=0, logs={
        "decode": lambda: KV_LOG.replace("Num failed transfers=0", "Num failed transfers=1"), "prefill": lambda: ""})
    assert check_kv_transfer(failed)[0] == "fail"


# What Dynamo 1.6.1 logs when a starved decode worker's file-discovery entries expire.
DROPPED_FRONTEND = ("\x1b[2m2026-12-01T02:50:26.436511Z\x1b[0m \x1b[32m INFO\x1b[0m dynamo_llm::discovery::model: Removed worker "
                    "set from model model=servestack/tiny-qwen35 namespace=[\"dynamo\",\"backend\"] remaining_sets=0\n")
EXPIRED_BY_PREFILL = ("2026-12-01T06:08:32.882139Z  INFO dynamo_runtime::storage::kv::file: Expired path=\"/run/servestack/"
                      "discovery/v1/mdc/dynamo%2Fbackend%2Fgenerate%2Fd01e9319bc4f12da\" last_modified=SystemTime { "
                      "tv_sec: 1796105300, tv_nsec: 987935522 }\n")
DROPPED_DECODE = ("2026-12-01T02:50:26.500108Z ERROR dynamo_runtime::storage::kv::file: FileStore::keep_alive failed opening "
                  "owned file path=/run/servestack/discovery/v1/mdc/dynamo%2Fbackend%2Fgenerate%2Fcb39 error=No such file\n")


def test_a_worker_dropped_from_discovery_fails_saying_why() -> None:
    from servestack.smoke.endpoints import Target, check_discovery

    quiet = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, logs={"frontend": lambda: "Adding worker set to model\n",
                                                               "decode": lambda: KV_LOG})
    assert check_discovery(quiet)[0] == "pass"
    dropped = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, logs={"frontend": lambda: DROPPED_FRONTEND,
                                                                 "decode": lambda: DROPPED_DECODE, "prefill": lambda: ""})
    status, detail = check_discovery(dropped)
    assert status == "fail" and "expired" in detail and "404" in detail
    assert "[frontend] " in detail and "Removed worker set from model" in detail and "\x1b" not in detail
    assert "[decode] " in detail and "keep_alive failed" in detail and "[prefill]" not in detail
    # The process that deleted the entries is named too, with the entry's last refresh.
    expired = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, logs={"frontend": lambda: DROPPED_FRONTEND,
                                                                 "prefill": lambda: EXPIRED_BY_PREFILL})
    status, detail = check_discovery(expired)
    assert status == "fail" and "[prefill] " in detail and "Expired path=" in detail and "last_modified" in detail


def test_the_lease_holder_tells_a_live_container_from_a_gone_one_without_the_daemon() -> None:
    # Under load a docker API round trip can take seconds; the holder reads the init process from /proc.
    import subprocess
    from types import SimpleNamespace

    from servestack.smoke.discovery import all_running, container_alive

    child = subprocess.Popen(["sleep", "30"])
    try:
        alive = SimpleNamespace(attrs={"State": {"Pid": child.pid}})
        assert container_alive(alive) and all_running([alive])
    finally:
        child.kill()
        child.wait()
    assert not container_alive(alive) and not all_running([alive])


def test_the_probe_holds_the_discovery_leases_until_released(tmp_path) -> None:
    # Dynamo expires a discovery entry whose mtime is 10 s old; the probe keeps its workers' entries a minute ahead.
    from servestack.smoke.discovery import DiscoveryLeases

    entry = tmp_path / "v1" / "instances" / "dynamo%2Fbackend%2Fgenerate%2F1"
    entry.parent.mkdir(parents=True)
    entry.write_text("{}")
    temporary = tmp_path / "v1" / "instances" / ".tmp_0123"
    temporary.write_text("")
    old = time.time() - 60
    for path in (entry, temporary):
        os.utime(path, (old, old))
    alive = [True]
    leases = DiscoveryLeases(str(tmp_path), lambda: alive[0], every=0.05)
    try:
        deadline = time.monotonic() + 10
        while entry.stat().st_mtime < old + 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert entry.stat().st_mtime > time.time() + 30  # held ahead: a starved holder keeps it for a minute
        assert temporary.stat().st_mtime == pytest.approx(old)  # Dynamo's half-written files are not its entries
        alive[0] = False  # a worker's container stopped: its entries must be left to expire
        time.sleep(0.2)
        os.utime(entry, (old, old))
        time.sleep(0.2)
        assert entry.stat().st_mtime == pytest.approx(old)
    finally:
        longest_gap = leases.stop()
    assert 0.04 <= longest_gap < 5  # what smoke.json reports, to tell a starved holder from a starved worker


def _can_pin(directory: Path) -> bool:
    from servestack.smoke.discovery import _set_immutable

    try:
        _set_immutable(str(directory), True)
    except OSError:
        return False
    _set_immutable(str(directory), False)
    return True


def test_pinned_discovery_keeps_every_entry_a_stalled_machine_would_expire_and_lets_a_dead_worker_go(tmp_path) -> None:
    # A stall longer than the TTL (the VM stopped for 108 s): Dynamo's expiry thread, first to run
    # again, unlinks every entry older than 10 s. Pinned, the unlink is refused; the owner's keep-alive
    # (a new mtime on the file it has) still works. Once a container stops, Dynamo may expire again.
    from servestack.smoke.discovery import DiscoveryLeases

    if not _can_pin(tmp_path):
        pytest.skip(f"{tmp_path}: the file system or user cannot set the immutable attribute")
    bucket = tmp_path / "v1" / "instances"
    bucket.mkdir(parents=True)
    entry = bucket / "dynamo%2Fprefill%2Fgenerate%2F1"
    entry.write_text("{}")
    alive = [True]
    leases = DiscoveryLeases(str(tmp_path), lambda: alive[0], every=0.05)
    try:
        assert leases.pin()
        with pytest.raises(PermissionError):
            entry.unlink()  # what the expiry thread does to an entry it finds too old
        os.utime(entry)  # the owner's keep-alive
        with pytest.raises(PermissionError):
            (bucket / ".tmp_late").write_text("")  # nothing registers after ready
        alive[0] = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(PermissionError):
                entry.unlink()
                break
            time.sleep(0.05)
        assert not entry.exists()  # the dead worker's entry expires as Dynamo would expire it
    finally:
        leases.stop()
    (tmp_path / "v1" / "later").mkdir()  # nothing is left pinned


def test_stopping_the_hold_unpins_so_the_discovery_directory_can_be_removed(tmp_path) -> None:
    import shutil

    from servestack.smoke.discovery import DiscoveryLeases

    if not _can_pin(tmp_path):
        pytest.skip(f"{tmp_path}: the file system or user cannot set the immutable attribute")
    (tmp_path / "d" / "v1").mkdir(parents=True)
    (tmp_path / "d" / "v1" / "entry").write_text("{}")
    leases = DiscoveryLeases(str(tmp_path / "d"), lambda: True, every=0.05)
    assert leases.pin()
    leases.stop()
    shutil.rmtree(tmp_path / "d")
    assert not (tmp_path / "d").exists()


# What vLLM 0.31's decode worker logs when its NIXL handshake with the prefill worker's side channel
# gets no reply within its hard-coded 5 s (the tail of the CI log of run 19, completed by the lines
# vLLM's _log_failure writes before it and the exception line Python writes after it).
_P = "(Worker pid=44) ERROR 12-01 09:00:43 [base_worker.py:1375] "
HANDSHAKE_TIMEOUT = "".join(_P + line + "\n" for line in [
    "NIXL transfer failure: handshake_failed | Context: {'failure_type': 'handshake_failed', 'request_id': "
    "'cmpl-1', 'engine_id': 'd-1', 'remote_engine_id': 'p-1', 'remote_request_id': 'cmpl-1', 'remote_host': "
    "'127.0.0.1', 'remote_port': 20097, 'num_local_blocks': 1, 'num_remote_blocks': 1, 'local_block_ids_sample': [3]}",
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", '
    "line 1370, in request_ready",
    "    f.result()",
    '  File "/usr/lib/python3.11/concurrent/futures/_base.py", line 449, in result',
    "    return self.__get_result()",
    "           ^^^^^^^^^^^^^^^^^^^",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", '
    "line 1068, in _nixl_handshake",
    "    reply_parts = sock.recv_multipart()",
    "                  ^^^^^^^^^^^^^^^^^^^^^",
    "zmq.error.Again: Resource temporarily unavailable",
])


def test_the_error_lines_of_a_log_include_the_exception_ending_each_traceback() -> None:
    from servestack.smoke.containers import log_errors, log_excerpt

    # Neither ends in Error nor Exception, and neither is in the log's last lines.
    log = HANDSHAKE_TIMEOUT + "INFO 12-01 09:00:44 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0\n" * 30
    assert log_errors(log) == ["zmq.error.Again: Resource temporarily unavailable"]
    assert "errors in its log:\n  zmq.error.Again: Resource temporarily unavailable\n" in log_excerpt(log, 5)
    # Still the `SomeError: message` lines outside a traceback, in the order logged, each once.
    noisy = "ValueError: bad flag\n" + HANDSHAKE_TIMEOUT + "ValueError: bad flag\nRuntimeError: worker died\n"
    assert log_errors(noisy) == ["ValueError: bad flag", "zmq.error.Again: Resource temporarily unavailable",
                                 "RuntimeError: worker died"]
    assert log_errors("all quiet\n") == []


def test_nixl_failures_name_the_kind_the_side_channel_and_the_exception() -> None:
    from servestack.smoke.endpoints import decode_failure_reason, nixl_failures

    setup = HANDSHAKE_TIMEOUT.replace("handshake_failed | Context: {'failure_type': 'handshake_failed', 'request_id': 'cmpl-1'",
                                      "handshake_setup_failed | Context: {'failure_type': 'handshake_setup_failed', "
                                      "'request_id': None").replace("'remote_host': '127.0.0.1', 'remote_port': 20097, ", "")
    assert nixl_failures(setup + HANDSHAKE_TIMEOUT + HANDSHAKE_TIMEOUT) == [
        "handshake_setup_failed: zmq.error.Again: Resource temporarily unavailable",
        *["handshake_failed with 127.0.0.1:20097: zmq.error.Again: Resource temporarily unavailable"] * 2,
    ]
    assert decode_failure_reason(HANDSHAKE_TIMEOUT * 2) == (
        "NIXL failures: 2 x handshake_failed with 127.0.0.1:20097: zmq.error.Again: Resource temporarily unavailable")
    # A failure logged with a message and no exception.
    assert nixl_failures(_P + "NIXL transfer failure: transfer_failed. Transfer expired | Context: {}\n") == [
        "transfer_failed: Transfer expired"]
    assert decode_failure_reason("RuntimeError: boom\n") == "errors in its log: RuntimeError: boom"
    assert decode_failure_reason("a\nb\n").startswith("no error in its log; last lines: a | b")


def test_a_failed_kv_transfer_shows_the_decode_workers_error_not_a_traceback_tail() -> None:
    from servestack.smoke.endpoints import Target, check_kv_transfer

    sent = {"completion_usage": {}, "chat_usage": {}, "first_token_latency_s": 0.1}
    target = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent), kv_wait_s=0,
                    logs={"decode": lambda: HANDSHAKE_TIMEOUT, "prefill": lambda: ""})
    status, detail = check_kv_transfer(target)
    assert status == "fail"
    assert "handshake_failed with 127.0.0.1:20097: zmq.error.Again: Resource temporarily unavailable" in detail
    assert "File " not in detail and "^^^" not in detail


def test_first_request_failures_are_reported_by_ready_not_by_the_kv_transfer_check() -> None:
    from servestack.smoke.endpoints import Target, check_kv_transfer

    # The first request's failed handshake is in the stats vLLM logs after ready.
    before = HANDSHAKE_TIMEOUT
    stats = KV_LOG.replace("Num failed transfers=0", "Num failed transfers=1", 1)
    first = {"served_s": 70.0, "failed": [{"attempt": 1}]}
    sent = {"completion_usage": {}, "chat_usage": {}, "first_token_latency_s": 0.1, "first_request": first}
    retried = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent), kv_wait_s=0,
                     decode_log_at_ready=len(before),
                     logs={"decode": lambda: before + stats, "prefill": lambda: ""})
    status, detail = check_kv_transfer(retried)
    assert status == "pass", detail
    assert "1 failed, while 1 failed first attempt(s) were retried (see ready) for 4 request(s)" in detail
    # A failure after ready is the check's.
    late = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent), kv_wait_s=0,
                  decode_log_at_ready=len(before),
                  logs={"decode": lambda: before + stats + HANDSHAKE_TIMEOUT, "prefill": lambda: ""})
    status, detail = check_kv_transfer(late)
    assert status == "fail" and "after ready the decode worker logged NIXL failures: handshake_failed with" in detail
    # Failed transfers in the stats that no failed first attempt explains.
    unexplained = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0,
                         metrics={**sent, "first_request": {"served_s": 60.0, "failed": []}},
                         kv_wait_s=0, logs={"decode": lambda: stats, "prefill": lambda: ""})
    assert check_kv_transfer(unexplained)[0] == "fail"
    # One failure before ready excuses one failed transfer in the stats, not three.
    stats_three = KV_LOG.replace("Num failed transfers=0", "Num failed transfers=3", 1)
    more = Target(base="http://127.0.0.1:9", model="m", http=None, timeout=1.0, metrics=dict(sent), kv_wait_s=0,
                  decode_log_at_ready=len(before),
                  logs={"decode": lambda: before + stats_three, "prefill": lambda: ""})
    status, detail = check_kv_transfer(more)
    assert status == "fail" and "3 failed, while 1 failed first attempt(s)" in detail, detail


class _FakeFrontend:
    """Answers POST /v1/completions from a script of (status, body); appends to the decode log."""

    def __init__(self, script: list[tuple[int, dict | str, str]]) -> None:
        self.script = list(script)
        self.decode_log = ""
        self.posted: list[dict] = []

    def post(self, url: str, timeout: float, json: dict):
        from types import SimpleNamespace

        assert url.endswith("/v1/completions") and timeout > 0
        self.posted.append(json)
        status, body, logged = self.script.pop(0)
        self.decode_log += logged
        text = body if isinstance(body, str) else __import__("json").dumps(body)
        return SimpleNamespace(status_code=status, text=text, json=lambda: body)


SERVED = {"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
HTTP_500 = '{"message":"Internal server error","code":500}'


def test_the_pair_is_ready_once_it_served_a_first_request_and_says_what_failed_before() -> None:
    from servestack.smoke.firstrequest import FirstRequest

    frontend = _FakeFrontend([(500, HTTP_500, HANDSHAKE_TIMEOUT), (200, SERVED, "")])
    registered = iter([False, True])
    first = FirstRequest(registered=lambda http, base: next(registered), model="m", decode_log=lambda: frontend.decode_log, timeout=120.0,
                         started=time.monotonic(), deadline_s=300.0)
    assert not first(frontend, "http://f") and not frontend.posted  # not registered: nothing sent
    assert not first(frontend, "http://f")  # attempt 1: HTTP 500
    assert first(frontend, "http://f")  # attempt 2 served
    assert frontend.posted[0]["model"] == "m" and frontend.posted[0]["max_tokens"] >= 1
    assert first.attempts == 2 and first.registered_s is not None and first.served_s is not None
    detail = first.passed()
    assert "on attempt 2; 1 failed before it: #1 at " in detail and "HTTP 500" in detail
    assert "decode worker: handshake_failed with 127.0.0.1:20097: zmq.error.Again: Resource temporarily unavailable" in detail
    recorded = first.to_json()
    assert recorded["attempts"] == 2 and recorded["failed"][0]["decode_nixl_failures"] == [
        "handshake_failed with 127.0.0.1:20097: zmq.error.Again: Resource temporarily unavailable"]
    assert "HTTP 500" in recorded["failed"][0]["outcome"]


def test_a_pair_that_never_serves_fails_ready_with_every_attempt_and_the_reason() -> None:
    from servestack.smoke.firstrequest import FirstRequest

    frontend = _FakeFrontend([(500, HTTP_500, HANDSHAKE_TIMEOUT)] * 6 + [(200, {"choices": [{"text": "x"}]}, "")])
    first = FirstRequest(registered=lambda http, base: True, model="m", decode_log=lambda: frontend.decode_log, timeout=120.0,
                         started=time.monotonic(), deadline_s=300.0)
    assert not any(first(frontend, "http://f") for _ in range(7))  # the 7th answers 200 without usage: not served
    assert first.attempts == 7 and first.served_s is None
    detail = first.never("not ready after 300 s")
    assert detail.startswith("both workers registered after ") and "the pair never served a request" in detail
    assert "7 completion(s) through the frontend failed" in detail and "(3 more)" in detail and "#7 at " in detail
    assert "usage" in detail  # the 7th attempt's problem
    assert "6 x handshake_failed with 127.0.0.1:20097: zmq.error.Again" in detail and detail.endswith("not ready after 300 s")
    # Not registered before the deadline: the problem as it was.
    unregistered = FirstRequest(registered=lambda http, base: False, model="m", decode_log=lambda: "", timeout=120.0,
                                started=time.monotonic(), deadline_s=300.0)
    assert not unregistered(frontend, "http://f") and unregistered.never("not ready after 300 s") == "not ready after 300 s"


def test_a_first_request_that_raises_is_a_failed_attempt() -> None:
    from servestack.smoke.firstrequest import FirstRequest

    class Refusing:
        def post(self, url, timeout, json):
            raise ConnectionError("connection refused")

    first = FirstRequest(registered=lambda http, base: True, model="m", decode_log=lambda: "", timeout=120.0, started=time.monotonic(),
                         deadline_s=300.0)
    assert not first(Refusing(), "http://f")
    assert first.failed[0].outcome == "ConnectionError: connection refused" and first.failed[0].decode == ()


def test_the_summary_says_when_the_disaggregated_pair_needed_retries_to_serve() -> None:
    from servestack.smoke.summary import PASS, Check, SmokeRecord, SmokeResult

    def summary(attempts: int) -> str:
        disagg = {"time_to_ready_s": 80.0, "first_token_latency_s": 3.0, "kv_transfers": 4, "kv_transfers_failed": 1,
                  "first_request": {"attempts": attempts}}
        record = SmokeRecord(stack="s", image=DIGEST, platform="linux/amd64", lock_sha256="b" * 64, wall_s=100.0,
                             metrics={"disagg": disagg},
                             checks=(Check(probe="disagg", name="ready", status=PASS, detail="ok"),))
        return SmokeResult(record=record, smoke_json=Path("smoke.json"), junit_xml=Path("smoke-junit.xml")).summary()

    assert "disagg   ready in 80.0 s (served a first request on attempt 3), first token 3.000 s" in summary(3)
    assert "disagg   ready in 80.0 s, first token 3.000 s, KV transfers over NIXL 4 (failed 1)" in summary(1)


def test_a_first_request_answered_200_without_a_completion_is_not_served() -> None:
    from servestack.smoke.firstrequest import FirstRequest

    frontend = _FakeFrontend([(200, [], ""), (200, {"choices": []}, "")])
    first = FirstRequest(registered=lambda http, base: True, model="m", decode_log=lambda: frontend.decode_log, timeout=120.0,
                         started=time.monotonic(), deadline_s=300.0)
    assert not first(frontend, "http://f") and not first(frontend, "http://f")
    assert first.failed[0].outcome == "not an object: []" and first.failed[1].outcome == "no usage in the response"


def test_the_probes_and_the_first_request_judge_a_completion_answer_alike() -> None:
    """One reading of POST /v1/completions (endpoints.post_completion): a 200 that is not a JSON object
    fails the completion checks saying so, as it fails a first request, instead of an AttributeError."""
    from servestack.smoke.endpoints import Target, check_completions
    from servestack.smoke.firstrequest import FirstRequest

    listed = Target(base="http://f", model="m", http=_FakeFrontend([(200, [], "")]), timeout=1.0)
    assert check_completions(listed) == ("fail", "not an object: []")
    first = FirstRequest(registered=lambda http, base: True, model="m", decode_log=lambda: "", timeout=120.0, started=time.monotonic(),
                         deadline_s=300.0)
    assert not first(_FakeFrontend([(200, [], "")]), "http://f") and first.failed[0].outcome == "not an object: []"
    # The checks ask for text as well; a first request only for usage.
    textless = {"choices": [{}], "usage": SERVED["usage"]}
    assert check_completions(Target(base="http://f", model="m", http=_FakeFrontend([(200, textless, "")]), timeout=1.0))[0] == "fail"
    assert FirstRequest(registered=lambda http, base: True, model="m", decode_log=lambda: "", timeout=120.0, started=time.monotonic(),
                        deadline_s=300.0)(
        _FakeFrontend([(200, textless, "")]), "http://f")


def test_both_probes_send_an_unseeded_sampled_completion_and_count_it_as_a_request() -> None:
    """The request that crashed vLLM's CPU engine (an inductor compile, no C++ compiler) is a
    temperature > 0 one without a seed: a seed makes vLLM sample eagerly and would hide it."""
    from servestack.smoke.endpoints import AGGREGATED_CHECKS, DISAGGREGATED_CHECKS, Target, check_sampled

    for table in (AGGREGATED_CHECKS, DISAGGREGATED_CHECKS):
        assert dict(table)["sampled"] is check_sampled
    served = Target(base="http://f", model="m", http=_FakeFrontend([(200, SERVED, "")]), timeout=1.0)
    assert check_sampled(served)[0] == "pass" and served.metrics["sampled_usage"] == SERVED["usage"]
    sent = served.http.posted[0]
    assert sent["temperature"] > 0 and "seed" not in sent and sent["model"] == "m"
    crashed = Target(base="http://f", model="m", http=_FakeFrontend([(500, HTTP_500, "")]), timeout=1.0)
    status, detail = check_sampled(crashed)
    assert status == "fail" and "HTTP 500" in detail and "sampled_usage" not in crashed.metrics
    no_usage = Target(base="http://f", model="m", http=_FakeFrontend([(200, {"choices": [{"text": "ok"}]}, "")]), timeout=1.0)
    assert check_sampled(no_usage) == ("fail", "no usage in the response")
