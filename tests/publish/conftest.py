"""The registries and the publication the publish e2e tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.hostile_registry import HostileRegistry
from fixtures.publication import STACK, make_project, new_image
from fixtures.tls_registry import TlsRegistry
from servestack import publish
from servestack.publish import signing


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRegistry]:
    reg = TlsRegistry.create(tmp_path_factory.mktemp("tls-registry"))
    yield reg
    reg.stop()


@pytest.fixture
def env(tls_registry: TlsRegistry, monkeypatch: pytest.MonkeyPatch) -> TlsRegistry:
    for name, value in tls_registry.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    return tls_registry


@pytest.fixture
def published(env: TlsRegistry, tmp_path: Path) -> dict:
    """An image in the TLS registry, published once with a new key."""
    image, client = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    record = publish.publish(project, STACK, key=private)
    return {"image": image, "client": client, "project": project, "key": private, "pub": public, "record": record,
            "registry": env}


@pytest.fixture
def hostile(registry: str) -> Iterator[HostileRegistry]:
    server = HostileRegistry.start(upstream=registry)
    yield server
    server.stop()
