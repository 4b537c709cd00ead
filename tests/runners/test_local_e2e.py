"""The local runner against the real docker engine, with a minimal image made from this host's dash."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from fixtures.runner_jobs import dash_job
from servestack.runners.driver import run_job
from servestack.runners.interface import JobState
from servestack.runners.local import LocalRunner


def _libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    paths = [binary]
    for line in out.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("/"):
                paths.append(p)
    return paths


@pytest.fixture(scope="module")
def tiny_image():
    from servestack import services

    services.ensure_dockerd()
    import docker

    files = {p for b in ("/bin/dash", "/bin/sleep", "/bin/mv") for p in _libs(str(Path(b).resolve()))}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        names = sorted({n for f in files for n in (f, os.path.realpath(f))})
        for name in names:  # every spelling as a real file: the host's /bin, /lib are symlinks
            tar.add(os.path.realpath(name), arcname=name.lstrip("/"))
    client = docker.from_env()
    proc = subprocess.run(["docker", "import", "-", "servestack-test/dash:local"], input=buf.getvalue(),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    image = client.images.get("servestack-test/dash:local")
    yield image.id
    client.images.remove(image.id, force=True)


@pytest.mark.e2e
def test_local_runner_runs_the_image_and_collects_points(tmp_path, tiny_image):
    from dataclasses import replace

    s = replace(dash_job(tmp_path, ["1", "4"], 0), image=tiny_image)
    out = run_job(LocalRunner(poll_seconds=0.2), s)
    assert out.complete and out.final_state == "COMPLETED", out.to_dict()
    assert json.loads((tmp_path / "agg" / "4.json").read_text()) == {"point": "4"}


@pytest.mark.e2e
def test_local_runner_cancel(tmp_path, tiny_image):
    from dataclasses import replace

    runner = LocalRunner(poll_seconds=0.2)
    s = replace(dash_job(tmp_path, ["1", "2"], 30), image=tiny_image)
    h = runner.submit(s)
    time.sleep(1)
    assert runner.state(h) is JobState.RUNNING
    runner.cancel(h)
    assert runner.wait(h, timeout=60) is JobState.CANCELLED
    runner.collect(h)
    assert not (tmp_path / "agg" / "1.json").exists()
