"""The OCI distribution HTTP API: resolve, read and write manifests and blobs, and referrers.

One client for every registry conversation (the lock resolving a base image, publish and pull):

- credentials the way users keep them: `REGISTRY_AUTH_FILE` (containers' auth.json), then
  Docker's `config.json` (`$DOCKER_CONFIG`, default ~/.docker); answered to a `Basic` challenge
  (htpasswd) or exchanged for a token on a `Bearer` challenge. Credentials are never logged and
  never part of an error message.
- TLS trusted through Docker's layout: `<certs.d>/<host:port>/ca.crt`, where certs.d is
  `$SERVESTACK_CERTS_D` (default /etc/docker/certs.d). Loopback registries are tried over HTTPS
  first and fall back to plain HTTP, as Docker does for 127.0.0.0/8.
- every operation is retried on connection errors, 429 and 5xx with backoff, then raises
  NetworkError naming what was being done. Writes are idempotent by digest, so a retry redoes the
  whole operation.
- referrers: the OCI 1.1 referrers API when the registry serves it, otherwise the tag-schema
  fallback (`sha256-<hex>`, an image index of referrers), updated read-modify-write and re-read
  after a settle delay, so concurrent publishers never lose an entry.

Layout: model (media types, digests, Reference, Descriptor), trust (credentials, CA files,
loopback), client (Client: transport, blobs, manifests, referrers), calls (resolve_digest and
one-call operations).
"""

from servestack.sources.registry.calls import (
    blob_exists,
    download_blob,
    get_blob,
    get_manifest,
    mount_blob,
    push_blob,
    push_bytes,
    put_manifest,
    resolve_digest,
)
from servestack.sources.registry.client import Client
from servestack.sources.registry.model import (
    DIGEST,
    EMPTY_JSON,
    MANIFEST_TYPES,
    OCI_EMPTY,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    Reference,
    sha256_digest,
)
from servestack.sources.registry.trust import auth_files, basic_credentials, ca_file, certs_d

__all__ = [
    "DIGEST", "EMPTY_JSON", "MANIFEST_TYPES", "OCI_EMPTY", "OCI_INDEX", "OCI_MANIFEST", "Client", "Descriptor",
    "Reference", "auth_files", "basic_credentials", "blob_exists", "ca_file", "certs_d",
    "download_blob", "get_blob", "get_manifest", "mount_blob", "push_blob", "push_bytes", "put_manifest",
    "resolve_digest", "sha256_digest",
]
