"""enroot's nvidia hook, run for real against the image's environment: does a GPU node inject the GPU?

On a GPU node pyxis starts the container through enroot, whose hook 98-nvidia.sh reads the
container's NVIDIA_* variables and asks nvidia-container-cli to inject the driver. It exits
quietly when NVIDIA_VISIBLE_DEVICES is unset or `void`, and asks only for `utility` (no libcuda)
when NVIDIA_DRIVER_CAPABILITIES is unset. So this runs the vendored enroot's own hook, with the
environment the image's config carries, and a recording nvidia-container-cli (and enroot-mount)
on PATH: what it records is exactly what the node would be asked to inject.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tarfile
import tempfile
from pathlib import Path

from servestack.cluster.vendored import vendor_archive
from servestack.errors import ClusterToolsMissing
from servestack.resources import script
from servestack.smoke.summary import FAIL, NOT_RUN, PASS, Check

HOOK = "conf/hooks/98-nvidia.sh"
LIBRARY = "src/common.sh"

RECORDER = script("record-nvidia-container-cli.sh")
MOUNT_RECORDER = script("record-enroot-mount.sh")


def _extract(archive: Path, into: Path) -> tuple[Path, Path]:
    with tarfile.open(archive) as tar:
        members = {m.name.split("/", 1)[-1]: m for m in tar.getmembers() if m.isfile()}
        for wanted in (HOOK, LIBRARY):
            if wanted not in members:
                raise ClusterToolsMissing(f"{archive} holds no {wanted}")
            (into / wanted).parent.mkdir(parents=True, exist_ok=True)
            (into / wanted).write_bytes(tar.extractfile(members[wanted]).read())  # type: ignore[union-attr]
    return into / HOOK, into / LIBRARY


def run_hook(image_env: list[str], archive: Path) -> tuple[int, list[str] | None, str]:
    """(exit code, the arguments nvidia-container-cli was called with or None, stderr) of the real hook."""
    with tempfile.TemporaryDirectory(prefix="servestack-nvidia-hook-") as tmp:
        work = Path(tmp)
        hook, library = _extract(archive, work / "enroot")
        bin_dir = work / "bin"
        bin_dir.mkdir()
        for name, text in (("nvidia-container-cli", RECORDER), ("enroot-mount", MOUNT_RECORDER)):
            (bin_dir / name).write_text(text)
            os.chmod(bin_dir / name, 0o755)
        environ = work / "environ"
        environ.write_text("".join(f"{line}\n" for line in image_env))
        (work / "rootfs").mkdir()
        record = work / "record"
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ENROOT_ENVIRON": str(environ), "ENROOT_ROOTFS": str(work / "rootfs"),
               "ENROOT_LIBRARY_PATH": str(library.parent), "SERVESTACK_RECORD": str(record),
               "SERVESTACK_MOUNTS": str(work / "mounts")}
        proc = subprocess.run(["bash", str(hook)], env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        called = record.read_text().splitlines() if record.exists() else None
        called = [a.replace(str(work / "rootfs"), "$ENROOT_ROOTFS") for a in called] if called is not None else None
        return proc.returncode, called, proc.stderr


def check_nvidia_hook(image_env: list[str], gpu_node: dict, archive: Path | None = None) -> Check:
    try:
        archive = archive or vendor_archive("enroot")
    except ClusterToolsMissing as e:
        # enroot's hook is vendored source, not part of a clone: without it nothing can be said either way.
        return Check(probe="static", name="gpu-node:nvidia-hook", status=NOT_RUN,
                     detail=f"enroot's nvidia hook is not on this machine: {e}")
    try:
        code, called, stderr = run_hook(image_env, archive)
    except (ClusterToolsMissing, OSError, subprocess.SubprocessError) as e:
        return Check(probe="static", name="gpu-node:nvidia-hook", status=FAIL, detail=f"cannot run enroot's nvidia hook: {e}")
    nvidia = sorted(v for v in image_env if v.startswith("NVIDIA_"))
    if code != 0:
        return Check(probe="static", name="gpu-node:nvidia-hook", status=FAIL,
                     detail=f"enroot's {HOOK} exited with {code}: {stderr.strip()[-500:]}")
    if called is None:
        return Check(probe="static", name="gpu-node:nvidia-hook", status=FAIL,
                     detail=f"enroot's {HOOK} injected nothing (NVIDIA_VISIBLE_DEVICES unset or void): the container would "
                     f"see no GPU. The image's NVIDIA_* environment: {nvidia or 'none'}")
    wanted = [f"--{c}" for c in gpu_node.get("capabilities", [])]
    if gpu_node.get("require_cuda"):
        wanted.append(f"--require=cuda>={gpu_node['require_cuda']}")
    missing = [w for w in wanted if w not in called]
    devices = [a for a in called if a.startswith("--device=")]
    if "configure" not in called or not devices:
        missing.append("configure --device=<devices>")
    shown = shlex.join(["nvidia-container-cli", *called])
    if missing:
        return Check(probe="static", name="gpu-node:nvidia-hook", status=FAIL,
                     detail=f"enroot's nvidia hook asks `{shown}`, without {', '.join(missing)}; the image's NVIDIA_* environment: "
                     f"{nvidia or 'none'}")
    return Check(probe="static", name="gpu-node:nvidia-hook", status=PASS, detail=f"enroot's nvidia hook asks `{shown}`")
