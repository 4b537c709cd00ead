"""Resolving an image reference to a digest through the OCI distribution HTTP API.

Anonymous access and the bearer-token flow of the distribution spec (401 with a
`WWW-Authenticate: Bearer realm=...` challenge) are supported; plain HTTP is used for loopback
registries, as Docker itself does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import requests

from ..errors import ServestackError
from . import http

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> "Reference":
        rest, _, digest = text.partition("@")
        if digest and not DIGEST.match(digest):
            raise ValueError(f"{text!r}: digest must be sha256:<64 hex>")
        first, _, remainder = rest.partition("/")
        if remainder and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
        else:
            registry, path = "registry-1.docker.io", rest
            if "/" not in path:
                path = f"library/{path}"
        repository, _, tag = path.partition(":")
        if not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*", repository):
            raise ValueError(f"{text!r}: {repository!r} is not a valid repository name")
        return cls(registry, repository, tag or (None if digest else "latest"), digest or None)

    @property
    def base_url(self) -> str:
        host = self.registry.split(":")[0]
        scheme = "http" if host in ("localhost",) or host.startswith("127.") else "https"
        return f"{scheme}://{self.registry}"

    def with_digest(self, digest: str) -> str:
        return f"{self.registry}/{self.repository}@{digest}"


def _basic_credentials(registry: str) -> str | None:
    config = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(config.read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    entry = auths.get(registry) or auths.get(f"https://{registry}")
    return entry.get("auth") if entry else None


def _bearer_token(s: requests.Session, challenge: str, registry: str) -> str:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        raise ServestackError(f"registry {registry}: malformed auth challenge {challenge!r}")
    headers = {}
    basic = _basic_credentials(registry)
    if basic:
        headers["Authorization"] = f"Basic {basic}"
    response = http.get(s, realm, what=f"token for {registry}", params=params, headers=headers)
    if response.status_code != 200:
        raise ServestackError(f"registry {registry}: token request refused (HTTP {response.status_code})")
    body = response.json()
    return body.get("token") or body["access_token"]


def resolve_digest(reference: str, retries: int = 4) -> str:
    """The digest the registry serves for `reference` (a tag, or a digest that is then checked)."""
    ref = Reference.parse(reference)
    s = http.session(retries=retries)
    url = f"{ref.base_url}/v2/{ref.repository}/manifests/{ref.digest or ref.tag}"
    headers = {"Accept": MANIFEST_TYPES}
    what = f"image {reference}"
    response = http.get(s, url, what=what, headers=headers)
    if response.status_code == 401:
        challenge = response.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("bearer"):
            headers["Authorization"] = f"Bearer {_bearer_token(s, challenge, ref.registry)}"
        elif (basic := _basic_credentials(ref.registry)) is not None:
            headers["Authorization"] = f"Basic {basic}"
        response = http.get(s, url, what=what, headers=headers)
    if response.status_code == 404:
        raise ServestackError(f"{what}: not found in {ref.registry} (HTTP 404)")
    if response.status_code != 200:
        raise ServestackError(f"{what}: registry {ref.registry} answered HTTP {response.status_code}")
    digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    served = response.headers.get("Docker-Content-Digest")
    if served and served != digest:
        raise ServestackError(f"{what}: registry says {served} but the manifest hashes to {digest}")
    if ref.digest and ref.digest != digest:
        raise ServestackError(f"{what}: the registry serves {digest} for that digest reference")
    return digest


