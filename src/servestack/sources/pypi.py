"""Wheels for a target platform: the full dependency closure, resolved by uv into PEP 751 form.

We do not resolve dependencies ourselves: `uv pip compile --format pylock.toml` does, once per
target platform, and we keep for each package the one wheel the target's installer would pick.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging import tags
from packaging.markers import Marker
from packaging.utils import parse_wheel_filename

from servestack.errors import InputError, NetworkError, ServestackError
from servestack.records import lockfile
from servestack.records.codec import json_quirks
from servestack.records.stack import Stack
from servestack.sources.indexes import DEFAULT_INDEX, IndexLocation, locate
from servestack.util import proc
from servestack.wheels import normalize

# Oldest glibc the image's base satisfies; manylinux wheels up to it are acceptable.
GLIBC = (2, 36)
ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


@dataclass(frozen=True, kw_only=True)
class FoundWheel(lockfile.LockedWheel):
    """A wheel as an index offered it: the lock's entry (records.lockfile owns its fields and their
    JSON) plus what locking needs and the lock never keeps."""

    # where it was found; the lock names the index, whose place is this machine's configuration
    url: str = field(metadata=json_quirks(written=False))
    upload_time: int | None = field(metadata=json_quirks(written=False))  # the lock's source_date_epoch is the newest


def index_locations(stack: Stack, stack_file: Path) -> list[IndexLocation]:
    """The stack's indexes where this machine's configuration puts them, the default index first."""
    defaults = {i.name: i.url for i in stack.indexes}
    names = [DEFAULT_INDEX] + [i.name for i in stack.indexes if i.name != DEFAULT_INDEX]
    return [locate(name, defaults, where=str(stack_file)) for name in names]


def target_tags(platform: str, python: str) -> list[tags.Tag]:
    """Wheel tags an installer on the target accepts, best first."""
    arch = ARCH[platform]
    major, minor = (int(p) for p in python.split("."))
    platforms = [f"manylinux_{GLIBC[0]}_{m}_{arch}" for m in range(GLIBC[1], 16, -1)]
    # The legacy aliases still appear on wheels: manylinux2014 = 2_17, manylinux2010 = 2_12, manylinux1 = 2_5.
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return list(tags.cpython_tags((major, minor), platforms=platforms)) + list(
        tags.compatible_tags((major, minor), platforms=platforms)
    )


def _uv() -> str:
    found = shutil.which("uv")
    if not found:
        raise ServestackError("uv is not installed: `pip install uv` (servestack uses it to resolve wheels)")
    return found


def _unsatisfiable_sentence(output: str) -> str | None:
    """uv's derivation, said in one sentence: what depends on what, and what the stack asks for."""
    text = " ".join(line.strip() for line in output.splitlines())
    if "unsatisfiable" not in text:
        return None
    # Keep uv's premises only: its conclusions restate them.
    text = re.sub(r"we can conclude that .*?(?:\.\s+(?=And because)|\.?\s*$)", "", text)
    requirement = r"[A-Za-z0-9][\w.\-]*(?:\[[\w,\-]+\])?(?:[=<>!~]=?[\w.*+!\-]+)?"
    depends = [(a.rstrip("."), b.rstrip(".")) for a, b in re.findall(rf"({requirement}) depends on ({requirement})", text)]
    required: list[str] = []
    for clause in re.findall(r"you require (.+?)(?:,|$)", text):
        required += [r.rstrip(".") for r in re.split(r"\s+and\s+", clause) if r]
    dependents = {d for d, _ in depends}
    asked = [r for r in dict.fromkeys(required) if r not in dependents]
    facts = list(dict.fromkeys(f"{a} depends on {b}" for a, b in depends))
    if not facts:
        return None
    sentence = " and ".join(facts)
    if asked:
        sentence += f", but the stack asks for {' and '.join(asked)}"
    return f"these packages cannot be installed together: {sentence}"


def pylock_text(versions: dict[str, str], python: str) -> str:
    """A pylock.toml that uv reads as preferences when it is the output file it overwrites."""
    lines = ['lock-version = "1.0"', 'created-by = "servestack"', f'requires-python = ">={python}"', ""]
    for name, version in sorted(versions.items()):
        lines += ["[[packages]]", f'name = "{name}"', f'version = "{version}"', ""]
    return "\n".join(lines)


def resolve(stack: Stack, stack_file: Path, platform: str, *, preferences: dict[str, str] | None = None,
            dated: bool = True) -> list[FoundWheel]:
    """Resolve the stack's packages for one platform into exactly one wheel per package, keeping the
    PREFERENCES' versions (name -> version) where the closure allows; `dated`: whether the default
    index serves upload times, without which uv's date cutoff would drop every one of its files."""
    with tempfile.TemporaryDirectory(prefix="servestack-lock-") as tmp:
        work = Path(tmp)
        if preferences:  # uv reads the output file it is about to overwrite as its preferences
            (work / "pylock.toml").write_text(pylock_text(preferences, stack.python))
        (work / "requirements.in").write_text("".join(p.requirement + "\n" for p in stack.packages))
        (work / "overrides.txt").write_text(
            "".join(f'{e.name} ; sys_platform == "never"\n' for e in stack.exclude)
        )
        argv = [
            _uv(), "pip", "compile", "requirements.in",
            "--override", "overrides.txt",
            "--format", "pylock.toml", "-o", "pylock.toml",
            "--python-platform", f"{ARCH[platform]}-manylinux_{GLIBC[0]}_{GLIBC[1]}",
            "--python-version", stack.python,
            "--no-header", "--quiet",
        ]
        if stack.resolved_at and dated:
            argv += ["--exclude-newer", stack.resolved_at]
            # A package pinned to a version on a named index is fixed by that pin; such indexes
            # (PyTorch's, a local directory) often publish no upload times, which the cutoff needs.
            for package in stack.packages:
                if package.index and package.index != DEFAULT_INDEX:
                    argv += ["--exclude-newer-package", f"{package.name}=false"]  # no cutoff for it
        locations = index_locations(stack, stack_file)
        for location in locations:
            argv += location.uv_args(only=False)
        # Our arguments say where every index is; uv's own files must not add another.
        result = proc.run(argv, cwd=work, check=False, env={"UV_NO_CONFIG": "1"})
        if result.returncode != 0:
            sentence = _unsatisfiable_sentence(result.stdout)
            if sentence:
                raise InputError(stack_file, "packages", f"{sentence} (platform {platform}, Python {stack.python})")
            if re.search(r"(?i)(failed to fetch|connect|dns|timed out|network)", result.stdout):
                raise NetworkError(f"resolving wheels for {platform}: the package index could not be reached:\n"
                                   f"{result.stdout.strip()[-800:]}")
            raise ServestackError(f"resolving wheels for {platform} failed:\n{result.stdout.strip()[-1500:]}")
        pylock = tomllib.loads((work / "pylock.toml").read_text())
    return _pick_wheels(pylock, stack, stack_file, platform, locations)


def unavailable(stack: Stack, stack_file: Path) -> dict[str, str]:
    """The packages the stack lets go (`if_unavailable`) that their named index cannot give here,
    each with why: the index has no location on this machine, does not answer, or has no wheel of
    the pinned version for a platform of the stack. Normalized name -> why."""
    defaults = {i.name: i.url for i in stack.indexes}
    found: dict[str, str] = {}
    for package in stack.packages:
        if package.if_unavailable is None:
            continue
        # Package's validator allows `if_unavailable` only with a `version` on a named `index`.
        assert package.index is not None and package.version is not None
        try:
            location = locate(package.index, defaults, where=str(stack_file))
        except InputError as e:
            found[normalize(package.name)] = e.problem
            continue
        for platform in stack.platforms:
            why = _offers(location, package.name, package.version, platform, stack.python)
            if why:
                found[normalize(package.name)] = why
                break
    return found


def _offers(location: IndexLocation, name: str, version: str, platform: str, python: str) -> str | None:
    """None when `location` has a wheel of name==version for the platform, else why not."""
    result, pylock = _compile_pins(location, [f"{name}=={version}"], platform, python)
    if pylock is not None and any(package.get("wheels") for package in pylock.get("packages", [])):
        return None
    said = " ".join(line.strip() for line in result.stdout.strip().splitlines()[-3:]) or "no wheel, only sources"
    return f"{location.describe()} gave no wheel of {name}=={version} for {platform}: {said[-400:]}"


def _compile_pins(
    location: IndexLocation, pins: list[str], platform: str, python: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """uv's answer for exact PINS on `location` alone, without dependencies, and its pylock (None
    when uv failed): so uv's own idea of its default index is never used."""
    with tempfile.TemporaryDirectory(prefix="servestack-pins-") as tmp:
        work = Path(tmp)
        (work / "requirements.in").write_text("".join(p + "\n" for p in pins))
        argv = [
            _uv(), "pip", "compile", "requirements.in", "--no-deps",
            "--format", "pylock.toml", "-o", "pylock.toml",
            "--python-platform", f"{ARCH[platform]}-manylinux_{GLIBC[0]}_{GLIBC[1]}",
            "--python-version", python, "--no-header", "--quiet", *location.uv_args(only=True),
        ]
        result = proc.run(argv, cwd=work, check=False, env={"UV_NO_CONFIG": "1"})
        pylock = tomllib.loads((work / "pylock.toml").read_text()) if result.returncode == 0 else None
    return result, pylock


def _pick_wheels(
    pylock: dict, stack: Stack, stack_file: Path, platform: str, locations: list[IndexLocation]
) -> list[FoundWheel]:
    ranking = {tag: rank for rank, tag in enumerate(target_tags(platform, stack.python))}
    picked = []
    environment = _marker_environment(platform, stack.python)
    for package in pylock.get("packages", []):
        if "marker" in package and not Marker(package["marker"]).evaluate(environment):
            continue
        candidates = []
        for wheel in package.get("wheels", []):
            filename = wheel.get("name") or Path(unquote(urlparse(wheel["url"]).path)).name
            _, _, _, wheel_tags = parse_wheel_filename(filename)
            rank = min((ranking[t] for t in wheel_tags if t in ranking), default=None)
            if rank is not None:
                candidates.append((rank, filename, wheel))
        if not candidates:
            raise InputError(
                stack_file,
                "packages",
                f"{package['name']} {package['version']} has no wheel for {platform} / CPython {stack.python} "
                "(the image is built without compilers or network, so every package must come as a wheel)",
            )
        _, filename, wheel = min(candidates, key=lambda c: (c[0], c[1]))
        upload = wheel.get("upload-time")
        size = wheel.get("size")
        local = urlparse(wheel["url"])
        if size is None and local.scheme == "file":
            size = Path(unquote(local.path)).stat().st_size
        picked.append(
            FoundWheel(
                name=package["name"],
                version=package["version"],
                filename=filename,
                url=wheel["url"],
                sha256=wheel["hashes"]["sha256"],
                size=size,
                upload_time=int(upload.timestamp()) if isinstance(upload, datetime) else None,
                index=_index_of(wheel["url"], locations),
            )
        )
    return sorted(picked, key=lambda w: w.name)


def _marker_environment(platform: str, python: str) -> dict[str, str]:
    return {
        "platform_machine": ARCH[platform],
        "sys_platform": "linux",
        "os_name": "posix",
        "platform_system": "Linux",
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def _index_of(url: str, locations: list[IndexLocation]) -> str:
    """The name of the index a resolved wheel came from (the default index when no other owns it)."""
    return next((loc.name for loc in locations if loc.name != DEFAULT_INDEX and loc.owns(url)), DEFAULT_INDEX)


def wheel_urls(location: IndexLocation, wheels: list[lockfile.LockedWheel], platform: str, python: str) -> dict[str, str]:
    """Where each locked wheel (name, version, filename) is on `location`: filename -> URL.

    A local flat index is a directory; any other index is asked through uv (no dependencies,
    exact pins, that index only), so uv's own idea of its default index is the only one used.
    """
    wanted = {w.filename: w for w in wheels}
    directory = location.directory
    if directory is not None:
        found = {f: (directory / f).as_uri() for f in wanted if (directory / f).is_file()}
    else:
        result, pylock = _compile_pins(location, sorted({f"{w.name}=={w.version}" for w in wheels}), platform, python)
        if pylock is None:
            raise NetworkError(f"{location.describe()}: cannot list the locked files:\n{result.stdout.strip()[-800:]}")
        found = {}
        for package in pylock.get("packages", []):
            for wheel in package.get("wheels", []):
                filename = wheel.get("name") or Path(unquote(urlparse(wheel["url"]).path)).name
                if filename in wanted:
                    found[filename] = wheel["url"]
    missing = sorted(set(wanted) - set(found))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ServestackError(f"{location.describe()} does not have the locked file(s) {shown}")
    return found
