"""servestack smoke end to end: a tiny image with a fake /opt/venv, pushed to the loopback registry,
probed by digest; a tampered overlay is caught; a server that never gets ready fails at its deadline.

The base is Debian bookworm's essential set with python3, resolved and assembled as a stack's Debian
base is (a few seconds once its packages are in the cache), imported into docker.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import textwrap
import uuid
from pathlib import Path

import pytest

from servestack import services, smoke
from servestack.debian.tarball import tarball
from servestack.lock.debian_base import resolve_suite
from servestack.records.lockfile import DebianBase
from servestack.util.fsutil import atomic_write_json, canonical_json, sha256_file
from servestack.util.project import Project

pytestmark = pytest.mark.e2e

STACK = "fake"
EPOCH = 1_700_000_000


@pytest.fixture(scope="module")
def client():
    import docker

    services.ensure_dockerd()
    services.ensure_registry()
    return docker.from_env(timeout=600)


@pytest.fixture(scope="module")
def debian_base() -> DebianBase:
    """The fake lock's base: Debian bookworm with python3 and the CA certificates (no compiler), resolved
    from the archive as `lock` resolves it."""
    return resolve_suite("bookworm", ["python3", "ca-certificates"], ["linux/amd64"])


@pytest.fixture(scope="module")
def base_image(client, debian_base) -> str:
    """That base, assembled from its packages as `image` assembles it, imported into docker."""
    import docker.errors

    tar = tarball(debian_base, "linux/amd64")
    name = f"servestack-test/smoke-base:{tar.stem.rsplit('-', 1)[-1][:16]}"
    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        with open(tar, "rb") as f:
            subprocess.run(["docker", "import", "-", name], stdin=f, check=True, capture_output=True, timeout=600)
    return name


def _tar(entries: dict[str, bytes | str | None]) -> bytes:
    """A tar of files (bytes), symlinks (str starting with '->') and directories (None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for path, content in entries.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mtime = EPOCH
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                t.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content[2:]
                t.addfile(info)
            else:
                info.size, info.mode = len(content), 0o644
                t.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _site_entries(site: Path, prefix: str) -> dict[str, bytes | str | None]:
    entries: dict[str, bytes | str | None] = {}
    for path in sorted(site.rglob("*")):
        rel = f"{prefix}/{path.relative_to(site).as_posix()}"
        entries[rel] = None if path.is_dir() else path.read_bytes()
    return entries


def _commit_and_push(client, container, repo: str) -> str:
    image = container.commit(repository=repo, tag="t")
    del image
    lines = list(client.images.push(repo, tag="t", stream=True, decode=True))
    for line in lines:
        if "error" in line:
            raise AssertionError(line["error"])
        digest = (line.get("aux") or {}).get("Digest")
        match = re.search(r"digest: (sha256:[0-9a-f]{64})", line.get("status") or "")
        if digest or match:
            return f"{repo}@{digest or match.group(1)}"
    raise AssertionError(f"push reported no digest: {lines[-3:]}")


def _alter(client, reference: str, entries: dict[str, bytes | str | None], repo: str) -> str:
    container = client.containers.create(reference, ["true"])
    try:
        container.put_archive("/", _tar(entries))
        return _commit_and_push(client, container, repo)
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def fake_stack(client, base_image, debian_base, tmp_path_factory):
    """A project whose lock names two tiny wheels, and an image made from it, pushed by digest."""
    from fixtures.fake_site import wheel as tiny_wheel  # the same tiny wheels the fast tests use

    tmp = tmp_path_factory.mktemp("smoke-e2e")
    w1 = tiny_wheel(tmp, "alpha", "1.0.0", {"alpha/__init__.py": "X = 1\n", "alpha/core.py": "import aisimulate\n"})
    w2 = tiny_wheel(tmp, "beta_pkg", "2.1+ss.pr7", {"beta_pkg/__init__.py": "",
                                               "beta_pkg/server.py": "def serve():\n    return 'patched'\n"})
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
                    "--target", str(site), str(w1), str(w2)], check=True)
    for extra in site.glob("*.dist-info/direct_url.json"):
        extra.unlink()
    root = tmp / "project"
    (root / "pins").mkdir(parents=True)
    def wheel(name: str, version: str) -> dict:
        return {"name": name, "version": version, "filename": f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
                "sha256": "e" * 64, "size": 1, "index": "pypi"}

    lock = {
        "lock_version": 1,
        "stack": {"name": STACK, "file": f"pins/{STACK}.yaml", "sha256": "0" * 64},
        "python": "3.11",
        "resolved_at": None,
        "source_date_epoch": 0,
        "base": {"debian": debian_base.to_json()},
        "environment": {},
        "excluded": [{"name": "aisimulate", "reason": "stub sdist only"}],
        "packages": {"alpha": {"version": "1.0.0", "requirement": "alpha==1.0.0", "commit": None},
                     "beta-pkg": {"version": "2.1", "requirement": "beta-pkg==2.1", "commit": None}},
        "platforms": {"linux/amd64": [wheel("alpha", "1.0.0"), wheel("beta-pkg", "2.1")]},
        "pull_requests": [{"repo": "o/beta", "number": 7, "package": "beta-pkg", "status": "overlay", "title": "fix",
                           "merge_commit": None, "patch": {"path": "pins/patches/o__beta-7.diff", "sha256": "f" * 64,
                                                           "python_only": True, "native_files": []}}],
        "smoke_model": {"name": "none"},
    }
    atomic_write_json(root / "pins" / f"{STACK}.lock", lock)
    lock_sha = sha256_file(root / "pins" / f"{STACK}.lock")
    assert lock_sha == hashlib.sha256(canonical_json(lock).encode()).hexdigest()
    server_py = "beta_pkg/server.py"
    stack_json = {"lock": lock, "lock_sha256": lock_sha,
                  "overlays": {"beta-pkg": {"version": "2.1+ss.pr7", "files": {server_py: sha256_file(site / server_py)}}}}
    sp = "/opt/venv/lib/python3.11/site-packages"
    entries: dict[str, bytes | str | None] = {
        "/opt": None, "/opt/venv": None, "/opt/venv/bin": None, "/opt/venv/lib": None,
        "/opt/venv/lib/python3.11": None, sp: None,
        "/opt/venv/pyvenv.cfg": b"home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n",
        "/opt/venv/bin/python": "->/usr/bin/python3.11",
        "/opt/servestack": None,
        "/opt/servestack/stack.json": canonical_json(stack_json).encode(),
        **_site_entries(site, sp),
    }
    repo = f"127.0.0.1:5000/servestack-test/smoke-{uuid.uuid4().hex[:8]}"
    reference = _alter(client, base_image, entries, repo)
    yield {"project": Project(root=root), "reference": reference, "repo": repo, "site_path": sp, "server_py": server_py}
    import docker.errors

    for image in client.images.list(name=repo):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image.id, force=True)


def test_static_probe_by_digest_passes(fake_stack, client) -> None:
    project = fake_stack["project"]
    result = smoke.run_smoke(project, STACK, image=fake_stack["reference"], serve=False)
    by_name = {c.name: c for c in result.record.checks}
    assert result.record.ok, result.summary()
    assert by_name["probe"].status == "pass" and "/opt/venv/bin/python" in by_name["probe"].detail
    assert by_name["lock"].status == "pass"
    assert by_name[f"overlay:beta-pkg:{fake_stack['server_py']}"].status == "pass"
    assert by_name["pr:o/beta#7"].status == "pass"
    assert "alpha.core" in by_name["excluded:aisimulate"].detail
    assert by_name["ready"].status == "not_run" and "--no-serve" in by_name["ready"].detail
    written = json.loads((project.artifacts(STACK) / "smoke.json").read_text())
    assert written["image"] == fake_stack["reference"] and written["status"] == "pass"
    assert (project.artifacts(STACK) / "smoke-junit.xml").read_text().count("<testcase") == len(result.record.checks)
    assert result.exit_code == 0
    assert not client.containers.list(all=True, filters={"name": f"servestack-smoke-{STACK}-"})


def test_an_image_without_a_c_compiler_fails_tritons_runtime_build(fake_stack, client, tmp_path) -> None:
    """The fake stack's base is Debian's essential set with python3 (no compiler, no Python.h), as
    qwen35-gb200's was: with a CUDA torch and a Triton in it, the static probe fails naming both."""
    from fixtures.fake_site import site_with_torch, triton

    site = site_with_torch(tmp_path, "13.0", [triton(tmp_path)])
    # Its own repository: committing to the fake stack's would move the tag its reference resolves by.
    repo = f"{fake_stack['repo']}-triton"
    with_triton = _alter(client, fake_stack["reference"], _site_entries(site, fake_stack["site_path"]), repo)
    try:
        result = smoke.run_smoke(fake_stack["project"], STACK, image=with_triton, serve=False)
    finally:
        for image in client.images.list(name=repo):
            client.images.remove(image.id, force=True)
    failed = {c.name: c for c in result.record.failed}
    assert "runtime-build:triton" in failed, result.summary()
    detail = failed["runtime-build:triton"].detail
    assert "triton 3.7.1 compiles its CUDA driver module at the first kernel launch on a GPU" in detail
    assert "Failed to find C compiler" in detail and "needs a C compiler (Debian: gcc)" in detail


def test_altered_overlay_file_fails_naming_it(fake_stack) -> None:
    server_py = fake_stack["server_py"]
    tampered = _alter(
        services.docker_client(), fake_stack["reference"],
        {f"{fake_stack['site_path']}/{server_py}": b"def serve():\n    return 'tampered'\n"},
        fake_stack["repo"],
    )
    assert tampered != fake_stack["reference"]
    result = smoke.run_smoke(fake_stack["project"], STACK, image=tampered, serve=False)
    assert not result.record.ok and result.exit_code != 0
    failed = {c.name: c for c in result.record.failed}
    assert f"overlay:beta-pkg:{server_py}" in failed
    assert server_py in failed[f"overlay:beta-pkg:{server_py}"].detail
    assert server_py in result.summary()
    junit = (fake_stack["project"].artifacts(STACK) / "smoke-junit.xml").read_text()
    assert "<failure" in junit and server_py in junit


def test_server_that_never_gets_ready_fails_at_the_deadline_with_its_log(fake_stack, client) -> None:
    plan = smoke.ServePlan(
        command=["sh", "-c", "echo loading weights; echo still loading shard 3/7; sleep 600"], model="none"
    )
    result = smoke.run_smoke(fake_stack["project"], STACK, image=fake_stack["reference"], serve=True,
                             ready_timeout=6, serve_plan_override=plan)
    by_name = {c.name: c for c in result.record.checks if c.probe == "serving"}
    ready = by_name["ready"]
    assert ready.status == "fail"
    assert "not ready after 6 s" in ready.detail and "still loading shard 3/7" in ready.detail
    assert ready.time_s is not None and 6 <= ready.time_s < 30
    assert by_name["completions"].status == "not_run"
    assert not result.record.ok
    assert not client.containers.list(all=True, filters={"name": f"servestack-smoke-{STACK}-"})


def test_server_that_exits_fails_with_its_log(fake_stack) -> None:
    plan = smoke.ServePlan(command=["sh", "-c", "echo 'ValueError: no model here' >&2; exit 3"], model="none")
    result = smoke.run_smoke(fake_stack["project"], STACK, image=fake_stack["reference"], serve=True,
                             ready_timeout=60, serve_plan_override=plan)
    ready = {c.name: c for c in result.record.checks if c.probe == "serving"}["ready"]
    assert ready.status == "fail" and "exited with 3" in ready.detail and "no model here" in ready.detail
    assert ready.time_s < 30


def test_a_disaggregated_worker_that_exits_fails_naming_its_role_and_every_container_goes(fake_stack, client) -> None:
    """Three containers, the workers in the frontend's network namespace; the prefill worker dies."""
    env = {"DYN_FILE_KV": smoke.checklist.DISCOVERY_DIR}
    shape = smoke.DisaggPlan(roles=(
        smoke.checklist.Role(name="frontend", command=("sh", "-c", "sleep 600"), environment=env),
        smoke.checklist.Role(name="prefill", command=("sh", "-c", "echo 'RuntimeError: NIXL agent failed' >&2; exit 4"), environment=env),
        smoke.checklist.Role(name="decode", command=("sh", "-c", f"touch {smoke.checklist.DISCOVERY_DIR}/decode-was-here; sleep 600"),
                             environment=env),
    ), model="none")
    result = smoke.run_smoke(fake_stack["project"], STACK, image=fake_stack["reference"], serve=True, ready_timeout=60,
                             serve_plan_override=smoke.ServePlan(command=None, reason="aggregated not under test"), disagg_override=shape)
    disagg = {c.name: c for c in result.record.checks if c.probe == "disagg"}
    assert disagg["ready"].status == "fail"
    assert "the prefill exited with 4" in disagg["ready"].detail and "NIXL agent failed" in disagg["ready"].detail
    assert {c.status for n, c in disagg.items() if n != "ready"} == {"not_run"} and "kv-transfer" in disagg
    assert not client.containers.list(all=True, filters={"name": f"servestack-smoke-{STACK}-"})


def test_the_lease_holder_reads_a_started_worker_from_proc_and_never_asks_the_daemon(fake_stack, client) -> None:
    from servestack.smoke.discovery import container_alive
    from servestack.smoke.serving import _run_detached

    worker = _run_detached(client, fake_stack["reference"], ["sleep", "600"], name=f"servestack-smoke-{STACK}-lease")
    try:
        def no_daemon():
            raise AssertionError("the holder asked the daemon")

        worker.reload = no_daemon
        assert worker.attrs["State"]["Pid"] > 0 and container_alive(worker)
    finally:
        worker.remove(force=True)


# SIGINT-inherited-ignored is how a shell starts a background job (`cmd &` in a script), and so how
# pytest's children start when the suite itself runs in the background: Python then never raises
# KeyboardInterrupt. Before servestack handled SIGINT itself, the process ignored that SIGINT and kept
# its container up until the readiness deadline (the "hang" seen only in long, backgrounded e2e runs).
# SIGINT+SIGTERM is Ctrl-C under nox, which sends SIGTERM 0.5 s later (here at once): the second
# signal used to abort the container's removal.
@pytest.mark.parametrize(("sigs", "inherited"), [("SIGINT", "SIG_DFL"), ("SIGINT", "SIG_IGN"), ("SIGTERM", "SIG_DFL"),
                                                 ("SIGINT+SIGTERM", "SIG_DFL")],
                         ids=["SIGINT", "SIGINT-inherited-ignored", "SIGTERM", "SIGINT+SIGTERM"])
def test_interrupted_smoke_removes_its_container(fake_stack, client, sigs: str, inherited: str, tmp_path) -> None:
    import signal
    import time

    script = textwrap.dedent(f"""
        from pathlib import Path
        from servestack import smoke
        from servestack.util.project import Project
        plan = smoke.ServePlan(command=["sh", "-c", "sleep 600"], model="none")
        smoke.run_smoke(Project(root=Path({str(fake_stack['project'].root)!r})), {STACK!r}, image={fake_stack['reference']!r},
                        ready_timeout=300, serve_plan_override=plan)
    """)
    # Its output goes to a file: a pipe nobody reads until the end could fill up and block it.
    output = (tmp_path / "smoke.out").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=output, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, getattr(signal, inherited)))
    name_filter = {"name": f"servestack-smoke-{STACK}-serve-"}
    try:
        deadline = time.monotonic() + 120
        while not client.containers.list(filters=name_filter):
            assert proc.poll() is None, (tmp_path / "smoke.out").read_text(errors="replace")
            assert time.monotonic() < deadline, "the serving container never started"
            time.sleep(0.5)
        for sig in sigs.split("+"):
            proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        output.close()
    assert proc.returncode != 0
    assert not client.containers.list(all=True, filters=name_filter)
