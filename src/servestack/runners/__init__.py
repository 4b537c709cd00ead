"""Runners: local (docker on this host), slurm (sbatch), srtctl (srt-slurm) behind one interface;
`selection.RUNNERS` is the list of them."""

from servestack.runners.driver import JobOutcome, RetryPolicy, run_job
from servestack.runners.interface import RETRYABLE, JobHandle, JobSpec, JobState, Mount, Runner
from servestack.runners.selection import RUNNERS, RunnerKind, make_runner

__all__ = [
    "RETRYABLE", "RUNNERS", "JobHandle", "JobOutcome", "JobSpec", "JobState", "Mount", "RetryPolicy", "Runner",
    "RunnerKind", "make_runner", "run_job",
]
