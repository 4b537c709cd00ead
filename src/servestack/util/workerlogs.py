"""What vLLM's workers say in their logs that smoke and the srt-slurm runners both count."""

from __future__ import annotations

import re

# vLLM's NixlConnector stats, logged by the worker that pulled the KV blocks once per interval.
_KV_LINE = re.compile(r"KV Transfer metrics: (.*)$", re.M)


def kv_transfers(log: str) -> dict[str, int]:
    """Successful and failed NIXL transfers in a worker's log (summed over its stats intervals)."""
    totals = {"successful": 0, "failed": 0}
    for fields in _KV_LINE.findall(log):
        values = dict(re.findall(r"([A-Za-z][\w ()/]*?)=([\d.]+)", fields))
        totals["successful"] += int(float(values.get("Num successful transfers", 0)))
        totals["failed"] += int(float(values.get("Num failed transfers", 0)))
    return totals
