"""The real srtctl installed from the vendored srt-slurm tree."""

from __future__ import annotations

import pytest

from fixtures.paths import ROOT
from servestack.cluster import srtctl_tool
from servestack.util.proc import run


@pytest.mark.e2e
def test_real_srtctl_validates_the_dev_cpu_recipe(srtctl):
    out = run(srtctl.argv("dry-run", "-f", str(ROOT / "recipes" / "dev-cpu" / "agg.yaml")), env=srtctl.env)
    assert "sa-bench" in out.stdout and "tiny-qwen35" in out.stdout
    # What `make setup` would download, and the job's Python environment, are in place.
    for needed in ("configs/nats-server", "configs/etcd", f"configs/{srtctl_tool.PIN_WORKER_CPUS_SCRIPT}", "bin/uv",
                   "bin/tachometer-scraper", ".venv-compute"):
        assert (srtctl.source / needed).exists(), needed
    assert srtctl_tool.ensure_srtctl(ROOT) == srtctl  # cached: the same install
