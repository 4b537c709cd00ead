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




# --------------------------------------------------------------------------- pushing (distribution spec)
# Anonymous only: the loopback registry the project starts, or any registry that takes pushes
# without credentials. Every upload is verified by the registry against the digest it is sent under.


class _Counting:
    """A file object that reports how many bytes were read from it (upload progress)."""

    def __init__(self, f, on_bytes):
        self.f, self.on_bytes = f, on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n if n and n > 0 else 1 << 20)
        if data and self.on_bytes:
            self.on_bytes(len(data))
        return data


def _base(address: str) -> str:
    return Reference(address, "x", None, None).base_url


def blob_exists(address: str, repository: str, digest: str) -> bool:
    response = http.session().head(f"{_base(address)}/v2/{repository}/blobs/{digest}", timeout=30)
    return response.status_code == 200


def mount_blob(address: str, repository: str, digest: str, source_repository: str) -> bool:
    """Cross-repository mount: the registry links a blob it already holds; no bytes move."""
    response = requests.post(f"{_base(address)}/v2/{repository}/blobs/uploads/",
                             params={"mount": digest, "from": source_repository}, timeout=60)
    if response.status_code == 202:  # not mountable: an upload was opened instead; leave it to expire
        return False
    return response.status_code == 201


def push_blob(address: str, repository: str, digest: str, path: Path, on_bytes=None) -> None:
    """Upload one blob (one monolithic PUT, streamed from `path`)."""
    base = _base(address)
    start = requests.post(f"{base}/v2/{repository}/blobs/uploads/", timeout=60)
    if start.status_code != 202:
        raise ServestackError(f"registry {address}: cannot start an upload to {repository} (HTTP {start.status_code})")
    location = start.headers["Location"]
    if location.startswith("/"):
        location = base + location
    with open(path, "rb") as f:
        response = requests.put(location, params={"digest": digest}, data=_Counting(f, on_bytes), timeout=3600,
                                headers={"Content-Type": "application/octet-stream",
                                         "Content-Length": str(path.stat().st_size)})
    if response.status_code != 201:
        raise ServestackError(f"registry {address}: upload of {digest} to {repository} refused "
                              f"(HTTP {response.status_code}: {response.text[:300]})")


def push_bytes(address: str, repository: str, digest: str, data: bytes) -> None:
    base = _base(address)
    start = requests.post(f"{base}/v2/{repository}/blobs/uploads/", timeout=60)
    location = start.headers.get("Location", "")
    if start.status_code != 202 or not location:
        raise ServestackError(f"registry {address}: cannot start an upload to {repository} (HTTP {start.status_code})")
    location = base + location if location.startswith("/") else location
    response = requests.put(location, params={"digest": digest}, data=data, timeout=300,
                            headers={"Content-Type": "application/octet-stream"})
    if response.status_code != 201:
        raise ServestackError(f"registry {address}: upload of {digest} refused (HTTP {response.status_code})")


def put_manifest(address: str, repository: str, reference: str, data: bytes, media_type: str) -> str:
    """Store a manifest under a tag or digest; returns the digest the registry computed."""
    response = requests.put(f"{_base(address)}/v2/{repository}/manifests/{reference}", data=data, timeout=60,
                            headers={"Content-Type": media_type})
    if response.status_code != 201:
        raise ServestackError(f"registry {address}: manifest for {repository}:{reference} refused "
                              f"(HTTP {response.status_code}: {response.text[:300]})")
    return response.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(data).hexdigest()


def get_manifest(address: str, repository: str, reference: str) -> tuple[bytes, str] | None:
    """A manifest's bytes and media type, or None when the registry does not have it."""
    response = http.get(http.session(), f"{_base(address)}/v2/{repository}/manifests/{reference}",
                        what=f"{address}/{repository}:{reference}", headers={"Accept": MANIFEST_TYPES})
    if response.status_code != 200:
        return None
    return response.content, response.headers.get("Content-Type", "")


def download_blob(address: str, repository: str, digest: str, dest: Path) -> None:
    """Stream a blob to `dest` (atomically), checking it hashes to its digest."""
    with http.get(http.session(), f"{_base(address)}/v2/{repository}/blobs/{digest}", what=f"blob {digest}",
                  stream=True, timeout=600) as response:
        if response.status_code != 200:
            raise ServestackError(f"registry {address}: blob {digest} of {repository}: HTTP {response.status_code}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".part{os.getpid()}")
        h = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for chunk in response.iter_content(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
            if f"sha256:{h.hexdigest()}" != digest:
                raise ServestackError(f"registry {address}: blob {digest} of {repository} does not hash to its digest")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def get_blob(address: str, repository: str, digest: str) -> bytes:
    """A small blob (a config) in memory, checked against its digest."""
    response = http.get(http.session(), f"{_base(address)}/v2/{repository}/blobs/{digest}", what=f"blob {digest}")
    if response.status_code != 200:
        raise ServestackError(f"registry {address}: blob {digest} of {repository}: HTTP {response.status_code}")
    if "sha256:" + hashlib.sha256(response.content).hexdigest() != digest:
        raise ServestackError(f"registry {address}: blob {digest} of {repository} does not hash to its digest")
    return response.content
