"""An A/A measured alongside while another job loads the machine half the time: is it "no regression"
at every point, run after run? (issue: regression verdicts that hold on a noisy machine)

    python benchmarks/aa_under_load.py [--runs 5] [--burners 1] [--period 20]

Each run is one interleaved session (interleave.measure) of the dev-cpu image against itself, agg at
concurrency 1 and 4, with the throughput gate's policy (threshold 25%, 3 to 6 rounds). Meanwhile
BURNERS busy processes run for PERIOD seconds, stop for PERIOD seconds, and so on: the load comes and
goes during the session, as another CI job's would. Prints, per run and point, the verdict, the
change's interval, the rounds and seconds, and the load average; then how many runs were "no
regression" at every point. Needs the dev-cpu image built (`nox -s build image`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

from servestack.stages import interleave
from servestack.stages.pipeline import load_pipeline
from servestack.util.project import Project

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = """
stack: dev-cpu
runner: {{kind: local, python: python3}}
model_paths: {{tiny-qwen35: /opt/servestack/models/servestack/tiny-qwen35}}
data_dir: {data}
server: {{port: 8000, startup_timeout: 10m}}
stages:
  throughput:
    recipes: [agg]
    time_limit: 20m
    concurrencies: [1, 4]
    input_len: 64
    output_len: 16
    prompts_per_concurrency: 4
    min_prompts: 8
    gate: {{regression_threshold: 0.25, min_rounds: 3, max_rounds: 6}}
"""


def _burn(stop: multiprocessing.Event) -> None:
    while not stop.is_set():
        for _ in range(200_000):
            pass


def load_half_the_time(burners: int, period: float, done: threading.Event) -> None:
    """BURNERS busy processes, PERIOD seconds on and PERIOD seconds off, until DONE."""
    while not done.is_set():
        stop = multiprocessing.Event()
        procs = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(burners)]
        for p in procs:
            p.start()
        done.wait(period)
        stop.set()
        for p in procs:
            p.join()
        done.wait(period)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def one_run(image: str, burners: int, period: float) -> tuple[bool, list[str]]:
    with tempfile.TemporaryDirectory(prefix="aa-under-load-") as tmp:
        root = Path(tmp)
        (root / "pipelines").mkdir()
        (root / "recipes").symlink_to(ROOT / "recipes")
        (root / "pipelines" / "reference.yaml").write_text(PIPELINE.format(data=ROOT / "data" / "gsm8k"))
        project = Project(root=root)
        policy = load_pipeline(project.pipelines / "reference.yaml", root).stages.throughput.gate.policy()
        arms = (interleave.Arm(name="a", image=image, pipeline="reference"),
                interleave.Arm(name="a2", image=image, pipeline="reference"))
        done = threading.Event()
        loader = threading.Thread(target=load_half_the_time, args=(burners, period, done), daemon=True)
        t0 = time.monotonic()
        loader.start()
        try:
            session = interleave.measure(project, arms, root / "session", policy=policy, echo=None)
        finally:
            done.set()
            loader.join()
        seconds = time.monotonic() - t0
        aa = interleave.compared(session, "dev-cpu", ("A", "A again"), root / "session", policy, arms=("a", "a2"))
        lines = [f"  c={ch.concurrency}: {ch.verdict}, change {_pct(ch.change)} [{_pct(ch.low)}, {_pct(ch.high)}] "
                 f"over {len(ch.a)} rounds" for ch in aa.gated()]
        decided = "; ".join(f"{d.arm} c={d.concurrency} {d.rounds} rounds {d.seconds:.0f} s" for d in session.decided)
        lines.append(f"  session {seconds:.0f} s, load average {os.getloadavg()[0]:.1f}; {decided}")
        return all(ch.verdict == "no regression" for ch in aa.gated()), lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=1)
    parser.add_argument("--period", type=float, default=20.0)
    args = parser.parse_args()
    image = json.loads((ROOT / "build" / "dev-cpu" / "image.json").read_text())["reference"]
    held = 0
    for n in range(1, args.runs + 1):
        ok, lines = one_run(image, args.burners, args.period)
        held += ok
        print(f"run {n}: {'no regression at every point' if ok else 'NOT no regression everywhere'}", flush=True)
        print("\n".join(lines), flush=True)
    print(f"{held} of {args.runs} runs: no regression at every point ({args.burners} burner(s), "
          f"{args.period:.0f} s on / {args.period:.0f} s off)")


if __name__ == "__main__":
    main()
