#!/usr/bin/env python3
"""Run a job's points inside the image (or on a node): start the server, run one client per point.

Standalone (standard library only); the runners bind-mount this directory at /opt/servestack-clients
and call it with the image's python:

    python /opt/servestack-clients/run_points.py --spec /results/<recipe>/.job.json --points 1,4,16

The spec (JSON) says:
  server:   {"argv": [...], "env": {...}, "health_url": "http://127.0.0.1:8000/health",
             "startup_timeout": 900}          (optional: no server for command jobs)
  point:    {"argv": [... "{point}" ... "{out}" ...], "env": {...}, "timeout": 3600}
            (a throughput point is <concurrency>[-r<repeat>]; its argv also gets {concurrency}
            and {num_prompts})
  out_dir:  where `<point>.json` files go (inside the container)

Each point's client writes to a temporary file name ({out}, {out_dir}/{out_name}); the file is
renamed to `<point>.json` only when the client exits 0 and wrote it, so a result file on disk is
always a finished point. Points whose file already exists are skipped (resume).

Timing: every server start-up and every client run appends one JSON line to
`<out_dir>/.timing.jsonl` ({"event": "server" | "point", "point", "started", "seconds", "ok"}), so
the pipeline can tell time spent inside the benchmark clients from its own overhead.

With `--orders DIR` the points are not given up front: the server stays up and runs each point
another process asks for in DIR (serve_orders), until asked to stop.

Exit codes: 0 all points done; 1 some point failed; 3 the server did not come up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import FrameType

_server: subprocess.Popen | None = None


def log(msg: str) -> None:
    print(f"[run_points {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stop_server(grace_s: float = 30.0) -> None:
    """The server's own process first, then its group. SIGTERM to the whole group reaches vLLM's
    engine core at the same moment as its API server, so the engine exits on its own signal
    instead of the API server's shutdown. Signalled alone, the API server shuts its engine down in
    order (with the --shutdown-timeout the stage gives it, stages.plan: "drain", not vLLM's default
    "abort", which kills the engine and logs EngineDeadError); the group is signalled only for what
    is still there after `grace_s`, which outlasts that timeout."""
    global _server
    if _server is None or _server.poll() is not None:
        return
    log(f"stopping server pid {_server.pid}")
    for send, wait in ((lambda: os.kill(_server.pid, signal.SIGTERM), grace_s),
                       (lambda: os.killpg(_server.pid, signal.SIGTERM), 10.0),
                       (lambda: os.killpg(_server.pid, signal.SIGKILL), 10.0)):
        try:
            send()
            _server.wait(timeout=wait)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the engine's children outlive a leader that exited first
        os.killpg(_server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _server = None


def on_signal(signum: int, _frame: FrameType | None) -> None:
    log(f"signal {signum}: stopping")
    stop_server()
    sys.exit(128 + signum)


def record(out_dir: str, **event: object) -> None:
    """Append one timing event (a single short write: a line is never torn)."""
    try:
        line = json.dumps(event, sort_keys=True) + "\n"
        fd = os.open(os.path.join(out_dir, ".timing.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as exc:  # timing is a measurement aid, never a reason to fail a point
        log(f"could not record timing: {exc}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_server(server: dict, logfile: str) -> bool:
    global _server
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (server.get("env") or {}).items()})
    log(f"starting server: {' '.join(server['argv'])}")
    out = open(logfile, "ab")
    _server = subprocess.Popen(server["argv"], env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + float(server.get("startup_timeout", 900))
    url = server.get("health_url", "http://127.0.0.1:8000/health")
    while time.monotonic() < deadline:
        if _server.poll() is not None:
            log(f"server exited with {_server.returncode} before becoming healthy (log: {logfile})")
            return False
        if healthy(url):
            log(f"server healthy at {url}")
            return True
        time.sleep(2)
    log(f"server not healthy after {server.get('startup_timeout', 900)} s (log: {logfile})")
    return False


def fill(argv: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for a in argv:
        for k, v in values.items():
            a = a.replace("{" + k + "}", v)
        out.append(a)
    return out


def run_point(spec: dict, point: str) -> bool:
    out_dir = spec["out_dir"]
    final = os.path.join(out_dir, f"{point}.json")
    if os.path.exists(final):
        log(f"point {point}: result on disk, skipped")
        return True
    tmp_name = f".{point}.json.partial"
    tmp = os.path.join(out_dir, tmp_name)
    if os.path.exists(tmp):
        os.unlink(tmp)
    pspec = spec["point"]
    values = {"point": point, "out": tmp, "out_dir": out_dir, "out_name": tmp_name}
    digits = "".join(ch for ch in point if ch.isdigit())
    values["index"] = str(int(digits)) if digits else "0"
    concurrency = point.partition("-r")[0]  # a throughput point: <concurrency>[-r<repeat>]
    if concurrency.isdigit() and pspec.get("prompts_per_point"):
        # throughput: num_prompts = concurrency x multiplier, at least min_prompts
        values["concurrency"] = concurrency
        values["num_prompts"] = str(max(int(pspec.get("min_prompts", 1)), int(concurrency) * int(pspec["prompts_per_point"])))
    argv = fill(pspec["argv"], values)
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (pspec.get("env") or {}).items()})
    log(f"point {point}: {' '.join(argv)}")
    started = time.time()
    t0 = time.monotonic()
    try:
        rc = subprocess.run(argv, env=env, timeout=float(pspec.get("timeout", 3600))).returncode
    except subprocess.TimeoutExpired:
        log(f"point {point}: timed out")
        rc = -1
    record(out_dir, event="point", point=point, started=round(started, 3),
           seconds=round(time.monotonic() - t0, 3), ok=rc == 0 and os.path.exists(tmp))
    if rc == 0 and os.path.exists(tmp):
        os.replace(tmp, final)
        log(f"point {point}: done in {time.monotonic() - t0:.1f} s -> {final}")
        return True
    log(f"point {point}: failed (exit {rc}, result {'present' if os.path.exists(tmp) else 'missing'})")
    return False


def serve_orders(spec: dict, orders: str, poll_s: float = 0.05) -> bool:
    """Interleaved measuring (servestack.stages.interleave): with the server up, run the points another
    process asks for, one at a time, in the order asked. `<orders>/<seq>.json` holds
    {"point": NAME} or {"stop": true}; `<seq>.done` answers it with {"ok": bool}. The asking side
    waits for each answer, so its A, B, B, A order is the order measured."""
    os.makedirs(orders, exist_ok=True)
    with open(os.path.join(orders, "serving"), "w") as f:
        f.write(str(os.getpid()))
    ok, seq = True, 0
    while True:
        order = os.path.join(orders, f"{seq}.json")
        if not os.path.exists(order):
            time.sleep(poll_s)
            continue
        with open(order, encoding="utf-8") as f:
            asked = json.load(f)
        if asked.get("stop"):
            answer = {"ok": ok, "stopped": True}
        else:
            answer = {"ok": run_point(spec, asked["point"]), "point": asked["point"]}
            ok = answer["ok"] and ok
        tmp = os.path.join(orders, f".{seq}.done")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(answer, f)
        os.replace(tmp, os.path.join(orders, f"{seq}.done"))
        if asked.get("stop"):
            return ok
        seq += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--points", default="", help="comma-separated point names")
    ap.add_argument("--orders", help="a directory: serve the points asked there, one by one, until told to stop")
    args = ap.parse_args(argv)
    with open(args.spec, encoding="utf-8") as f:
        spec = json.load(f)
    os.makedirs(spec["out_dir"], exist_ok=True)
    points = [p for p in args.points.split(",") if p]
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    todo = [p for p in points if not os.path.exists(os.path.join(spec["out_dir"], f"{p}.json"))]
    if not todo and not args.orders:
        log("every point has a result on disk")
        return 0
    try:
        if spec.get("server"):
            started, t0 = time.time(), time.monotonic()
            up = start_server(spec["server"], os.path.join(spec["out_dir"], "server.log"))
            record(spec["out_dir"], event="server", point=None, started=round(started, 3),
                   seconds=round(time.monotonic() - t0, 3), ok=up)
            if not up:
                return 3
        if args.orders:
            return 0 if serve_orders(spec, args.orders) else 1
        ok = True
        for p in points:
            ok = run_point(spec, p) and ok
        return 0 if ok else 1
    finally:
        stop_server()


if __name__ == "__main__":
    sys.exit(main())
