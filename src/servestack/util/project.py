"""Where a project's files and a run's artifacts live.

A project is a checkout with `pins/`, `recipes/`, `pipelines/` and `containers/`. Artifacts of
each step go to `build/<stack>/` (build.json, image.json, smoke.json, ...); downloaded inputs go
to a content-addressed cache shared between checkouts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack import settings

DEFAULT_STACK = "dev-cpu"


def cache_home() -> Path:
    return Path(settings.value("SERVESTACK_CACHE"))


def state_home() -> Path:
    """Where embedded services (dockerd, registry, Slurm) keep their state and logs."""
    return Path(settings.value("SERVESTACK_STATE"))


@dataclass(frozen=True, kw_only=True)
class Project:
    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> "Project":
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if (candidate / "pins").is_dir():
                return cls(root=candidate)
        return cls(root=here)

    @property
    def pins(self) -> Path:
        return self.root / "pins"

    @property
    def patches(self) -> Path:
        return self.pins / "patches"

    @property
    def recipes(self) -> Path:
        return self.root / "recipes"

    @property
    def pipelines(self) -> Path:
        return self.root / "pipelines"

    @property
    def containers(self) -> Path:
        return self.root / "containers"

    def stack_file(self, stack: str) -> Path:
        return self.pins / f"{stack}.yaml"

    def lock_file(self, stack: str) -> Path:
        return self.pins / f"{stack}.lock"

    def artifacts(self, stack: str) -> Path:
        return self.root / "build" / stack

    def read_json(self, path: Path, remedy: str) -> dict[str, Any]:
        """A JSON file of this project; a missing or broken one is named with what to run."""
        from servestack.errors import ServestackError

        shown = path.relative_to(self.root) if path.is_relative_to(self.root) else path
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise ServestackError(f"{shown}: missing; {remedy}") from None
        except ValueError as exc:
            raise ServestackError(f"{shown}: not valid JSON ({exc})") from None
