"""The cluster tooling: where the vendored sources are found, srtctl's cluster config, and
(e2e) the real srtctl installed from the vendored srt-slurm tree."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servestack import cluster
from servestack.proc import CommandError, run

ROOT = Path(__file__).resolve().parents[1]


def test_vendor_dir_is_configuration_only(tmp_path, monkeypatch):
    monkeypatch.delenv(cluster.VENDOR_ENV, raising=False)
    with pytest.raises(cluster.ClusterToolsMissing, match="SERVESTACK_VENDOR is not set"):
        cluster.vendor_dir()
    monkeypatch.setenv(cluster.VENDOR_ENV, str(tmp_path / "elsewhere"))
    assert cluster.vendor_dir() == tmp_path / "elsewhere"


def test_a_missing_snapshot_names_the_directory_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(cluster.VENDOR_ENV, str(tmp_path))
    with pytest.raises(cluster.ClusterToolsMissing, match=f"no srt-slurm-<commit>.tar.gz in {tmp_path}.*SERVESTACK_VENDOR"):
        cluster.vendor_archive("srt-slurm")
    (tmp_path / "srt-slurm-aaaa.tar.gz").write_bytes(b"")
    (tmp_path / "srt-slurm-bbbb.tar.gz").write_bytes(b"")
    with pytest.raises(cluster.ClusterToolsMissing, match="2 srt-slurm"):
        cluster.vendor_archive("srt-slurm")


def test_srtslurm_config_turns_off_what_slurm_22_rejects(tmp_path):
    config = yaml.safe_load(cluster.srtslurm_config(tmp_path, partition="main", account="acct",
                                                    model_paths={"tiny": "/m/tiny"}))
    assert config["use_gpus_per_node_directive"] is False and config["use_segment_sbatch_directive"] is False
    assert config["default_partition"] == "main" and config["default_account"] == "acct"
    assert config["srtctl_root"] == str(tmp_path) and config["model_paths"] == {"tiny": "/m/tiny"}


def _affinity_after_setup_script(tree: Path, env: dict[str, str]) -> str:
    """What srtctl's worker shell does (worker_stage._build_worker_preamble): `bash <setup script>`
    from the shell that then starts the worker; here the "worker" prints its CPU list."""
    script = tree / "configs" / cluster.PIN_WORKER_CPUS_SCRIPT
    return run(["bash", "-c", f'bash {script} && grep Cpus_allowed_list: /proc/self/status'],
               env=env, timeout=30).stdout.split()[-1]


def test_the_setup_script_pins_only_the_worker_whose_environment_asks(tmp_path):
    tree = tmp_path / "srt-slurm"
    (tree / "configs").mkdir(parents=True)
    cluster._install_setup_scripts(tree)
    everything = _affinity_after_setup_script(tree, {})
    assert _affinity_after_setup_script(tree, {cluster.PIN_WORKER_CPUS_ENV: "0"}) == "0"
    assert _affinity_after_setup_script(tree, {cluster.PIN_WORKER_CPUS_ENV: ""}) == everything
    # A CPU list taskset cannot apply stops the worker's start (srtctl joins the preamble with &&).
    with pytest.raises(CommandError, match="taskset"):
        _affinity_after_setup_script(tree, {cluster.PIN_WORKER_CPUS_ENV: "no-such-cpu"})


@pytest.fixture(scope="session")
def srtctl() -> cluster.Srtctl:
    try:
        return cluster.ensure_srtctl(ROOT)
    except cluster.ClusterToolsMissing as e:
        pytest.skip(str(e))


@pytest.mark.e2e
def test_real_srtctl_validates_the_dev_cpu_recipe(srtctl):
    out = run(srtctl.argv("dry-run", "-f", str(ROOT / "recipes" / "dev-cpu" / "agg.yaml")), env=srtctl.env)
    assert "sa-bench" in out.stdout and "tiny-qwen3" in out.stdout
    # What `make setup` would download, and the job's Python environment, are in place.
    for needed in ("configs/nats-server", "configs/etcd", f"configs/{cluster.PIN_WORKER_CPUS_SCRIPT}", "bin/uv",
                   "bin/tachometer-scraper", ".venv-compute"):
        assert (srtctl.source / needed).exists(), needed
    assert cluster.ensure_srtctl(ROOT) == srtctl  # cached: the same install
