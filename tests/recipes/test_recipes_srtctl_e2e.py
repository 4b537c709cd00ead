"""Real srtctl (srt-slurm, installed from the vendored snapshot) accepts every committed recipe.

Our validator is stricter than srtctl in places (values, arithmetic); this proves it is never
looser in the other direction: whatever `recipes check` passes, srtctl's own schema loads and
plans (`srtctl dry-run`: no job is submitted).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.cluster import srtctl_tool
from servestack.recipes import committed_sets
from servestack.util.proc import run
from servestack.util.project import Project

COMMITTED = sorted(p for d in committed_sets(Project(root=ROOT)) for p in d.glob("*.yaml"))


def _dry_run(srtctl: srtctl_tool.Srtctl, recipe: Path) -> str:
    """srtctl's output, or why it failed ("" when it passed)."""
    out = run(srtctl.argv("dry-run", "-f", str(recipe)), env=srtctl.env, check=False, timeout=300)
    text = (out.stdout or "") + (out.stderr or "")
    if out.returncode != 0 or "DRY-RUN" not in text:
        return f"{recipe}: exit {out.returncode}\n{text[-2000:]}"
    return ""


@pytest.mark.e2e
def test_srtctl_dry_run_accepts_every_committed_recipe(srtctl: srtctl_tool.Srtctl):
    # One srtctl per file (given a directory, srtctl stops at the first recipe and exits 0); they
    # spend most of their time waiting (srtctl's model check times out without network), so run
    # them side by side.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(lambda r: _dry_run(srtctl, r), COMMITTED) if f]
    assert not failures, "\n\n".join(failures)


@pytest.mark.e2e
def test_srtctl_dry_run_refuses_what_its_schema_does_not_know(srtctl: srtctl_tool.Srtctl, tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "recipes" / "qwen35-gb200" / "4xdep2-1xdep8.yaml").read_text().replace("gpus_per_node:", "gpus_per_nod:"))
    failure = _dry_run(srtctl, bad)
    assert "exit 1" in failure and "gpus_per_nod" in failure
