"""The image's signature and provenance where cosign 2 looks for them, so stock tools verify what we publish.

cosign 2 (Debian ships 2.5.0) finds an image's signatures at the tag `sha256-<hex>.sig` of its
repository and its attestations at `sha256-<hex>.att`: each an OCI image manifest whose layers
are one signature each (what `cosign sign` and `cosign attest` push, read from their output here):

  .sig  layer `application/vnd.dev.cosign.simplesigning.v1+json`: the "simple signing" payload
        naming the image's repository and manifest digest; annotation
        `dev.cosignproject.cosign/signature`: base64 of the ECDSA P-256 / SHA-256 DER signature.
  .att  layer `application/vnd.dsse.envelope.v1+json`: a DSSE envelope over the in-toto
        statement (ours: the SLSA v1 provenance the bundle's attestation carries), annotated with
        its `predicateType`: the SLSA v1 provenance, and the SBOM (`https://spdx.dev/Document`).

    cosign verify --key servestack.pub --insecure-ignore-tlog IMAGE@sha256:...
    cosign verify-attestation --key servestack.pub --insecure-ignore-tlog --type slsaprovenance1 IMAGE@sha256:...
    cosign verify-attestation --key servestack.pub --insecure-ignore-tlog --type spdxjson IMAGE@sha256:...

Both tags are read, amended and written back: other signers' layers stay, and a layer this key
already signed for the same payload is not added again.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import CryptoSigner, Signature

from .. import signing
from ..imageref import ImageRef
from ..sources.registry import OCI_MANIFEST, Client, sha256_digest

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
SIGNATURE = "dev.cosignproject.cosign/signature"
PREDICATE_TYPE = "predicateType"
IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"


def signature_tag(image: ImageRef) -> str:
    return f"sha256-{image.hex}.sig"


def attestation_tag(image: ImageRef) -> str:
    return f"sha256-{image.hex}.att"


def simple_signing_payload(image: ImageRef) -> bytes:
    return json.dumps({"critical": {"identity": {"docker-reference": image.name},
                                    "image": {"docker-manifest-digest": image.digest},
                                    "type": "cosign container image signature"},
                       "optional": None}, separators=(",", ":")).encode()


def _signed_by(signer: CryptoSigner, payload: bytes, signature_b64: str) -> bool:
    try:
        signer.public_key.verify_signature(Signature(signer.public_key.keyid, base64.b64decode(signature_b64).hex()),
                                           payload)
        return True
    except (UnverifiedSignatureError, ValueError):
        return False


def _layers(client: Client, tag: str) -> list[dict[str, Any]]:
    found = client.get_manifest(tag)
    if found is None:
        return []
    return list(json.loads(found[0]).get("layers") or [])


def _put(client: Client, tag: str, layers: list[dict[str, Any]]) -> None:
    config = json.dumps({"architecture": "", "created": "0001-01-01T00:00:00Z",
                         "history": [{"created": "0001-01-01T00:00:00Z"}], "os": "",
                         "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
                         "config": {}}, separators=(",", ":")).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": IMAGE_CONFIG, "size": len(config), "digest": client.push_blob(config)},
                           "layers": layers}, separators=(",", ":")).encode()
    client.put_manifest(tag, manifest, OCI_MANIFEST)


def attach(client: Client, image: ImageRef, signer: CryptoSigner,
           attestations: list[tuple[bytes, str]]) -> dict[str, str]:
    """Sign IMAGE in cosign's layout and attach each (DSSE envelope, predicate type) as its attestation;
    returns both tags."""
    payload = simple_signing_payload(image)
    layers = _layers(client, signature_tag(image))
    mine = [layer for layer in layers if layer.get("digest") == sha256_digest(payload)
            and _signed_by(signer, payload, (layer.get("annotations") or {}).get(SIGNATURE, ""))]
    if not mine:
        signature = base64.b64encode(bytes.fromhex(signer.sign(payload).signature)).decode()
        layers.append({"mediaType": SIMPLE_SIGNING, "size": len(payload), "digest": client.push_blob(payload),
                       "annotations": {SIGNATURE: signature}})
        _put(client, signature_tag(image), layers)

    layers = _layers(client, attestation_tag(image))
    added = False
    for envelope, predicate_type in attestations:
        statement = json.loads(envelope)["payload"]
        if not any(_same_statement(client, layer, statement, signer) for layer in layers):
            layers.append({"mediaType": DSSE_LAYER, "size": len(envelope), "digest": client.push_blob(envelope),
                           "annotations": {SIGNATURE: "", PREDICATE_TYPE: predicate_type}})
            added = True
    if added:
        _put(client, attestation_tag(image), layers)
    return {"signature": f"{image.name}:{signature_tag(image)}", "attestation": f"{image.name}:{attestation_tag(image)}"}


def _same_statement(client: Client, layer: dict[str, Any], statement: str, signer: CryptoSigner) -> bool:
    """Whether an attestation layer already carries this statement, signed by this key."""
    if layer.get("mediaType") != DSSE_LAYER:
        return False
    try:
        data = client.get_blob(layer["digest"])
        if json.loads(data).get("payload") != statement:
            return False
        signing.verify_envelope(data, signer.public_key, f"attestation layer {layer['digest']}")
        return True
    except (signing.SignatureError, ValueError, KeyError, TypeError, AttributeError):
        return False
