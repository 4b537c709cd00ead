"""Publish an image with its recipes, lock and results as one signed OCI bundle; pull and verify it by digest.

    publish(project, "dev-cpu", key=Path("servestack.key"))           # -> build/dev-cpu/publish.json
    pull("reg/servestack/dev-cpu@sha256:...", key=Path("servestack.pub"), out=Path("dev-cpu"))
    verify_rebuild(project, "reg/servestack/dev-cpu@sha256:...")

The bundle is an OCI 1.1 artifact manifest whose `subject` is the image: the empty config, one
layer per file (titled with its path: the recipes bound to the digest, the lock, the stack file,
the build/image/smoke records, a run's results). Its signature is a second referrer of the image:
an in-toto v1 statement (subjects: the image, the bundle manifest, every file; predicate: SLSA
provenance v1) in a DSSE envelope. Everything in the bundle derives from its inputs and the
lock's SOURCE_DATE_EPOCH, so the same inputs give the same bundle digest.

Planning (the files, the manifests, the statement) returns data; `publish` and `pull` do the I/O.

The package reads as the flow: bundle (what is published, planned as data), provenance (the signed
statement), push (`publish`), fetch (`pull`: verify, check the image, write), rebuild (`verify --rebuild`).
"""

from servestack.publish.bundle import (
    PUBLICATION_TYPE,
    BundleFile,
    Records,
    check_smoke,
    created_timestamp,
    publication_manifest,
)
from servestack.publish.fetch import STACK_JSON, pull
from servestack.publish.provenance import PROVENANCE_V1, Source, provenance
from servestack.publish.push import publish
from servestack.publish.rebuild import verify_rebuild

__all__ = [
    "PROVENANCE_V1", "PUBLICATION_TYPE", "STACK_JSON", "BundleFile", "Records", "Source", "check_smoke",
    "created_timestamp", "provenance", "publication_manifest", "publish", "pull", "verify_rebuild",
]
