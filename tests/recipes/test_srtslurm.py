"""The srt-slurm the recipes are checked with is named by tag and commit, in every rendered recipe,
and the vendored snapshot the cluster tests run must be that commit."""

from __future__ import annotations

import pytest

from fixtures.paths import ROOT
from servestack.errors import InputError
from servestack.recipes.srtslurm import SRT_SLURM


def test_every_committed_recipe_names_the_srt_slurm_it_was_checked_with():
    recipes = [r for r in sorted((ROOT / "recipes").glob("*/*.yaml")) if r.parent.name != "families"]
    assert recipes
    for recipe in recipes:
        header = recipe.read_text().split("\n\n", 1)[0]
        assert f"# checked with: srt-slurm {SRT_SLURM.tag} ({SRT_SLURM.commit[:12]})" in header, recipe
        # srt-slurm 2.0 loads a v1 recipe only after migrating it.
        assert "srtctl migrate -f <this file> --in-place" in header, recipe


def test_the_vendored_snapshot_must_be_the_pinned_commit(tmp_path):
    SRT_SLURM.check_snapshot(tmp_path / f"srt-slurm-{SRT_SLURM.commit[:12]}.tar.gz")
    with pytest.raises(InputError, match=r"commit '0123456789ab', not the pinned v1\.0\.68 \(c88ef7316368\)"):
        SRT_SLURM.check_snapshot(tmp_path / "srt-slurm-0123456789ab.tar.gz")


def test_the_shared_vendor_directory_holds_the_pinned_snapshot():
    vendor = ROOT.parent / "shared" / "vendor"
    archives = sorted(vendor.glob("srt-slurm-*.tar.gz"))
    if not archives:
        pytest.skip(f"no vendored srt-slurm beside the checkout ({vendor})")
    [archive] = archives
    SRT_SLURM.check_snapshot(archive)
