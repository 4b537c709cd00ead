"""Programs the project ships as files rather than string literals, so shellcheck reads them (tests/resources/test_resources.py).

They run where Python does not: on cluster nodes before a job's servers start (the preflight), inside
srt-slurm's workers (CPU pinning), behind pyxis (the importer), and as test doubles of NVIDIA's tools.
"""

from __future__ import annotations

from importlib.resources import files

PREFLIGHT = "servestack-preflight.sh"
PIN_WORKER_CPUS = "pin-worker-cpus.sh"
PYXIS_IMPORTER = "pyxis-importer.sh"


def script(name: str) -> str:
    """The text of the shipped program `name` (a file in this package)."""
    return files(__name__).joinpath(name).read_text()
