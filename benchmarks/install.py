"""The tree-making path alone, measured: every wheel of a stack's last build installed into fresh trees
(trees.install_all, bytecode included) from an empty cache that shares only the downloaded wheels.

    python benchmarks/install.py [--stack dev-cpu] [--project .] [--runs 3]

Prints one line per run: wall seconds, this process's CPU seconds (installing, hashing, serving the
compilers) and its children's (the compiling interpreters), and the load average before it. The cold
image build spends most of its main-process CPU here; this runs it without the layer writing and the
push around it, so a change to it can be measured in a minute rather than a full cold build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from servestack import image
from servestack import inputs as build
from servestack.image.trees import children_cpu_seconds, install_all
from servestack.lock import load_lock
from servestack.util.project import Project, cache_home

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="dev-cpu")
    parser.add_argument("--project", type=Path, default=HERE.parent, help="whose build/<stack>/build.json to install")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    project = Project(root=args.project.resolve())
    record, locked = build.load_build(project, args.stack), load_lock(project, args.stack)
    wheels = [(Path(i.path), i.sha256) for i in record.inputs] + [(Path(o.path), o.wheel.sha256) for o in record.overlays]
    version = image.interpreter_version(locked, record.platform)
    shared = cache_home()
    rows = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="servestack-install-bench-", dir=shared.parent) as tmp:
            cache = Path(tmp)
            (cache / "blobs").symlink_to(shared / "blobs")  # the wheels: build.json's paths are there already
            os.environ["SERVESTACK_CACHE"] = str(cache)
            load = os.getloadavg()[0]
            started, cpu, children = time.monotonic(), time.process_time(), children_cpu_seconds()
            trees = install_all(wheels, locked.python, version)
            row = (time.monotonic() - started, time.process_time() - cpu, children_cpu_seconds() - children)
            rows.append(row)
            # What was made, in one hash: every tree's entries (paths, modes, sizes, content hashes, pycs'
            # included), so a change that makes other trees shows here.
            made = hashlib.sha256(json.dumps([[e.identity() for e in t.entries] for t in trees]).encode()).hexdigest()
            print(f"run {run}: {row[0]:.1f} s wall, {row[1]:.1f} CPU-s self, {row[2]:.1f} CPU-s compilers, "
                  f"{sum(len(t.entries) for t in trees)} files (sha256 {made[:12]}), load {load:.2f}", flush=True)
            shutil.rmtree(cache / "installed", ignore_errors=True)
    wall, own, compilers = (statistics.median(column) for column in zip(*rows, strict=True))
    print(f"median: {wall:.1f} s wall, {own:.1f} CPU-s self, {compilers:.1f} CPU-s compilers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
