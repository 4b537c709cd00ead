"""The Slurm runner: rendered batch scripts and the preflight's choices (the real scheduler's mechanics:
test_slurm_e2e.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fixtures.runner_jobs import GB200_PREFLIGHT
from servestack.errors import ServestackError
from servestack.runners.interface import JobSpec, Mount
from servestack.runners.slurm import SlurmConfig, choose_container, format_time_limit, render_batch_script

IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32


def image_spec(tmp_path):
    return JobSpec(name="throughput-agg", points=("1", "4"), out_dir=tmp_path / "agg",
                   command=("python3", "/opt/servestack-clients/run_points.py", "--points", "{points}"),
                   image=IMAGE, mounts=(Mount(host=tmp_path / "agg", container="/results", read_only=False),
                                        Mount(host=Path("/srv/model"), container="/model")),
                   env={"HF_HUB_OFFLINE": "1"}, time_limit_s=5400, gpus=4)


def test_docker_batch_script(tmp_path):
    s = render_batch_script(image_spec(tmp_path), SlurmConfig(partition="batch", account="acct", container="docker"))
    assert "#SBATCH --time=01:30:00" in s and "#SBATCH --partition=batch" in s and "#SBATCH --gres=gpu:4" in s
    assert ("docker run --rm --name \"servestack-${SLURM_JOB_ID}\" --shm-size 2g --gpus all "
            f"-v {tmp_path}/agg:/results") in s
    assert "-v /srv/model:/model:ro" in s and "-e HF_HUB_OFFLINE" in s and "export HF_HUB_OFFLINE=1" in s
    assert f"{IMAGE} python3 /opt/servestack-clients/run_points.py --points 1,4" in s
    assert "trap 'docker kill \"servestack-${SLURM_JOB_ID}\"" in s


def test_pyxis_batch_script(tmp_path):
    s = render_batch_script(image_spec(tmp_path), SlurmConfig(container="pyxis"))
    assert "--container-image=127.0.0.1:5000#servestack/dev-cpu@sha256:" in s
    assert f"--container-mounts={tmp_path}/agg:/results,/srv/model:/model:ro" in s
    assert "--container-env=HF_HUB_OFFLINE" in s and "docker" not in s


PYXIS_HELP = "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"


def test_preflight_takes_pyxis_when_the_cluster_has_it_and_names_what_is_missing():
    assert choose_container("auto", srun_help=PYXIS_HELP, enroot_version="4.1.2\n", docker=False) == "pyxis"
    assert choose_container("auto", srun_help="--ntasks", enroot_version=None, docker=True) == "docker"
    assert choose_container("docker", srun_help=PYXIS_HELP, enroot_version="4.1.2", docker=True) == "docker"
    with pytest.raises(ServestackError, match="enroot 3.1.0 is older than 3.4.0"):
        choose_container("auto", srun_help=PYXIS_HELP, enroot_version="3.1.0", docker=True)
    with pytest.raises(ServestackError, match="`enroot` is not on PATH"):
        choose_container("auto", srun_help=PYXIS_HELP, enroot_version=None, docker=True)
    with pytest.raises(ServestackError, match="pyxis is not in this cluster's plugstack.conf"):
        choose_container("pyxis", srun_help="--ntasks", enroot_version="4.1.2", docker=True)
    with pytest.raises(ServestackError, match="srun has no --container-image .* `docker` is not on PATH"):
        choose_container("auto", srun_help="--ntasks", enroot_version=None, docker=False)


def test_pyxis_pulls_from_the_registry_the_nodes_use(tmp_path):
    s = render_batch_script(image_spec(tmp_path), SlurmConfig(container="pyxis",
                                                              registry_map={"127.0.0.1:5000": "127.0.0.1:5001"}))
    assert "--container-image=127.0.0.1:5001#servestack/dev-cpu@sha256:" in s


def test_small_helpers():
    assert format_time_limit(30) == "00:01:00" and format_time_limit(90061) == "1-01:01:01"


def test_the_preflight_runs_on_every_node_before_the_server(tmp_path):
    s = render_batch_script(replace(image_spec(tmp_path), preflight=GB200_PREFLIGHT), SlurmConfig(container="pyxis"))
    preflight, server = s.index("srun --ntasks-per-node=1 bash"), s.index("--container-image=")
    assert preflight < server and "export SERVESTACK_PREFLIGHT_MIN_DRIVER=580" in s and "exit 3" in s
    skipped = render_batch_script(replace(image_spec(tmp_path), preflight=replace(GB200_PREFLIGHT, skipped=True)),
                                  SlurmConfig(container="pyxis"))
    assert "servestack-preflight.sh" not in skipped
