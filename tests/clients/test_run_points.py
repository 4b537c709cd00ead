"""run_points.py: one client per point, results renamed into place only on success, resume."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from servestack.clients import CLIENTS_DIR

WRITER = ("import sys, json, pathlib; p = sys.argv[1]; out = sys.argv[2];"
          "sys.exit(3) if p == 'bad' else pathlib.Path(out).write_text(json.dumps({'point': p, 'n': sys.argv[3]}))")


def _spec(tmp_path: Path, server=None) -> Path:
    spec = {"server": server, "out_dir": str(tmp_path / "out"),
            "point": {"argv": [sys.executable, "-c", WRITER, "{point}", "{out}", "{num_prompts}"],
                      "prompts_per_point": 3, "min_prompts": 5}}
    f = tmp_path / "job.json"
    f.write_text(json.dumps(spec))
    return f


def _run(spec: Path, points: str) -> int:
    return subprocess.run([sys.executable, str(CLIENTS_DIR / "run_points.py"), "--spec", str(spec),
                           "--points", points], capture_output=True, text=True).returncode


def test_points_are_written_and_resumed(tmp_path):
    spec = _spec(tmp_path)
    assert _run(spec, "1,4") == 0
    out = tmp_path / "out"
    assert json.loads((out / "1.json").read_text()) == {"point": "1", "n": "5"}  # min_prompts
    assert json.loads((out / "4.json").read_text())["n"] == "12"  # 4 x 3
    (out / "1.json").write_text('{"kept": true}')
    assert _run(spec, "1,4") == 0
    assert json.loads((out / "1.json").read_text()) == {"kept": True}  # not redone


def test_a_failed_point_leaves_no_result_and_fails_the_job(tmp_path):
    spec = _spec(tmp_path)
    assert _run(spec, "bad,2") == 1
    out = tmp_path / "out"
    assert not (out / "bad.json").exists() and (out / "2.json").exists()


def test_a_server_that_dies_fails_fast(tmp_path):
    spec = _spec(tmp_path, server={"argv": [sys.executable, "-c", "raise SystemExit(1)"],
                                   "health_url": "http://127.0.0.1:9/health", "startup_timeout": 30})
    assert _run(spec, "1") == 3


# A server shaped like vLLM's: an API server (the group's leader) and its engine (a child in the
# same group). The engine records which signal stopped it: SIGTERM from outside, or the API
# server's own shutdown (SIGUSR1 here, then its exit), which is the order that logs no error.
SERVER = """
import os, signal, subprocess, sys, time
log = sys.argv[1]
engine = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
log = sys.argv[1]
def stopped(why):
    open(log, "a").write("engine: " + why + "\\\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: stopped("SIGTERM from outside: the API server would see a dead engine"))
signal.signal(signal.SIGUSR1, lambda *_: stopped("asked by the API server"))
time.sleep(60)
''', log])
def shutdown(*_):
    time.sleep(0.5)  # draining its requests first, as a real one does
    engine.send_signal(signal.SIGUSR1)
    engine.wait()
    open(log, "a").write("api server: shut down in order\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, shutdown)
time.sleep(60)
"""


def test_a_server_is_stopped_through_its_api_server_so_its_engine_is_shut_down_in_order(tmp_path):
    """SIGTERM to the whole group reached vLLM's engine core beside its API server, and every normal
    stop logged EngineDeadError; signalled alone, the API server stops its engine itself."""
    sys.path.insert(0, str(CLIENTS_DIR))
    try:
        import run_points
    finally:
        sys.path.pop(0)
    log = tmp_path / "log"
    run_points._server = subprocess.Popen([sys.executable, "-c", SERVER, str(log)], start_new_session=True)
    time.sleep(1.0)  # both processes have their handlers
    run_points.stop_server(grace_s=10)
    assert log.read_text().splitlines() == ["engine: asked by the API server", "api server: shut down in order"]
