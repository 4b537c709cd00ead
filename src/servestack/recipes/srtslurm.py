"""The srt-slurm that servestack's recipes are written and checked for, by tag and commit.

"srtctl 0.3.0" names no build: srt-slurm tags every merge (v1.0.N, then v2.N, where from 2.0 the
package version is the tag) while its pyproject said 0.3.0 for months. So the pin is the tag and
the commit, as InferenceX pins it, and the vendored snapshot the cluster tests run must be that
commit. srt-slurm 2.0 requires `schema: 2` and loads a v1 file only after `srtctl migrate`, so
every rendered recipe says what a user on 2.0 or later runs first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servestack.errors import InputError
from servestack.records.codec import Record


@dataclass(frozen=True, kw_only=True)
class SrtSlurmPin(Record):
    tag: str
    commit: str
    srtctl_version: str  # what that commit's pyproject.toml says
    recipe_schema: int  # the recipe layout that commit loads

    @property
    def short(self) -> str:
        return self.commit[:12]

    def header_lines(self) -> list[str]:
        """What a rendered recipe and a published bundle say about the srtctl they were checked with."""
        return [f"checked with: srt-slurm {self.tag} ({self.short}), srtctl {self.srtctl_version}, recipe schema "
                f"v{self.recipe_schema}",
                "srtctl >= 2.0: run `srtctl migrate -f <this file> --in-place` first"]

    def check_snapshot(self, archive: Path) -> None:
        """A vendored `srt-slurm-<commit>.tar.gz` must be the pinned commit: the cluster tests would
        otherwise prove the recipes against another srtctl than the one their headers name."""
        commit = archive.name.removeprefix("srt-slurm-").removesuffix(".tar.gz")
        if not self.commit.startswith(commit) or len(commit) < 7:
            raise InputError(archive, "commit", f"the vendored srt-slurm is commit {commit!r}, not the pinned "
                             f"{self.tag} ({self.short}); vendor that commit or move the pin in "
                             "servestack/recipes/srtslurm.py")


# NVIDIA/srt-slurm v1.0.68: "feat(vllm): default DP launch to per-node (#331)", 2026-08-21.
SRT_SLURM = SrtSlurmPin(tag="v1.0.68", commit="c88ef731636890ff6385a783e152c1790e15b194", srtctl_version="0.3.0",
                        recipe_schema=1)
