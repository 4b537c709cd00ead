"""The cluster tooling: where the vendored sources are found, srtctl's cluster config, the setup
script that pins a worker's CPUs (the real srtctl: test_cluster_e2e.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from servestack.cluster import srtctl_tool, vendored
from servestack.errors import ClusterToolsMissing, CommandError


def test_vendor_dir_is_configuration_only(tmp_path, monkeypatch):
    monkeypatch.delenv(vendored.VENDOR_ENV, raising=False)
    with pytest.raises(ClusterToolsMissing, match="SERVESTACK_VENDOR is not set"):
        vendored.vendor_dir()
    monkeypatch.setenv(vendored.VENDOR_ENV, str(tmp_path / "elsewhere"))
    assert vendored.vendor_dir() == tmp_path / "elsewhere"


def test_a_missing_snapshot_names_the_directory_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(vendored.VENDOR_ENV, str(tmp_path))
    with pytest.raises(ClusterToolsMissing, match=f"no srt-slurm-<commit>.tar.gz in {tmp_path}.*SERVESTACK_VENDOR"):
        vendored.vendor_archive("srt-slurm")
    (tmp_path / "srt-slurm-aaaa.tar.gz").write_bytes(b"")
    (tmp_path / "srt-slurm-bbbb.tar.gz").write_bytes(b"")
    with pytest.raises(ClusterToolsMissing, match="2 srt-slurm"):
        vendored.vendor_archive("srt-slurm")


def test_srtslurm_config_turns_off_what_slurm_22_rejects(tmp_path):
    config = yaml.safe_load(srtctl_tool.srtslurm_config(tmp_path, partition="main", account="acct",
                                                    model_paths={"tiny": "/m/tiny"}))
    assert config["use_gpus_per_node_directive"] is False and config["use_segment_sbatch_directive"] is False
    assert config["default_partition"] == "main" and config["default_account"] == "acct"
    assert config["srtctl_root"] == str(tmp_path) and config["model_paths"] == {"tiny": "/m/tiny"}


def _after_setup_script(tree: Path, env: dict[str, str], cpus: list[int]) -> tuple[str, str]:
    """What srtctl's worker shell does (worker_stage._build_worker_preamble): `bash <setup script>`
    from the shell that then starts the worker, here a shell allowed `cpus` (as a step's cpuset
    would allow them) whose "worker" prints its CPU list. Returns that list and the script's stderr."""
    script = tree / "configs" / srtctl_tool.PIN_WORKER_CPUS_SCRIPT
    cpu_list = ",".join(map(str, cpus))
    proc = subprocess.run(["taskset", "--cpu-list", cpu_list, "bash", "-c",
                           f"bash {script} >/dev/null && grep Cpus_allowed_list: /proc/self/status"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise CommandError(["bash", str(script)], proc.returncode, proc.stderr)
    return proc.stdout.split()[-1], proc.stderr


def test_the_setup_script_splits_the_cpus_between_the_workers_whose_environment_asks(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip(f"this process may run on one CPU only ({allowed}): a pin to one CPU would change nothing")
    tree = tmp_path / "srt-slurm"
    (tree / "configs").mkdir(parents=True)
    srtctl_tool._install_setup_scripts(tree)
    pin = srtctl_tool.PIN_WORKER_CPUS_ENV
    everything, _ = _after_setup_script(tree, {pin: ""}, allowed)
    assert everything == _after_setup_script(tree, {}, allowed)[0] and everything != str(allowed[-1])
    # The prefill worker takes the last CPU, the decode worker the others: as Python slices them.
    assert _after_setup_script(tree, {pin: "-1:"}, allowed) == (str(allowed[-1]), "")
    rest, said = _after_setup_script(tree, {pin: ":-1"}, allowed)
    assert said == "" and _cpus(rest) == allowed[:-1]
    # A step whose cpuset lacks the host's last CPU: the last CPU it has (not an EINVAL).
    assert _after_setup_script(tree, {pin: "-1:"}, allowed[:1]) == (str(allowed[0]), "")
    # More than the step has: said, and pinned to what there is; a slice that leaves nothing: said, left alone.
    pinned, said = _after_setup_script(tree, {pin: "-64:"}, allowed[1:2])
    assert pinned == str(allowed[1])
    assert f"{pin}=-64:, but only 1 CPU(s) are allowed here ({allowed[1]}): pinning to those" in said
    pinned, said = _after_setup_script(tree, {pin: ":-1"}, allowed[1:2])
    assert pinned == str(allowed[1]) and f"{pin}=:-1 leaves none of the 1 CPU(s) allowed here" in said
    # A value that is not such a slice stops the worker's start (srtctl joins the preamble with &&).
    for wrong in ("1", "0", "-0:", "0-1", ":1", "no-such-cpu"):
        with pytest.raises(CommandError, match=f'{pin}="{wrong}": expected "-N:"'):
            _after_setup_script(tree, {pin: wrong}, allowed)


def _cpus(cpu_list: str) -> list[int]:
    """Cpus_allowed_list's "0-2,5" as [0, 1, 2, 5]."""
    cpus: list[int] = []
    for part in cpu_list.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus
