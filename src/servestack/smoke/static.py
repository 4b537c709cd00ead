"""The static probe, host side: run the probe/static package inside the image (read-only, no network) and read its checks."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, TYPE_CHECKING

from servestack.smoke.checklist import VENV_PYTHON
from servestack.smoke.containers import _container_name, _log_tail, _remove, host_docker_platform
from servestack.smoke.summary import FAIL, PASS, Check

if TYPE_CHECKING:
    from docker import DockerClient

# A directory run as `python DIR CONFIG.json` (its __main__): copied whole, without bytecode of the host's Python.
PROBE_PACKAGE = Path(__file__).resolve().parents[1] / "probe" / "static"
PROBE_MOUNT = "/opt/servestack-probe"
DEFAULT_STATIC_TIMEOUT = 1800.0  # an arm64 vLLM import under qemu-user takes minutes


# A home directory that does not exist in the container, as on a node that does not mount it.
NODE_HOME = "/home/servestack-node-user"

# Neoverse V2, the Grace CPU of GB200 nodes.
GRACE_MIDR = "0x00000000410fd4f0"


def _emulated_arm64_cpus(tmp: Path) -> str:
    """A sysfs CPU directory for an arm64 container under qemu-user.

    qemu-user has no arm64 sysfs; torch's oneDNN (xbyak_aarch64) reads each CPU's MIDR_EL1 from
    sysfs at import and crashes without it. The probe only imports and inspects, so describing
    the target's CPU (Grace) is enough; nothing runs on these numbers.
    """
    cpus = tmp / "cpu"
    count = os.cpu_count() or 1
    for name in ("online", "possible", "present"):
        (cpus / name).parent.mkdir(parents=True, exist_ok=True)
        (cpus / name).write_text(f"0-{count - 1}\n")
    for index in range(count):
        ident = cpus / f"cpu{index}" / "regs" / "identification"
        ident.mkdir(parents=True)
        (ident / "midr_el1").write_text(GRACE_MIDR + "\n")
        (ident / "revidr_el1").write_text("0x0000000000000000\n")
    return str(cpus)


def run_static_probe(
    client: DockerClient, reference: str, platform: str, config: dict[str, Any], *, stack: str = "stack", timeout: float = DEFAULT_STATIC_TIMEOUT
) -> list[Check]:
    """Run the probe/static package inside the image (read-only mount, no network) and return its checks."""
    import docker.errors
    import requests

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="servestack-probe-") as tmp:
        shutil.copytree(PROBE_PACKAGE, Path(tmp) / PROBE_PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (Path(tmp) / "config.json").write_text(json.dumps({**config, "section_timeout": timeout}, indent=1))
        os.chmod(tmp, 0o755)
        volumes = {tmp: {"bind": PROBE_MOUNT, "mode": "ro"}}
        if platform == "linux/arm64" and host_docker_platform() != platform:
            volumes[_emulated_arm64_cpus(Path(tmp))] = {"bind": "/sys/devices/system/cpu", "mode": "ro"}
        container = None
        # A GPU stack's probe runs as srt-slurm starts the image under enroot: the root read-only, the
        # home directory absent (--no-container-mount-home), a tmpfs on /tmp.
        node_like = {"HOME": NODE_HOME} if config.get("gpu_node") else {}
        runtime: dict[str, Any] = ({"read_only": True, "tmpfs": {"/tmp": "rw,exec,nosuid,nodev,mode=1777"}}
                                   if config.get("gpu_node") else {})
        try:
            container = client.containers.run(
                reference,
                [VENV_PYTHON, f"{PROBE_MOUNT}/{PROBE_PACKAGE.name}", f"{PROBE_MOUNT}/config.json"],
                name=_container_name(stack, "static"),
                detach=True,
                platform=platform,
                network_disabled=True,
                volumes=volumes,
                environment={"PYTHONDONTWRITEBYTECODE": "1", **node_like},
                **runtime,
            )
            try:
                status = container.wait(timeout=2 * timeout + 300)  # two isolated sections + the scans
            except requests.exceptions.RequestException:
                return [Check(probe="static", name="probe", status=FAIL, detail=f"the static probe did not finish within {timeout:.0f} s\n{_log_tail(container)}",
                              time_s=time.monotonic() - start)]
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            code = status.get("StatusCode")
            try:
                report = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                err = container.logs(stdout=False, stderr=True, tail=30).decode(errors="replace")
                return [Check(probe="static", name="probe", status=FAIL, detail=f"the static probe exited with {code} and printed no report:\n{err}",
                              time_s=time.monotonic() - start)]
        except docker.errors.APIError as e:
            return [Check(probe="static", name="probe", status=FAIL, detail=f"cannot run the static probe in {reference}: {e.explanation or e}",
                          time_s=time.monotonic() - start)]
        finally:
            if container is not None:
                _remove(container)
    elapsed = time.monotonic() - start
    checks = [
        Check(probe="static", name="probe", status=PASS,
              detail=f"ran in {elapsed:.1f} s with {report.get('executable')} (Python {report.get('python')}, {report.get('machine')})",
              time_s=elapsed)
    ]
    checks += [Check(probe="static", name=c["name"], status=c["status"], detail=c.get("detail", "")) for c in report.get("checks", [])]
    return checks
