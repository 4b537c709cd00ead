"""The README's quick start, run (issue 53): after the main job (`bash .ci/bootstrap && nox -s build
image smoke`, which the build workflow's job runs on a fresh checkout of this commit), the rest of the
block as written: keygen, publish, pull, verify --rebuild. In a clone of that checkout with its records,
so the job's own workspace (its publish.json, which later jobs read) is left as it was. About 45 s:
four sessions' virtualenvs, a publish, a pull, one rebuild from warm caches."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures import workflow_jobs

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ("bash .ci/bootstrap", "nox -s build image smoke")


def quick_start() -> list[str]:
    section = (ROOT / "README.md").read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def run_after_main_job(checkout: Path, clone: Path) -> str:
    """The quick start's commands after the main job's, in a clone of CHECKOUT with its dev-cpu records."""
    subprocess.run(["git", "clone", "-q", str(checkout), str(clone)], check=True, timeout=120)
    shutil.copytree(checkout / "build" / "dev-cpu", clone / "build" / "dev-cpu", symlinks=True)
    lines = quick_start()
    assert [line.split("#")[0].strip() for line in lines[:2]] == list(MAIN_JOB), lines[:2]
    script = "set -euo pipefail\n" + "\n".join(lines[2:]) + "\n"
    done = subprocess.run(["bash", "-c", script], cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=900, env=workflow_jobs.runner_env())
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


@pytest.mark.e2e
def test_the_readme_quick_start_runs_after_the_main_job(build_job, runner_root, tmp_path):
    assert build_job.step("Build, image, smoke").outcome == "success"
    out = run_after_main_job(workflow_jobs.workspace(runner_root), tmp_path / "clone")
    assert "publish dev-cpu: " in out
    assert "(linux/amd64): PASS (" in out and "serving did not run" not in out
    assert ": SAME digest" in out
    assert (tmp_path / "clone" / "pulled" / "publication.json").is_file()
    ignored = subprocess.run(["git", "-C", str(tmp_path / "clone"), "status", "--porcelain", "--ignored"],
                             capture_output=True, text=True, check=True).stdout
    assert "!! servestack.key" in ignored  # the private key never shows as a file to commit
