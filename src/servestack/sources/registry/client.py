"""The registry client: one registry and repository; transport (scheme, auth, retries), blobs, manifests, referrers.

Every operation is retried on connection errors, 429 and 5xx with backoff, then raises NetworkError
naming what was being done. Writes are idempotent by digest, so a retry redoes the whole operation.
Referrers: the OCI 1.1 referrers API when the registry serves it, otherwise the tag-schema fallback
(`sha256-<hex>`, an image index of referrers), updated read-modify-write and re-read after a settle
delay, so concurrent publishers never lose an entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import requests

from servestack.errors import NetworkError, Overflow, RegistryError, Stalled
from servestack.sources import http
from servestack.sources.registry import transfer
from servestack.sources.registry.limits import (
    BLOB_LIMIT,
    LAYER_LIMIT,
    MANIFEST_LIMIT,
    Body,
    content_length,
    read_bounded,
)
from servestack.sources.registry.model import DIGEST, MANIFEST_TYPES, OCI_INDEX, Descriptor, Reference, sha256_digest
from servestack.sources.registry.trust import basic_credentials, ca_file, certs_d, loopback
from servestack.util.console import console

T = TypeVar("T")


class _Counting:
    """A file object that reports how many bytes were read from it (upload progress)."""

    def __init__(self, f: Any, on_bytes: Callable[[int], None] | None):
        self.f, self.on_bytes = f, on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n if n and n > 0 else 1 << 20)
        if data and self.on_bytes:
            self.on_bytes(len(data))
        return data



_SCHEMES: dict[tuple[str, str], str] = {}  # (loopback registry, CA) -> the scheme it answered on


class _Retry(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Client:
    """One registry, one repository. Operations retry, then raise NetworkError naming what failed."""

    def __init__(self, registry: str, repository: str, *, retries: int = 4, backoff: float = 0.5, timeout: float = 60):
        self.registry = registry
        self.repository = repository
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = http.USER_AGENT
        if loopback(registry):
            self.session.trust_env = False  # never through an HTTP(S)_PROXY to loopback
        ca = ca_file(registry)
        if ca is not None:
            self.session.verify = str(ca)
        self._scheme: str | None = None
        self._authorization: str | None = None

    @classmethod
    def for_reference(cls, reference: str, **kwargs: Any) -> Client:
        ref = Reference.parse(reference)
        return cls(ref.registry, ref.repository, **kwargs)

    # ----------------------------------------------------------------- transport

    @property
    def base_url(self) -> str:
        if self._scheme is None:
            key = (self.registry, str(self.session.verify))
            self._scheme = _SCHEMES.get(key) or "https"
            if loopback(self.registry) and key not in _SCHEMES:
                try:
                    self.session.get(f"https://{self.registry}/v2/", timeout=transfer.timeout(5))
                    _SCHEMES[key] = "https"
                except requests.exceptions.SSLError as exc:
                    if "CERTIFICATE_VERIFY_FAILED" in str(exc):  # it speaks TLS, with a certificate we cannot check
                        raise RegistryError(f"registry {self.registry} serves TLS with a certificate this machine does "
                                            f"not trust ({_short(exc)[-120:]}); put its CA in "
                                            f"{certs_d() / self.registry / 'ca.crt'}") from None
                    self._scheme = _SCHEMES[key] = "http"  # a plain-HTTP loopback registry, as Docker allows
                except requests.RequestException:
                    pass  # unreachable: keep https, the operation's retries will report it
        return f"{self._scheme}://{self.registry}"

    def _url(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.base_url}/v2/{self.repository}/{path}"

    def _authenticate(self, challenge: str) -> None:
        basic = basic_credentials(self.registry)
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic":
            if basic is None:
                raise RegistryError(f"registry {self.registry} wants a login and no credentials are stored for it "
                                    f"(REGISTRY_AUTH_FILE or Docker's config.json `auths`)")
            self._authorization = f"Basic {basic}"
            return
        if scheme != "bearer":
            raise RegistryError(f"registry {self.registry}: unsupported auth challenge {challenge.split(' ', 1)[0]!r}")
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise RegistryError(f"registry {self.registry}: malformed auth challenge")
        headers = {"Authorization": f"Basic {basic}"} if basic else {}
        response = http.get(self.session, realm, what=f"token for {self.registry}", params=params, headers=headers)
        if response.status_code != 200:
            raise RegistryError(f"registry {self.registry}: token request refused (HTTP {response.status_code})")
        body = response.json()
        self._authorization = f"Bearer {body.get('token') or body['access_token']}"

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One request, authenticating once on a 401; transient failures raise _Retry."""
        for _ in range(2):
            headers = dict(kwargs.pop("headers", None) or {})
            if self._authorization:
                headers["Authorization"] = self._authorization
            transfer.check(f"{method} {path[:120]}")
            try:
                response = self.session.request(method, self._url(path), headers=headers,
                                                timeout=transfer.timeout(self.timeout),
                                                allow_redirects=method in ("GET", "HEAD"), **kwargs)
            except requests.exceptions.SSLError as exc:
                raise RegistryError(f"registry {self.registry}: TLS verification failed ({_short(exc)}); put its CA "
                                    f"in {certs_d() / self.registry / 'ca.crt'}") from None
            except requests.RequestException as exc:
                if transfer.is_stall(exc):
                    raise Stalled(f"{method} {self._url(path)}: no answer within {transfer.STALL_SECONDS:g} s "
                                           f"({type(exc).__name__})") from None
                raise _Retry(f"{type(exc).__name__}: {_short(exc)}") from None
            if response.status_code == 400 and self._scheme == "http" and "HTTPS" in response.text[:300]:
                raise RegistryError(f"registry {self.registry} speaks TLS only, and this machine has no CA for it: put "
                                    f"its CA in {certs_d() / self.registry / 'ca.crt'}")
            kwargs["headers"] = {k: v for k, v in headers.items() if k != "Authorization"}
            if response.status_code == 401 and "WWW-Authenticate" in response.headers and not self._authorization:
                self._authenticate(response.headers["WWW-Authenticate"])
                continue
            if response.status_code == 401:
                raise RegistryError(f"registry {self.registry}: credentials refused (HTTP 401)")
            if response.status_code == 429 or response.status_code >= 500:
                raise _Retry(f"HTTP {response.status_code}")
            return response
        raise RegistryError(f"registry {self.registry}: authentication did not succeed")

    def _with_retries(self, what: str, operation: Callable[[], T]) -> T:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                try:
                    return operation()
                except _Retry as retry:
                    if attempt == self.retries:
                        raise NetworkError(f"{what}: could not reach registry {self.registry} after {attempt + 1} "
                                           f"attempts (last: {retry.reason})") from None
                    console.detail("servestack.registry", f"{what}: {retry.reason}; retrying in {delay:.1f} s")
                    transfer.pause(delay, what)
                    delay *= 2
            except Stalled as stalled:
                raise NetworkError(f"{what}: registry {self.registry} stalled: {stalled}") from None
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------- blobs

    def has_blob(self, digest: str) -> bool:
        return self._with_retries(f"check blob {digest[:19]}", lambda: self._send("HEAD", f"blobs/{digest}").status_code == 200)

    def get_blob(self, digest: str, *, size: int | None = None, limit: int = BLOB_LIMIT) -> bytes:
        """A blob read into memory: at most its declared SIZE when known, else LIMIT bytes, checked
        against its digest."""
        def get() -> Body:
            with self._send("GET", f"blobs/{digest}", stream=True) as response:
                if response.status_code == 404:
                    raise RegistryError(f"{self.registry}/{self.repository}: blob {digest} is missing (HTTP 404)")
                if response.status_code != 200:
                    raise RegistryError(f"{self.registry}/{self.repository}: blob {digest}: HTTP {response.status_code}")
                return self._bounded(response, min(limit, size) if size is not None else limit, f"blob {digest}")

        body = self._with_retries(f"download blob {digest[:19]}", get)
        if body.digest != digest:
            raise RegistryError(f"{self.registry}/{self.repository}: blob {digest} does not match its digest "
                                f"(the registry served content hashing to {body.digest})")
        if size is not None and len(body.data) != size:
            raise RegistryError(f"{self.registry}/{self.repository}: blob {digest} is {len(body.data)} bytes, its "
                                f"descriptor says {size}")
        return body.data

    def _bounded(self, response: requests.Response, limit: int, what: str) -> Body:
        """The response's body, streamed and cut off past LIMIT bytes (a Content-Length above it is
        refused before reading anything)."""
        where = f"{self.registry}/{self.repository}: {what}"
        declared = content_length(response.headers)
        if declared is not None and declared > limit:
            raise RegistryError(f"{where}: the registry announces {declared} bytes, more than the {limit} read for it")
        try:
            return read_bounded(transfer.chunks(response, f"GET {response.url}"), limit)
        except Overflow as exc:
            raise RegistryError(f"{where}: the registry sent {exc}; not read further") from None
        except requests.RequestException as exc:
            raise _Retry(f"{type(exc).__name__}: {_short(exc)}") from None

    def push_blob(self, data: bytes) -> str:
        """Upload DATA unless the registry has it; returns its digest."""
        digest = sha256_digest(data)
        self._upload(digest, lambda: data, len(data))
        return digest

    def push_blob_file(self, path: Path, digest: str, on_bytes: Callable[[int], None] | None = None) -> None:
        """Upload a large blob streamed from PATH under DIGEST (the registry checks the bytes)."""
        size = path.stat().st_size
        with open(path, "rb") as f:
            def body() -> _Counting:
                f.seek(0)
                return _Counting(f, on_bytes)

            self._upload(digest, body, size, check_first=False)

    def _upload(self, digest: str, body: Callable[[], Any], size: int, *, check_first: bool = True) -> None:
        """Monolithic POST + PUT, retried whole; BODY gives the bytes afresh for each attempt."""
        def push() -> None:
            if check_first and self._send("HEAD", f"blobs/{digest}").status_code == 200:
                return
            start = self._send("POST", "blobs/uploads/")
            if start.status_code != 202:
                raise RegistryError(f"{self.registry}/{self.repository}: upload refused (HTTP {start.status_code}: "
                                    f"{start.text[:200]})")
            location = start.headers["Location"]
            if location.startswith("/"):
                location = f"{self.base_url}{location}"
            sep = "&" if "?" in location else "?"
            done = self._send("PUT", f"{location}{sep}digest={digest}", data=body(),
                              headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
            if done.status_code != 201:
                raise RegistryError(f"{self.registry}/{self.repository}: upload of {digest} refused "
                                    f"(HTTP {done.status_code}: {done.text[:200]})")

        self._with_retries(f"upload blob {digest[:19]} ({size} bytes)", push)

    def mount_blob(self, digest: str, source_repository: str) -> bool:
        """Cross-repository mount: the registry links a blob it already holds; no bytes move."""
        def mount() -> bool:
            response = self._send("POST", f"blobs/uploads/?mount={digest}&from={source_repository}")
            return response.status_code == 201  # 202: not mountable, an upload was opened; left to expire

        return self._with_retries(f"mount blob {digest[:19]}", mount)

    def download_blob(self, digest: str, dest: Path, *, size: int | None = None) -> None:
        """Stream a blob to DEST (atomically), checking it hashes to its digest and is no longer than its
        declared SIZE (when given) or the layer ceiling."""
        limit = min(size, LAYER_LIMIT) if size is not None else LAYER_LIMIT

        def download() -> None:
            response = self._send("GET", f"blobs/{digest}", stream=True)
            with response:
                if response.status_code != 200:
                    raise RegistryError(f"{self.registry}/{self.repository}: blob {digest}: HTTP {response.status_code}")
                written = 0
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(dest.name + f".part{os.getpid()}")
                h = hashlib.sha256()
                try:
                    with open(tmp, "wb") as out:
                        try:
                            for chunk in transfer.chunks(response, f"GET {response.url}"):
                                written += len(chunk)
                                if written > limit:
                                    raise RegistryError(f"{self.registry}/{self.repository}: blob {digest}: the "
                                                        f"registry sent more than {limit} bytes; not read further")
                                h.update(chunk)
                                out.write(chunk)
                        except requests.RequestException as exc:
                            raise _Retry(f"{type(exc).__name__}: {_short(exc)}") from None
                    if f"sha256:{h.hexdigest()}" != digest:
                        raise RegistryError(f"{self.registry}/{self.repository}: blob {digest} does not hash to its digest")
                    os.replace(tmp, dest)
                finally:
                    tmp.unlink(missing_ok=True)

        self._with_retries(f"download blob {digest[:19]}", download)

    # ----------------------------------------------------------------- manifests

    def get_manifest(self, ref: str, what: str | None = None, *, limit: int = MANIFEST_LIMIT
                     ) -> tuple[bytes, str] | None:
        """(bytes, media type) of the manifest at a tag or digest, or None when there is none.

        A digest reference is checked against the bytes served; at most LIMIT bytes are read."""
        def get() -> tuple[Body, str] | None:
            with self._send("GET", f"manifests/{ref}", headers={"Accept": MANIFEST_TYPES}, stream=True) as response:
                if response.status_code == 404:
                    return None
                if response.status_code != 200:
                    raise RegistryError(f"{self.registry}/{self.repository}:{ref}: HTTP {response.status_code}")
                return (self._bounded(response, limit, f"manifest {ref[:80]}"),
                        response.headers.get("Content-Type", "").split(";")[0])

        found = self._with_retries(what or f"read manifest {self.repository}@{ref[:19]}", get)
        if found and DIGEST.match(ref) and found[0].digest != ref:
            raise RegistryError(f"{self.registry}/{self.repository}: manifest {ref} does not match its digest")
        return (found[0].data, found[1]) if found else None

    def has_manifest(self, ref: str) -> bool:
        return self._with_retries(f"check manifest {ref[:19]}", lambda: self._send(
            "HEAD", f"manifests/{ref}", headers={"Accept": MANIFEST_TYPES}).status_code == 200)

    def put_manifest(self, ref: str, data: bytes, media_type: str) -> requests.structures.CaseInsensitiveDict:
        """Store a manifest at a tag or its digest; returns the response headers (OCI-Subject, ...)."""
        def put() -> requests.structures.CaseInsensitiveDict:
            response = self._send("PUT", f"manifests/{ref}", data=data, headers={"Content-Type": media_type})
            if response.status_code != 201:
                raise RegistryError(f"{self.registry}/{self.repository}: manifest {ref[:19]} refused "
                                    f"(HTTP {response.status_code}: {response.text[:300]})")
            served = response.headers.get("Docker-Content-Digest")
            if served and served != sha256_digest(data):
                raise RegistryError(f"{self.registry}/{self.repository}: stored the manifest as {served}, "
                                    f"expected {sha256_digest(data)}")
            return response.headers

        return self._with_retries(f"write manifest {self.repository}:{ref[:19]}", put)

    def delete_blob(self, digest: str) -> None:
        self._with_retries(f"delete blob {digest[:19]}", lambda: self._send("DELETE", f"blobs/{digest}"))

    def delete_manifest(self, digest: str) -> None:
        self._with_retries(f"delete manifest {digest[:19]}", lambda: self._send("DELETE", f"manifests/{digest}"))

    # ----------------------------------------------------------------- referrers

    def referrers(self, subject: str) -> tuple[list[Descriptor], str]:
        """The manifests whose subject is SUBJECT, and where they were found ("api" or "tag")."""
        def api() -> Body | None:
            with self._send("GET", f"referrers/{subject}", headers={"Accept": OCI_INDEX}, stream=True) as response:
                if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(OCI_INDEX):
                    return self._bounded(response, MANIFEST_LIMIT, f"referrers of {subject}")
                return None

        body = self._with_retries(f"list referrers of {subject[:19]}", api)
        if body is not None:
            return self._descriptors(body.data, f"referrers of {subject}"), "api"
        return self._fallback_index(subject)[0], "tag"

    def _descriptors(self, data: bytes, what: str) -> list[Descriptor]:
        try:
            return [Descriptor.from_json(m) for m in json.loads(data).get("manifests", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RegistryError(f"{self.registry}/{self.repository}: {what}: not a referrers index "
                                f"({_short(exc)})") from None

    @staticmethod
    def fallback_tag(subject: str) -> str:
        return subject.replace(":", "-")

    def _fallback_index(self, subject: str) -> tuple[list[Descriptor], str | None]:
        found = self.get_manifest(self.fallback_tag(subject))
        if found is None:
            return [], None
        return self._descriptors(found[0], self.fallback_tag(subject)), sha256_digest(found[0])

    def add_referrer(self, subject: str, referrer: Descriptor, headers: Any, *, settle: float = 0.3,
                     attempts: int = 12) -> str:
        """Make REFERRER discoverable from SUBJECT; returns "api" or "tag".

        When the manifest push was answered with `OCI-Subject`, the registry indexes it itself.
        Otherwise the fallback index is read, extended and written; registries offer no
        compare-and-swap on tags, so the write is re-read after a short settle delay and redone
        while another publisher's concurrent write has dropped our entry (theirs is kept too:
        every round merges what is there)."""
        if headers.get("OCI-Subject") == subject:
            return "api"
        tag = self.fallback_tag(subject)
        for attempt in range(attempts):
            entries, before = self._fallback_index(subject)
            if any(e.digest == referrer.digest for e in entries):
                if attempt:
                    return "tag"
            else:
                merged = sorted([*entries, referrer], key=lambda e: e.digest)
                index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                    "manifests": [e.to_json() for e in merged]}, sort_keys=True).encode()
                # Narrow the lost-update window: give up this round if the tag moved since we read it.
                if self._fallback_index(subject)[1] == before:
                    self.put_manifest(tag, index, OCI_INDEX)
            time.sleep(settle + random.uniform(0, settle))
            if any(e.digest == referrer.digest for e in self._fallback_index(subject)[0]):
                # Still there after the settle delay: any racing writer read it before writing.
                return "tag"
            console.detail("servestack.registry", f"referrers index {tag} lost entry {referrer.digest[:19]} to a concurrent write; "
                          "merging again")
        raise RegistryError(f"{self.registry}/{self.repository}:{tag}: could not add {referrer.digest} to the "
                            f"referrers index after {attempts} rounds of concurrent updates")


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."
