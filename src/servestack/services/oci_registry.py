"""The loopback OCI registry images are pushed to (plain HTTP), and TLS registries with logins (publish tests)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from servestack.errors import ServestackError
from servestack.services.daemons import exclusive, require, spawn_detached, wait_until
from servestack.util.fsutil import atomic_write_text
from servestack.util.project import state_home

DEFAULT_REGISTRY = "127.0.0.1:5000"


def registry_answers(address: str, timeout: float = 0.5, *, ca: Path | None = None) -> bool:
    """True when a Docker/OCI registry answers GET /v2/ (200, or 401 when it wants auth); over TLS
    trusting CA when one is given."""
    # Never through an HTTP(S)_PROXY from the environment: the registry is on loopback.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if ca is not None:
        import ssl

        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(ca))))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(f"{'https' if ca else 'http'}://{address}/v2/", timeout=timeout) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError as e:
        return e.code == 401
    except (OSError, ValueError):
        return False


def _registry_config(address: str, storage: Path, http_extra: str = "", extra: str = "") -> str:
    # Plain YAML written by hand: no dependency for five keys. Paths are quoted in JSON style,
    # which is valid YAML.
    return (
        "version: 0.1\n"
        "log:\n"
        "  level: info\n"
        "storage:\n"
        "  filesystem:\n"
        f"    rootdirectory: {json.dumps(str(storage))}\n"
        "  delete:\n"
        "    enabled: true\n"
        "http:\n"
        f"  addr: {json.dumps(address)}\n"
        + http_extra
        + "health:\n"
        "  storagedriver:\n"
        "    enabled: false\n"
        + extra
    )


def ensure_registry(address: str = DEFAULT_REGISTRY, timeout: float = 30.0) -> str:
    """An OCI registry answers on http://ADDRESS/v2/ (Debian's docker-registry, filesystem
    storage under state_home()/registry, deletes allowed); returns ADDRESS (host:port).

    Whatever already answers /v2/ there is reused, ours or not.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ServestackError(f"registry address {address!r}: expected HOST:PORT, e.g. {DEFAULT_REGISTRY}")
    if registry_answers(address):
        return address
    binary = require("docker-registry")
    with exclusive(f"registry-{port}"):
        if registry_answers(address):
            return address
        home = state_home() / "registry" / port
        storage = home / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = home / "config.yml"
        atomic_write_text(config, _registry_config(address, storage))
        log_path = home / "registry.log"
        proc = spawn_detached([binary, "serve", str(config)], log_path)
        wait_until(
            lambda: registry_answers(address),
            what=f"docker-registry on {address}",
            timeout=timeout,
            log_path=log_path,
            proc=proc,
        )
    return address


def ensure_tls_registry(address: str, home: Path, *, ca: Path, certificate: Path, key: Path, htpasswd: Path,
                        timeout: float = 30.0) -> Path:
    """Debian's docker-registry on ADDRESS behind TLS (CERTIFICATE/KEY, signed by CA) with htpasswd
    (bcrypt) logins, storage under HOME; what users publish to. Returns its pid file.

    Used by the publish tests: each gets its own, so one can be stopped halfway through a publish.
    """
    if registry_answers(address, ca=ca):
        return home / "registry.pid"
    binary = require("docker-registry")
    with exclusive(f"tls-registry-{address.rpartition(':')[2]}"):
        if registry_answers(address, ca=ca):
            return home / "registry.pid"
        storage = home / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = home / "config.yml"
        tls = (f"  tls:\n    certificate: {json.dumps(str(certificate))}\n    key: {json.dumps(str(key))}\n")
        auth = f"auth:\n  htpasswd:\n    realm: servestack\n    path: {json.dumps(str(htpasswd))}\n"
        atomic_write_text(config, _registry_config(address, storage, tls, auth))
        log_path = home / "registry.log"
        proc = spawn_detached([binary, "serve", str(config)], log_path)
        atomic_write_text(home / "registry.pid", f"{proc.pid}\n")
        wait_until(lambda: registry_answers(address, ca=ca), what=f"docker-registry (TLS) on {address}",
                   timeout=timeout, log_path=log_path, proc=proc)
    return home / "registry.pid"
