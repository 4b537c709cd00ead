"""Whether a recipe that is well formed can run: its roles agree on what NIXL moves (crossrole.py), its
hardware is what its GPU type has (hardware.py), its workload fits the engine's limits (workload.py)."""

from __future__ import annotations

from servestack.recipes.crossrole import check_roles
from servestack.recipes.hardware import check_hardware
from servestack.recipes.structure import Checker
from servestack.recipes.workload import check_workload
from servestack.util.yamlfile import Node


def check_runnable(c: Checker, root: Node) -> None:
    if c.errors:
        return  # a misspelled key or flag would read as "unset" here and be reported twice, once misleadingly
    check_roles(c, root)
    check_hardware(c, root)
    check_workload(c, root)
