"""Measuring A and B alongside: the order of a session, and the order queue a server's container
answers (clients/run_points.py --orders), run for real as a process with a stand-in client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from servestack import interleave
from servestack.clients import CLIENTS_DIR


def test_rounds_alternate_abba_so_drift_within_a_round_falls_on_both_sides():
    assert [interleave.order(k) for k in range(4)] == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    assert interleave.schedule([1, 4], 0) == [("a", 1), ("b", 1), ("a", 4), ("b", 4)]
    assert interleave.schedule([1, 4], 1) == [("b", 1), ("a", 1), ("b", 4), ("a", 4)]
    # Over two rounds each side ran first once at every point.
    two = interleave.schedule([4], 0) + interleave.schedule([4], 1)
    assert [side for side, _ in two] == ["a", "b", "b", "a"]


def test_a_server_measures_the_points_asked_in_the_order_asked_until_told_to_stop(tmp_path: Path):
    out = tmp_path / "agg"
    out.mkdir()
    client = ("import json, sys, time; json.dump({'point': sys.argv[1], 'at': time.monotonic()}, "
              "open(sys.argv[2], 'w'))")
    spec = {"point": {"argv": [sys.executable, "-c", client, "{point}", "{out}"], "timeout": 30}, "out_dir": str(out)}
    (out / "job.json").write_text(json.dumps(spec))
    serving = subprocess.Popen([sys.executable, str(CLIENTS_DIR / "run_points.py"), "--spec", str(out / "job.json"),
                                "--orders", str(out / interleave.ORDERS)])
    try:
        orders = interleave.Orders(directory=out / interleave.ORDERS, still_running=lambda: serving.poll() is None)
        asked = ["4", "1-r1", "4-r1"]
        answers = [orders.ask({"point": p}, timeout_s=30) for p in asked]
        assert orders.serving() and [a["point"] for a in answers] == asked and all(a["ok"] for a in answers)
        at = {p: json.loads((out / f"{p}.json").read_text())["at"] for p in asked}
        assert at["4"] < at["1-r1"] < at["4-r1"]  # measured in the order asked
        assert orders.ask({"point": "4"}, timeout_s=30)["ok"]  # resumed: a point on disk is not measured again
        assert json.loads((out / "4.json").read_text())["at"] == at["4"]
        assert orders.ask({"stop": True}, timeout_s=30) == {"ok": True, "stopped": True}
        assert serving.wait(timeout=30) == 0
    finally:
        serving.kill()
