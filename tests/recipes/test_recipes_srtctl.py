"""The recipes test_recipes_srtctl_e2e.py hands to the real srtctl: every committed one, found as that test
finds them, so an empty or short list cannot pass it unnoticed."""

from __future__ import annotations

from fixtures.paths import ROOT
from servestack.recipes import committed_sets
from servestack.util.project import Project


def test_every_committed_set_is_collected() -> None:
    committed = [p for d in committed_sets(Project(root=ROOT)) for p in d.glob("*.yaml")]
    assert len(committed) == 26  # 20 qwen35-gb200 + 6 dev-cpu (agg, disagg, disagg-multinode: sweep and -acc)
