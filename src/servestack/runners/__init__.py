"""Runners: local (docker on this host), slurm (sbatch), srtctl (srt-slurm) behind one interface;
`registry.RUNNERS` is the list of them."""

from .base import RETRYABLE, JobHandle, JobSpec, JobState, Mount, Runner
from .driver import JobOutcome, RetryPolicy, run_job
from .registry import RUNNERS, RunnerKind, make_runner

__all__ = [
    "RETRYABLE", "RUNNERS", "JobHandle", "JobOutcome", "JobSpec", "JobState", "Mount", "RetryPolicy", "Runner",
    "RunnerKind", "make_runner", "run_job",
]
