"""One small runner interface: submit a job, ask its state, wait, cancel, collect its results.

A job has *points* (concurrencies, accuracy repeats); it must leave `<out_dir>/<point>.json` for
each point it finished, written atomically. The driver (`run_job`) resubmits a job whose end state
is retryable (`RETRYABLE`, unless the pipeline names others; a job we cancelled ourselves is never
retried) for its remaining points only, and a rerun starts from what is already on disk.

Two kinds of job:
  - image jobs: `image` is set; `command` runs inside the image (started by digest) with `mounts`;
  - command jobs: `image` is None; `command` runs as is on the node (container-free), used to test
    the scheduler mechanics without an image.
In `command`, the token "{points}" is replaced by the comma-separated remaining points.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from servestack.runners.preflight import NodePreflight
from servestack.util.console import console


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN)

    @property
    def unfinished_end(self) -> bool:
        """An end state that leaves points undone: one a retry policy may name."""
        return self.terminal and self is not JobState.COMPLETED

    @classmethod
    def parse(cls, text: str) -> JobState:
        """Slurm spellings: 'CANCELLED by 0', 'CANCELLED+', 'CONFIGURING', 'COMPLETING', 'OOM'..."""
        word = text.strip().split()[0].rstrip("+").upper() if text.strip() else ""
        aliases = {
            "CONFIGURING": cls.PENDING, "REQUEUED": cls.PENDING, "REQUEUE_HOLD": cls.PENDING,
            "REQUEUE_FED": cls.PENDING, "RESV_DEL_HOLD": cls.PENDING, "SUSPENDED": cls.RUNNING,
            "COMPLETING": cls.RUNNING, "STAGE_OUT": cls.RUNNING, "SIGNALING": cls.RUNNING,
            "RESIZING": cls.RUNNING, "STOPPED": cls.RUNNING, "OOM": cls.OUT_OF_MEMORY,
            "BOOT_FAIL": cls.NODE_FAIL, "DEADLINE": cls.TIMEOUT, "REVOKED": cls.CANCELLED,
            "SPECIAL_EXIT": cls.FAILED, "PD": cls.PENDING, "R": cls.RUNNING, "CG": cls.RUNNING,
            "CD": cls.COMPLETED, "F": cls.FAILED, "CA": cls.CANCELLED, "PR": cls.PREEMPTED,
            "NF": cls.NODE_FAIL, "TO": cls.TIMEOUT,
        }
        if word in aliases:
            return aliases[word]
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN


# End states a fault causes, not the job itself: retried by default (a pipeline's retry.retry_on
# may name any other unfinished end, e.g. FAILED).
RETRYABLE = frozenset({JobState.PREEMPTED, JobState.NODE_FAIL, JobState.TIMEOUT, JobState.CANCELLED})


@dataclass(frozen=True, kw_only=True)
class Mount:
    host: Path
    container: str
    read_only: bool = True


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    name: str  # e.g. "throughput-dev-agg"
    points: tuple[str, ...]
    out_dir: Path  # host directory that receives <point>.json
    command: tuple[str, ...]
    image: str | None = None  # repo@sha256:... ; None = command job
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    time_limit_s: int = 3600
    gpus: int = 0
    workdir: Path | None = None  # logs, rendered scripts; default out_dir/.jobs
    recipe_file: Path | None = None  # srtctl: the bound srt-slurm recipe
    recipe_name: str = ""
    # srtctl: where in the recipe the points live ("benchmark.concurrencies"); used to bind remaining points
    extra: dict[str, object] = field(default_factory=dict)
    preflight: NodePreflight | None = None  # checked on every allocated node before any server starts

    @property
    def jobs_dir(self) -> Path:
        return self.workdir or (self.out_dir / ".jobs")

    def point_file(self, point: str) -> Path:
        return self.out_dir / f"{point}.json"

    def remaining(self) -> tuple[str, ...]:
        return tuple(p for p in self.points if not self.point_file(p).exists())

    def with_points(self, points: tuple[str, ...]) -> JobSpec:
        return replace(self, points=points)

    def argv(self) -> list[str]:
        joined = ",".join(self.points)
        return [a.replace("{points}", joined) for a in self.command]


@dataclass(kw_only=True)
class JobHandle:
    runner: str
    job_id: str
    spec: JobSpec
    submitted_at: float = field(default_factory=time.time)
    output_dir: Path | None = None  # where the runner's own outputs land (srtctl's outputs/<id>)
    cancelled_by_us: bool = False


class Runner(Protocol):
    name: str

    def submit(self, job: JobSpec) -> JobHandle: ...

    def state(self, handle: JobHandle) -> JobState: ...

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobState: ...

    def cancel(self, handle: JobHandle) -> None: ...

    def collect(self, handle: JobHandle) -> Path: ...


class PollingWait:
    """`wait` in terms of `state`, for runners that poll."""

    poll_seconds: float = 2.0

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobState:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.state(handle)  # type: ignore[attr-defined]
            if st.terminal:
                return st
            if deadline is not None and time.monotonic() >= deadline:
                return st
            time.sleep(self.poll_seconds)


def check_recipe_before_submit(job: JobSpec, source: str) -> None:
    """A recipe that cannot run is refused here, before an allocation loads the model on every node: the
    same checks as `recipes validate` (InputErrors); what runs but costs is a warning from `source`."""
    if job.recipe_file is None:
        return
    from servestack.recipes import check_before_run

    for warning in check_before_run([job.recipe_file]):
        console.warning(source, f"{job.name}: {warning}")
