"""Local runner: the image, by digest, in a container on this host's docker engine (docker SDK).

The clients directory and the data are bind-mounted read-only, the job's out_dir read-write; the
server is started inside the container by the job's command (clients/run_points.py).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servestack.errors import ServestackError
from servestack.runners.interface import JobHandle, JobSpec, JobState, PollingWait
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_text

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

LABEL = "servestack.job"


class LocalRunner(PollingWait):
    name = "local"

    def __init__(self, client: DockerClient | None = None, poll_seconds: float = 2.0, shm_size: str = "2g"):
        self._client = client
        self.poll_seconds = poll_seconds
        self.shm_size = shm_size
        self._deadline: dict[str, float] = {}

    @property
    def client(self) -> DockerClient:
        if self._client is None:
            from servestack import services

            self._client = services.docker_client(timeout=600)
        return self._client

    def submit(self, job: JobSpec) -> JobHandle:
        if job.image is None:
            raise ServestackError(f"{job.name}: the local runner runs images; this job has none "
                                  "(command jobs run through the slurm runner)")
        job.out_dir.mkdir(parents=True, exist_ok=True)
        job.jobs_dir.mkdir(parents=True, exist_ok=True)
        volumes = {str(m.host): {"bind": m.container, "mode": "ro" if m.read_only else "rw"} for m in job.mounts}
        kwargs: dict[str, Any] = {}
        if job.gpus:
            import docker.types

            kwargs["device_requests"] = [docker.types.DeviceRequest(count=job.gpus, capabilities=[["gpu"]])]
        container = self.client.containers.run(
            job.image, job.argv(), detach=True, volumes=volumes, environment=dict(job.env),
            labels={LABEL: job.name}, shm_size=self.shm_size, **kwargs,
        )
        # The SDK types a Model's id as optional (an unsaved model); a container the daemon started has one.
        assert container.id is not None
        self._deadline[container.id] = time.monotonic() + job.time_limit_s
        console.detail("servestack.runners.local", f"started container {container.short_id} ({job.image}) for {job.name}")
        return JobHandle(runner=self.name, job_id=container.id, spec=job, output_dir=job.out_dir)

    def _container(self, handle: JobHandle) -> Container | None:
        import docker.errors

        try:
            return self.client.containers.get(handle.job_id)
        except docker.errors.NotFound:
            return None

    def state(self, handle: JobHandle) -> JobState:
        c = self._container(handle)
        if c is None:
            return JobState.FAILED
        status = c.status
        if status in ("created",):
            return JobState.PENDING
        if status in ("running", "restarting", "paused"):
            if time.monotonic() > self._deadline.get(handle.job_id, float("inf")):
                console.warning("servestack.runners.local", f"{handle.spec.name}: time limit reached, stopping container")
                c.kill()
                c.wait()
                self._save_logs(handle, c)
                return JobState.TIMEOUT
            return JobState.RUNNING
        code = c.attrs.get("State", {}).get("ExitCode", 1)
        self._save_logs(handle, c)
        if handle.cancelled_by_us:
            return JobState.CANCELLED
        return JobState.COMPLETED if code == 0 else JobState.FAILED

    def _save_logs(self, handle: JobHandle, c: Container) -> None:
        path = handle.spec.jobs_dir / f"{handle.spec.name}.{handle.job_id[:12]}.log"
        if not path.exists():
            with contextlib.suppress(Exception):  # logs are a convenience
                atomic_write_text(path, c.logs().decode(errors="replace"))

    def cancel(self, handle: JobHandle) -> None:
        handle.cancelled_by_us = True
        c = self._container(handle)
        if c is not None and c.status == "running":
            c.stop(timeout=20)

    def collect(self, handle: JobHandle) -> Path:
        c = self._container(handle)
        if c is not None and c.status != "running":
            self._save_logs(handle, c)
            with contextlib.suppress(Exception):
                c.remove()
        return handle.spec.out_dir
