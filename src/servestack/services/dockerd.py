"""dockerd with the containerd image store (OCI export with rewrite-timestamp needs it), and the one Docker client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from servestack.errors import ServestackError
from servestack.services.daemons import exclusive, log_tail, require, spawn_detached, wait_until
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import TimeoutExpired, run
from servestack.util.project import state_home

if TYPE_CHECKING:
    from docker import DockerClient

SNAPSHOTTER_DRIVER = "io.containerd.snapshotter.v1"
DOCKER_DAEMON_JSON = Path("/etc/docker/daemon.json")


def _docker_driver_status() -> dict[str, str] | None:
    """The daemon's DriverStatus, or None when no daemon answers."""
    docker = require("docker")
    try:
        proc = run([docker, "info", "--format", "{{json .DriverStatus}}"], check=False, timeout=20)
    except TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    try:
        pairs = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return {str(k): str(v) for k, v in (pairs or [])}


def _check_snapshotter(status: dict[str, str]) -> None:
    driver = status.get("driver-type", "")
    if driver != SNAPSHOTTER_DRIVER:
        raise ServestackError(
            f"the running Docker daemon does not use the containerd image store "
            f"(driver-type {driver or 'unknown'!r}, need {SNAPSHOTTER_DRIVER!r}); OCI export with "
            f"rewrite-timestamp needs it. Stop that dockerd, set "
            f'{{"features": {{"containerd-snapshotter": true}}}} in {DOCKER_DAEMON_JSON} and start it '
            f"again (or let servestack start it)"
        )


def _write_daemon_json() -> None:
    """Turn the containerd snapshotter on, keeping every other key an admin may have set."""
    try:
        config = json.loads(DOCKER_DAEMON_JSON.read_text()) if DOCKER_DAEMON_JSON.exists() else {}
    except ValueError as e:
        raise ServestackError(f"{DOCKER_DAEMON_JSON}: not valid JSON ({e}); fix or remove it") from e
    if not isinstance(config, dict):
        raise ServestackError(f"{DOCKER_DAEMON_JSON}: expected a JSON object")
    features = config.setdefault("features", {})
    if features.get("containerd-snapshotter") is True:
        return
    features["containerd-snapshotter"] = True
    atomic_write_text(DOCKER_DAEMON_JSON, json.dumps(config, indent=2, sort_keys=True) + "\n")


def ensure_dockerd(timeout: float = 60.0) -> None:
    """A Docker daemon answers and uses the containerd snapshotter (starting one if needed)."""
    status = _docker_driver_status()
    if status is not None:
        _check_snapshotter(status)
        return
    dockerd = require("dockerd")
    with exclusive("dockerd"):
        status = _docker_driver_status()
        if status is None:
            _write_daemon_json()
            log_path = state_home() / "dockerd.log"
            proc = spawn_detached([dockerd], log_path)

            def ready() -> bool:
                return _docker_driver_status() is not None

            wait_until(ready, what="dockerd", timeout=timeout, log_path=log_path, proc=proc, interval=0.2)
            status = _docker_driver_status()
            if status is None:
                raise ServestackError(f"dockerd stopped answering right after start\n{log_tail(log_path)}")
    _check_snapshotter(status)


def docker_client(timeout: int = 900) -> DockerClient:
    """The one Docker SDK client servestack uses, on a running dockerd (started if needed)."""
    import docker

    ensure_dockerd()
    return docker.from_env(timeout=timeout)


def ensure_image(client: DockerClient, reference: str, platform: str) -> None:
    """The image is local (pulled by digest from its registry when it is not)."""
    import docker.errors

    try:
        client.images.get(reference)
        return
    except docker.errors.ImageNotFound:
        pass
    from servestack.records.imageref import ImageRef
    from servestack.services.oci_registry import DEFAULT_REGISTRY, ensure_registry

    if ImageRef.parse(reference).registry == DEFAULT_REGISTRY:
        ensure_registry()
    console.detail("servestack.services", f"pulling {reference} ({platform})")
    repo, digest = reference.split("@", 1)
    try:
        # The low-level pull: ImageCollection.pull() ends with images.get(), which the containerd
        # image store answers "No such image" for a foreign-platform image it has just pulled.
        for event in client.api.pull(repo, tag=digest, platform=platform, stream=True, decode=True):
            if "error" in event:
                raise ServestackError(f"cannot pull {reference} for {platform}: {event['error']}")
    except docker.errors.APIError as e:
        raise ServestackError(f"cannot pull {reference} for {platform}: {e.explanation or e}") from None
