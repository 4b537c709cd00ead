"""Credentials and trust the way users keep them: auth.json / Docker's config.json, Docker's certs.d, loopback."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from servestack import settings


def auth_files() -> list[Path]:
    files = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    files.append(Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json")
    return files


def basic_credentials(registry: str) -> str | None:
    """The base64 `user:password` stored for REGISTRY (auth.json or Docker's config.json), if any."""
    for path in auth_files():
        try:
            auths = json.loads(path.read_text()).get("auths", {})
        except (OSError, ValueError, AttributeError):
            continue
        entry = auths.get(registry) or auths.get(f"https://{registry}") or {}
        if entry.get("auth"):
            return str(entry["auth"])
        if entry.get("username") and entry.get("password"):
            return base64.b64encode(f"{entry['username']}:{entry['password']}".encode()).decode()
    return None


def certs_d() -> Path:
    return Path(settings.value("SERVESTACK_CERTS_D"))


def ca_file(registry: str) -> Path | None:
    path = certs_d() / registry / "ca.crt"
    return path if path.is_file() else None


def loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry
    return host == "localhost" or host.startswith("127.") or host == "[::1]"
