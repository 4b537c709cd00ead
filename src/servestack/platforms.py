"""The target platforms an image is built for, and which of them this machine runs natively.

One table: the OCI platform name, Debian's architecture, the wheel-tag machine, and the ELF machine
number. A stack may name several (one lock, one image index); each `build`/`image` makes one.
"""

from __future__ import annotations

import platform as host
from dataclasses import dataclass

from servestack.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Platform:
    name: str  # OCI: linux/amd64
    debian: str  # amd64
    machine: str  # wheel tags and uname: x86_64
    oci_architecture: str
    oci_variant: str | None
    elf_machine: int


PLATFORMS: dict[str, Platform] = {
    "linux/amd64": Platform(name="linux/amd64", debian="amd64", machine="x86_64", oci_architecture="amd64",
                            oci_variant=None, elf_machine=62),
    "linux/arm64": Platform(name="linux/arm64", debian="arm64", machine="aarch64", oci_architecture="arm64",
                            oci_variant="v8", elf_machine=183),
}


def host_platform() -> str:
    """This machine's platform, as an image names it (linux/amd64 on x86_64)."""
    machine = host.machine().lower()
    return next((p.name for p in PLATFORMS.values() if machine in (p.machine, p.debian)), f"linux/{machine}")


def choose(available: list[str] | tuple[str, ...], requested: str | None, where: str) -> str:
    """The platform a step works on: the one asked for, else this machine's when WHERE has it, else
    WHERE's only one. A stack of several platforms builds the host's by default, so that what is
    built here can be run here; the others are asked for by name (under qemu where needed)."""
    if requested is not None:
        if requested not in available:
            raise InputError(where, "--platform", f"no platform {requested}; it has {', '.join(sorted(available))}")
        return requested
    if host_platform() in available:
        return host_platform()
    if len(available) == 1:
        return next(iter(available))
    raise InputError(where, "--platform", f"platforms {', '.join(sorted(available))}, none of them this machine's "
                                          f"({host_platform()}); choose one with --platform")
