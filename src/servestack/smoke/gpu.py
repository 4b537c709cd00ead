"""Which NVIDIA GPUs this host's docker can give a container, and the container arguments that give them.

Two ways exist, and smoke takes whichever the daemon has:

- the NVIDIA runtime (the NVIDIA Container Toolkit registered with docker: `docker info` lists
  `nvidia` under Runtimes): docker's `--gpus device=N`, which the API carries as a DeviceRequest
  with capabilities [["gpu"]] and no driver, the daemon matching it to the toolkit's driver;
- CDI (the toolkit's `nvidia-ctk cdi generate` wrote a spec naming `nvidia.com/gpu` into a directory
  the daemon reads: `docker info` lists them as CDISpecDirs, docker 25 and newer): docker's
  `--device nvidia.com/gpu=N`, which the API carries as a DeviceRequest with driver "cdi" (moby's
  integration test `TestCreateWithCDIDevices` asserts exactly that request).

`detect_gpu_host` is the one place that reads the host (docker's info, the CDI specs, the driver's
/proc entries); `gpu_container_kwargs` is pure: (facts, role) -> docker SDK keyword arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TYPE_CHECKING

import yaml

from servestack.errors import ServestackError

if TYPE_CHECKING:
    from docker import DockerClient

CDI_KIND = "nvidia.com/gpu"
# Where the NVIDIA driver lists each GPU it bound (one directory per PCI address), on the host.
PROC_GPUS = Path("/proc/driver/nvidia/gpus")

Via = Literal["nvidia-runtime", "cdi"]
# Who a container is: the aggregated server of the made model, a disaggregated worker, Dynamo's
# frontend (no GPU), or the server of a real checkpoint (tensor parallel over every GPU).
GpuRole = Literal["server", "prefill", "decode", "frontend", "all"]


@dataclass(frozen=True, kw_only=True)
class GpuHost:
    """What this host's docker can give containers: GPU ids (`devices`, in the order the roles take
    them), by which mechanism, and how that was found out (or why there are none)."""

    devices: tuple[str, ...] = ()
    via: Via | None = None
    evidence: str

    @property
    def count(self) -> int:
        return len(self.devices)


def no_gpu(why: str) -> GpuHost:
    return GpuHost(evidence=why)


def detect_gpu_host(docker_info: Mapping[str, Any], *, proc_gpus: Path = PROC_GPUS) -> GpuHost:
    """The GPUs docker can hand out here: the NVIDIA runtime's first (what `docker run --gpus`
    uses), else CDI devices from the spec directories the daemon itself reports."""
    runtimes = docker_info.get("Runtimes") or {}
    if "nvidia" in runtimes:
        # docker info says nothing about the GPUs themselves; the driver lists what it bound.
        found = sorted(p.name for p in proc_gpus.iterdir()) if proc_gpus.is_dir() else []
        if found:
            return GpuHost(devices=tuple(str(i) for i in range(len(found))), via="nvidia-runtime",
                           evidence=f"docker has the nvidia runtime and the driver lists {len(found)} GPU(s) "
                                    f"in {proc_gpus} ({', '.join(found)})")
        runtime_note = f"docker has the nvidia runtime but {proc_gpus} lists no GPU"
    else:
        runtime_note = f"docker has no nvidia runtime (runtimes: {', '.join(sorted(runtimes)) or 'none'})"
    # Only the directories the daemon reads count: a spec elsewhere, or on a daemon without CDI
    # (docker < 25, or CDI switched off: an empty list), would name devices docker cannot inject.
    spec_dirs = [Path(d) for d in docker_info.get("CDISpecDirs") or []]
    if not spec_dirs:
        return no_gpu(f"{runtime_note}, and docker reads no CDI spec directory (CDI needs docker 25 or newer "
                      "with CDI enabled)")
    names = cdi_device_names(spec_dirs)
    if not names:
        return no_gpu(f"{runtime_note}, and no CDI spec in {', '.join(map(str, spec_dirs))} names {CDI_KIND} devices "
                      "(`nvidia-ctk cdi generate` writes one)")
    return GpuHost(devices=names, via="cdi",
                   evidence=f"{runtime_note}; CDI specs in {', '.join(map(str, spec_dirs))} name "
                            f"{', '.join(f'{CDI_KIND}={n}' for n in names)}")


def cdi_device_names(spec_dirs: Sequence[Path]) -> tuple[str, ...]:
    """The `nvidia.com/gpu` devices the CDI specs name, one per GPU: the index names
    (`nvidia-ctk`'s default strategy) in numeric order; without any, every name but `all`."""
    names: list[str] = []
    for directory in spec_dirs:
        for spec_file in sorted(directory.glob("*")) if directory.is_dir() else []:
            if spec_file.suffix not in (".json", ".yaml", ".yml"):
                continue
            spec = _read_spec(spec_file)
            if spec.get("kind") != CDI_KIND:
                continue
            names += [str(d.get("name")) for d in spec.get("devices") or [] if isinstance(d, dict) and d.get("name")]
    indices = sorted({n for n in names if re.fullmatch(r"\d+", n)}, key=int)
    return tuple(indices) if indices else tuple(dict.fromkeys(n for n in names if n != "all"))


def _read_spec(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ServestackError(f"{path}: not a readable CDI spec: {e}") from None
    return spec if isinstance(spec, dict) else {}


def role_devices(host: GpuHost, role: GpuRole) -> tuple[str, ...]:
    """The GPU a role gets: the server and the prefill worker the first, the decode worker the
    second where there is one (each engine a GPU of its own, as on the cluster) and else the first
    too (both engines share it, each with its share of memory); the frontend none."""
    if role == "frontend" or not host.devices:
        return ()
    if role == "all":
        return host.devices
    if role == "decode" and host.count > 1:
        return host.devices[1:2]
    return host.devices[:1]


def gpu_container_kwargs(host: GpuHost, role: GpuRole) -> dict[str, Any]:
    """docker SDK `containers.run` keyword arguments that give `role` its GPU on this host."""
    import docker.types

    ids = role_devices(host, role)
    if not ids:
        return {}
    if host.via == "cdi":
        request = docker.types.DeviceRequest(driver="cdi", device_ids=[f"{CDI_KIND}={i}" for i in ids])
    else:
        request = docker.types.DeviceRequest(device_ids=list(ids), capabilities=[["gpu"]])
    # Two engines on one GPU exchange KV blocks through CUDA IPC (UCX's cuda_ipc), which needs the
    # processes in one IPC namespace; docker's guidance for CUDA containers is the host's.
    return {"device_requests": [request], "ipc_mode": "host"}


def host_gpus(client: DockerClient) -> GpuHost:
    """This host's GPU facts, read through the docker client smoke already holds."""
    import docker.errors

    try:
        info = client.info()
    except docker.errors.APIError as e:
        return no_gpu(f"docker info failed: {e.explanation or e}")
    return detect_gpu_host(info)
