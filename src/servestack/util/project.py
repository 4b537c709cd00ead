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


WITHOUT = ".without-"


def variant_of(stack: str) -> tuple[str, int | None]:
    """(the stack, the PR taken out) of a stack's name or its variant's: `dev-cpu.without-41869` is the
    dev-cpu image without PR 41869, built from dev-cpu's own stack file and lock; it has its own
    build/<name>/ and image repository, and no committed digest."""
    base, _, number = stack.partition(WITHOUT)
    return (base, int(number)) if number.isdigit() else (stack, None)


def variant_name(stack: str, number: int) -> str:
    return f"{stack}{WITHOUT}{number}"


@dataclass(frozen=True, kw_only=True)
class Project:
    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> Project:
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
        return self.pins / f"{variant_of(stack)[0]}.yaml"

    def lock_file(self, stack: str) -> Path:
        return self.pins / f"{variant_of(stack)[0]}.lock"

    def artifacts(self, stack: str) -> Path:
        return self.root / "build" / stack

    def shown(self, path: Path) -> Path:
        """PATH as the user is shown it: relative to the checkout when inside it."""
        return path.relative_to(self.root) if path.is_relative_to(self.root) else path

    def read_json(self, path: Path, remedy: str) -> dict[str, Any]:
        """A JSON file of this project; a missing or broken one is named with what to run."""
        from servestack.errors import ServestackError

        shown = self.shown(path)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise ServestackError(f"{shown}: missing; {remedy}") from None
        except ValueError as exc:
            raise ServestackError(f"{shown}: not valid JSON ({exc})") from None
