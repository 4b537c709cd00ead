"""Runners: local (docker on this host), slurm (sbatch), srtctl (srt-slurm) behind one interface."""

from .base import RETRYABLE, JobHandle, JobSpec, JobState, Mount, Runner
from .driver import JobOutcome, RetryPolicy, cancel_on_signals, run_job

__all__ = [
    "RETRYABLE", "JobHandle", "JobOutcome", "JobSpec", "JobState", "Mount", "RetryPolicy", "Runner",
    "cancel_on_signals", "run_job",
]
