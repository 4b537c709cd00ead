"""The srtctl runner with real srtctl from the vendored srt-slurm tree, submitting to this machine's Slurm."""

from __future__ import annotations

import pytest

from fixtures.paths import ROOT
from fixtures.runner_jobs import bad_recipe
from servestack.errors import ClusterToolsMissing, ServestackError
from servestack.runners.srtctl import SrtctlRunner


@pytest.fixture(scope="module")
def node():
    from servestack import cluster

    try:
        return cluster.ensure_cluster(ROOT)
    except ClusterToolsMissing as e:
        pytest.skip(str(e))


@pytest.mark.e2e
def test_real_srtctl_refuses_a_bad_recipe_with_its_json_error_contract(tmp_path, node, monkeypatch):
    # servestack's own check refuses this recipe first (test_srtctl.py); here srtctl's error contract is under test.
    monkeypatch.setattr("servestack.runners.srtctl.check_recipe_before_submit", lambda job, log: None)
    runner = SrtctlRunner(executable=node.srtctl.argv(), output_base=tmp_path / "o", env=node.env)
    with pytest.raises(ServestackError, match=r"srtctl apply -f .*agg\.\d+\.yaml failed \(exit 1\)"):
        runner.submit(bad_recipe(tmp_path))
    assert not list((tmp_path / "o").iterdir())  # nothing submitted
