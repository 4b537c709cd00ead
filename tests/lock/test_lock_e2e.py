"""`servestack lock` against real services: the Debian docker-registry on loopback for a base given as an
image, and the real package index."""

from __future__ import annotations

import pytest

from fixtures.tinystack import github, make_project
from servestack import lock
from servestack.errors import InputError
from servestack.util.project import Project


@pytest.mark.e2e
def test_a_base_image_is_locked_by_the_digest_the_registry_gives(tmp_path, world, registry_base):
    project = make_project(tmp_path, world, base_image=registry_base["reference"])
    lock.lock(project, "tiny", github(world))
    assert lock.load_lock(project, "tiny").base.digest == registry_base["digest"]


@pytest.mark.e2e
@pytest.mark.parametrize("extra", ["vllm==0.33.0", "nixl-cu13==1.5.1"])
def test_an_unsatisfiable_pin_is_one_readable_sentence(tmp_path, extra):
    """Against the real package index: Dynamo 1.6.1 pins its vLLM and NIXL."""
    (tmp_path / "pins").mkdir()
    name, version = extra.split("==")
    (tmp_path / "pins" / "clash.yaml").write_text(
        "name: clash\nplatforms: [linux/arm64]\npython: \"3.11\"\nbase: {image: 127.0.0.1:5000/base:1}\n"
        "packages:\n  - {name: ai-dynamo, version: 1.6.1, extras: [vllm]}\n"
        f"  - {{name: {name}, version: {version}}}\n"
        "exclude:\n  - {name: aisimulate, reason: only a stub sdist on PyPI}\n"
        "smoke_model: {name: m, path: /m}\n")
    project = Project(root=tmp_path)
    with pytest.raises(InputError) as info:
        lock.lock(project, "clash")
    message = str(info.value)
    assert message.startswith(f"{project.stack_file('clash')}: packages: these packages cannot be installed together:")
    assert f"but the stack asks for {extra}" in message and "ai-dynamo[vllm]==1.6.1 depends on" in message
    assert "\n" not in message
    assert not project.lock_file("clash").exists()
