"""End-to-end: the embedded services start on demand and do real work on this machine.

Needs root and the packages from .ci/bootstrap. Run: python -m pytest tests/services/test_services_e2e.py -m e2e
"""

from __future__ import annotations

import json
import os
import tarfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from servestack import services
from servestack.util.proc import run

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="starts system daemons: needs root"),
]

WARM_LIMIT_S = 1.0


def _timed(fn, *args):
    t0 = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - t0


def test_dockerd_uses_containerd_snapshotter() -> None:
    services.ensure_dockerd()
    out = run(["docker", "info", "--format", "{{json .DriverStatus}}"]).stdout
    assert ["driver-type", services.dockerd.SNAPSHOTTER_DRIVER] in json.loads(out.strip().splitlines()[-1])
    assert "buildx" in run(["docker", "buildx", "version"]).stdout


def _tiny_oci_archive(tmp_path: Path) -> Path:
    """A one-file image from scratch, exported as an OCI archive (nothing pulled)."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("servestack\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /hello.txt\n")
    out = tmp_path / "tiny.tar"
    run(
        [
            "docker",
            "buildx",
            "build",
            "--provenance=false",
            "--output",
            f"type=oci,dest={out},rewrite-timestamp=true",
            str(ctx),
        ],
        env={"SOURCE_DATE_EPOCH": "0"},
        timeout=300,
    )
    return out


def _archive_manifest_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    (manifest,) = index["manifests"]
    return manifest["digest"]


def test_registry_push_and_read_back_by_digest(tmp_path: Path) -> None:
    services.ensure_dockerd()
    address = services.ensure_registry()
    assert address == services.DEFAULT_REGISTRY
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(f"http://{address}/v2/", timeout=5) as resp:
        assert resp.status == 200

    archive = _tiny_oci_archive(tmp_path)
    digest = _archive_manifest_digest(archive)
    repo = f"{address}/servestack-test/tiny-{uuid.uuid4().hex[:8]}"
    run(
        [
            "skopeo",
            "copy",
            "--preserve-digests",
            "--dest-tls-verify=false",
            f"oci-archive:{archive}",
            f"docker://{repo}:latest",
        ],
        timeout=120,
    )

    inspected = json.loads(
        run(["skopeo", "inspect", "--tls-verify=false", f"docker://{repo}@{digest}"], timeout=60).stdout
    )
    assert inspected["Digest"] == digest

    back = tmp_path / "back"
    run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{repo}@{digest}", f"oci:{back}"], timeout=120)
    layers = [d for d in (back / "blobs" / "sha256").iterdir()]
    assert layers, "nothing came back from the registry"
    found = False
    for blob in layers:
        try:
            with tarfile.open(blob) as tar:
                member = tar.extractfile("hello.txt")
                if member is not None and member.read() == b"servestack\n":
                    found = True
        except (tarfile.TarError, KeyError):
            continue
    assert found, "the layer read back by digest does not hold hello.txt"


def _job_state(env: dict[str, str], job: str) -> str:
    out = run(["scontrol", "show", "job", job], env=env, check=False).stdout
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return ""


def _wait_state(env: dict[str, str], job: str, wanted: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = _job_state(env, job)
        if state in wanted:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job} is {state!r}, expected one of {sorted(wanted)}")


def test_slurm_runs_and_cancels_jobs(tmp_path: Path) -> None:
    env = services.ensure_slurm()
    assert Path(env["SLURM_CONF"]).is_file()
    out = tmp_path / "job.out"
    job = (
        run(["sbatch", "--parsable", "-o", str(out), "--wrap", "echo ran-as-$(id -un)"], env=env)
        .stdout.strip()
        .split(";")[0]
    )
    assert _wait_state(env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}) == "COMPLETED"
    assert out.read_text().strip() == "ran-as-root"

    long_job = (
        run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 600"], env=env).stdout.strip().split(";")[0]
    )
    _wait_state(env, long_job, {"RUNNING", "PENDING"})
    run(["scancel", long_job], env=env)
    assert _wait_state(env, long_job, {"CANCELLED"}) == "CANCELLED"


def test_slurm_job_steps_start_as_srtctl_starts_them(tmp_path: Path) -> None:
    """srtctl starts each process of a job (etcd/NATS, frontend, each worker) as its own
    `srun --overlap` step, and between them looks node addresses up with short steps that do not
    overlap (srt-slurm's get_node_ip.sh). Every one of them must start on the one node: a
    slurm.conf that counted memory per step refused some ("Memory required by task is not
    available") and the srtctl job failed."""
    env = services.ensure_slurm()
    out = tmp_path / "steps.out"
    script = tmp_path / "steps.sh"
    lines = ["#!/bin/bash"]
    for name in ("infra", "frontend", "prefill", "decode"):
        lines += [f"srun --overlap -n1 bash -c 'echo {name}-ran; sleep 6' &",
                  f"srun --quiet -N1 -n1 bash -c 'echo lookup-after-{name}-ran'"]
    script.write_text("\n".join([*lines, "wait", ""]))
    job = run(["sbatch", "--parsable", "--exclusive", "-n2", "-o", str(out), str(script)],
              env=env).stdout.strip().split(";")[0]
    assert _wait_state(env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}) == "COMPLETED"
    text = out.read_text()
    ran = {line for line in text.split() if line.endswith("-ran")}
    assert len(ran) == 8 and "not available" not in text, text


def test_binfmt_aarch64_registered() -> None:
    services.ensure_binfmt_aarch64()
    entry = (services.binfmt.BINFMT_DIR / "qemu-aarch64").read_text().splitlines()
    assert entry[0] == "enabled"
    flags = next(line for line in entry if line.startswith("flags:"))
    assert "F" in flags.split(":", 1)[1], "qemu-aarch64 lacks the fix-binary flag; containers cannot use it"


def test_binfmt_replaces_an_entry_an_older_qemu_registered() -> None:
    """Debian 12's qemu-user-static registered the same interpreter path with flags PF; with F the kernel
    keeps the binary it opened then, so an upgraded package alone leaves qemu 7.2 running."""
    services.ensure_binfmt_aarch64()
    line, _, _ = services.binfmt._wanted()
    entry = services.binfmt.BINFMT_DIR / "qemu-aarch64"
    entry.write_text("-1")
    (services.binfmt.BINFMT_DIR / "register").write_text(line.rsplit(":", 1)[0] + ":PF")
    assert services.binfmt._registered()["flags"] == "PF"
    services.ensure_binfmt_aarch64()
    assert set(services.binfmt._registered()["flags"]) == set("OPF")


@pytest.mark.parametrize(
    "ensure",
    [services.ensure_dockerd, services.ensure_registry, services.ensure_slurm, services.ensure_binfmt_aarch64],
    ids=lambda f: f.__name__,
)
def test_ensure_twice_is_idempotent_and_fast(ensure) -> None:
    first, _ = _timed(ensure)
    second, elapsed = _timed(ensure)
    assert second == first
    assert elapsed < WARM_LIMIT_S, f"{ensure.__name__} took {elapsed:.2f} s with the service already up"


def test_ensure_slurm_keeps_running_daemons() -> None:
    env = services.ensure_slurm()
    pidfile = Path(env["SLURM_CONF"]).parent / "slurmctld.pid"
    before = pidfile.read_text()
    services.ensure_slurm()
    assert pidfile.read_text() == before, "ensure_slurm restarted a healthy slurmctld"


def test_daemons_do_not_keep_the_starting_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon outlives the checkout that started it; it must not hold (or hand its jobs) that
    directory: a removed one made slurmstepd print "Unable to get current working directory" into
    every job's output."""
    started_in = tmp_path / "checkout"
    started_in.mkdir()
    monkeypatch.chdir(started_in)
    daemon = services.daemons.spawn_detached(["sleep", "30"], tmp_path / "sleep.log")
    try:
        assert os.readlink(f"/proc/{daemon.pid}/cwd") == "/"
    finally:
        daemon.kill()
        daemon.wait(timeout=10)
