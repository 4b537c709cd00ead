"""run_points.py: one client per point, results renamed into place only on success, resume."""

from __future__ import annotations

import json
import subprocess
import sys
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
