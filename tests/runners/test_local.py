"""The local runner before docker: a job must name an image (against the real docker engine:
test_local_e2e.py)."""

from __future__ import annotations

import pytest

from fixtures.runner_jobs import dash_job
from servestack.runners.local import LocalRunner


def test_local_runner_needs_an_image(tmp_path):
    with pytest.raises(Exception, match="the local runner runs images"):
        LocalRunner(client=object()).submit(dash_job(tmp_path, ["1"], 0))
