"""Which platform a step works on, and what a platform new to a lock resolves to."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from servestack import platforms
from servestack.errors import ServestackError
from servestack.lock.preferences import Upgrade, preferred

BOTH = ("linux/amd64", "linux/arm64")


def test_a_stack_of_several_platforms_builds_this_machine_s_by_default(monkeypatch):
    monkeypatch.setattr(platforms, "host_platform", lambda: "linux/amd64")
    assert platforms.choose(BOTH, None, "pins/s.lock") == "linux/amd64"
    assert platforms.choose(BOTH, "linux/arm64", "pins/s.lock") == "linux/arm64"
    # A stack of one foreign platform builds it (under qemu where needed).
    assert platforms.choose(("linux/arm64",), None, "pins/s.lock") == "linux/arm64"


def test_a_platform_the_lock_lacks_or_a_choice_it_cannot_make_is_refused_naming_the_file(monkeypatch):
    with pytest.raises(ServestackError, match=r"pins/s.lock: --platform: no platform linux/arm64; it has linux/amd64"):
        platforms.choose(("linux/amd64",), "linux/arm64", "pins/s.lock")
    monkeypatch.setattr(platforms, "host_platform", lambda: "linux/riscv64")
    with pytest.raises(ServestackError, match=r"none of them this machine's \(linux/riscv64\); choose one with --platform"):
        platforms.choose(BOTH, None, "pins/s.lock")


def wheel(name: str, version: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, version=version)


def test_a_platform_new_to_the_lock_prefers_the_versions_the_other_platforms_hold():
    # One lock, one set of releases: a stack that gains linux/amd64 serves on x86 what it serves on arm64.
    held = {"linux/arm64": (wheel("redis", "8.1.0"), wheel("openai", "3.57.0"))}
    old = SimpleNamespace(platforms=held, wheels=lambda p: held.get(p, ()))
    assert preferred(old, "linux/amd64", upgrade=Upgrade(), changed={}) == {"redis": "8.1.0", "openai": "3.57.0"}
    assert preferred(old, "linux/amd64", upgrade=Upgrade.of(["redis"]), changed={}) == {"openai": "3.57.0"}
    assert preferred(old, "linux/amd64", upgrade=Upgrade.of([]), changed={}) == {}


def test_one_lock_s_builds_for_two_platforms_name_two_images():
    from servestack.inputs import input_hash

    same = {"lock_sha256": "0" * 64, "containers": "c", "overlays": [], "model_files": {"config.json": "1" * 64}}
    assert input_hash(platform="linux/amd64", **same) != input_hash(platform="linux/arm64", **same)
    assert input_hash(platform="linux/amd64", **same) == input_hash(platform="linux/amd64", **same)
