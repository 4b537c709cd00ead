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
already signed for the same payload is not added again. A damaged tag (not a manifest, or a layer
whose blob the registry lost) is reported and rewritten without what is gone, never fatal: the
registry refuses a manifest naming a missing blob, and the publication must still be completed.

cosign 3 reads Sigstore bundles among the image's referrers instead (cosign's specs/BUNDLE_SPEC.md):
one manifest per bundle, artifactType and its one layer `application/vnd.dev.sigstore.bundle.v0.3+json`,
the empty config, the image as subject, annotated `dev.sigstore.bundle.content: dsse-envelope` and
`dev.sigstore.bundle.predicateType`. Each bundle holds a DSSE envelope and the key's hint (base64 of
the SHA-256 of its SubjectPublicKeyInfo, as cosign writes it), no transparency log entry. The image
signature is what `cosign sign` writes in that format: an in-toto statement of predicate type
`https://sigstore.dev/cosign/sign/v1` over the image digest; the provenance and the SBOM are the
same statements as at the .att tag. The envelope's signature has an empty `keyid`: the verifier cosign
uses skips a signature whose non-empty keyid is not its own fingerprint, and securesystemslib writes
another one (its own key id; the signature does not cover the keyid).
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import CryptoSigner, Signature

from servestack.errors import ServestackError, SignatureError
from servestack.publish import signing
from servestack.publish.bundle import CREATED, referrer_manifest
from servestack.publish.provenance import signed_identity
from servestack.records.imageref import ImageRef
from servestack.sources.registry import EMPTY_JSON, OCI_MANIFEST, Client, Descriptor, sha256_digest

SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
COSIGN_SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
BUNDLE_CONTENT = "dev.sigstore.bundle.content"
BUNDLE_PREDICATE_TYPE = "dev.sigstore.bundle.predicateType"
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


def _layers(client: Client, tag: str, damaged: list[str]) -> list[dict[str, Any]]:
    """The tag's layers whose blobs the registry still has; what is not is said in DAMAGED."""
    try:
        found = client.get_manifest(tag)
        layers = list(json.loads(found[0]).get("layers") or []) if found else []
    except (ServestackError, ValueError, TypeError, AttributeError) as exc:
        damaged.append(f"{tag}: not a readable manifest ({str(exc)[:200]}); written afresh")
        return []
    kept = []
    for layer in layers:
        digest = layer.get("digest") if isinstance(layer, dict) else None
        if isinstance(digest, str) and client.has_blob(digest):
            kept.append(layer)
        else:
            damaged.append(f"{tag}: layer {str(digest)[:80]} is missing from the registry; left out")
    return kept


def _put(client: Client, tag: str, layers: list[dict[str, Any]]) -> None:
    config = json.dumps({"architecture": "", "created": "0001-01-01T00:00:00Z",
                         "history": [{"created": "0001-01-01T00:00:00Z"}], "os": "",
                         "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
                         "config": {}}, separators=(",", ":")).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": IMAGE_CONFIG, "size": len(config), "digest": client.push_blob(config)},
                           "layers": layers}, separators=(",", ":")).encode()
    client.put_manifest(tag, manifest, OCI_MANIFEST)


def attach(client: Client, image: ImageRef, subject: Descriptor, signer: CryptoSigner,
           attestations: list[tuple[bytes, str]]) -> dict[str, Any]:
    """Sign IMAGE (whose descriptor is SUBJECT) and attach each (DSSE envelope, predicate type) as its
    attestation, in both of cosign's layouts; returns the two tags and the bundles' references."""
    payload = simple_signing_payload(image)
    damaged: list[str] = []
    layers = _layers(client, signature_tag(image), damaged)
    mine = [layer for layer in layers if layer.get("digest") == sha256_digest(payload)
            and _signed_by(signer, payload, (layer.get("annotations") or {}).get(SIGNATURE, ""))]
    if not mine:
        signature = base64.b64encode(bytes.fromhex(signer.sign(payload).signature)).decode()
        layers.append({"mediaType": SIMPLE_SIGNING, "size": len(payload), "digest": client.push_blob(payload),
                       "annotations": {SIGNATURE: signature}})
    if not mine or damaged:
        _put(client, signature_tag(image), layers)

    before = len(damaged)
    layers = _layers(client, attestation_tag(image), damaged)
    added = len(damaged) > before
    for envelope, predicate_type in attestations:
        statement = json.loads(envelope)["payload"]
        if not any(_same_statement(client, layer, statement, signer) for layer in layers):
            layers.append({"mediaType": DSSE_LAYER, "size": len(envelope), "digest": client.push_blob(envelope),
                           "annotations": {SIGNATURE: "", PREDICATE_TYPE: predicate_type}})
            added = True
    if added:
        _put(client, attestation_tag(image), layers)
    sign = signing.sign_statement(signing.statement([signing.Subject(name=signed_identity(image), sha256=image.hex)],
                                                    COSIGN_SIGN_PREDICATE, {}), signer)
    signed = _bundled_statements(client, image, signer)
    bundles = [signed.get(json.loads(e)["payload"]) or attach_bundle(client, image, subject, signer, e, t)
               for e, t in [(sign, COSIGN_SIGN_PREDICATE), *attestations]]
    return {"signature": f"{image.name}:{signature_tag(image)}", "attestation": f"{image.name}:{attestation_tag(image)}",
            "bundles": [f"{image.name}@{digest}" for digest in bundles], "damaged": damaged}


def key_hint(signer: CryptoSigner) -> str:
    pem = signer.public_key.keyval["public"].encode()
    der = serialization.load_pem_public_key(pem).public_bytes(serialization.Encoding.DER,
                                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def sigstore_bundle(envelope: bytes, signer: CryptoSigner) -> bytes:
    """ENVELOPE as a Sigstore bundle v0.3 verified by the key alone (protobuf-specs' JSON form)."""
    dsse = json.loads(envelope)
    return json.dumps({
        "mediaType": SIGSTORE_BUNDLE,
        "verificationMaterial": {"publicKey": {"hint": key_hint(signer)}, "tlogEntries": [],
                                 "timestampVerificationData": {}},
        "dsseEnvelope": {"payload": dsse["payload"], "payloadType": dsse["payloadType"],
                         "signatures": [{"sig": dsse["signatures"][0]["sig"], "keyid": ""}]},
    }, sort_keys=True, separators=(",", ":")).encode()


def attach_bundle(client: Client, image: ImageRef, subject: Descriptor, signer: CryptoSigner, envelope: bytes,
                  predicate_type: str) -> str:
    """ENVELOPE as a Sigstore bundle referrer of IMAGE; returns the bundle manifest's digest."""
    bundle = sigstore_bundle(envelope, signer)
    client.push_blob(EMPTY_JSON)
    layer = {"mediaType": SIGSTORE_BUNDLE, "digest": client.push_blob(bundle), "size": len(bundle)}
    annotations = {BUNDLE_CONTENT: "dsse-envelope", BUNDLE_PREDICATE_TYPE: predicate_type,
                   CREATED: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    manifest = referrer_manifest(SIGSTORE_BUNDLE, [layer], subject, annotations)
    digest = sha256_digest(manifest)
    headers = client.put_manifest(digest, manifest, OCI_MANIFEST)
    client.add_referrer(image.digest, Descriptor(media_type=OCI_MANIFEST, digest=digest, size=len(manifest), artifact_type=SIGSTORE_BUNDLE,
                                                 annotations=tuple(sorted(annotations.items()))), headers)
    return digest


def _bundled_statements(client: Client, image: ImageRef, signer: CryptoSigner) -> dict[str, str]:
    """{statement payload: bundle manifest digest} of the image's Sigstore bundles this key signed,
    read once for all the statements a publish attaches."""
    found: dict[str, str] = {}
    for r in client.referrers(image.digest)[0]:
        if r.artifact_type != SIGSTORE_BUNDLE:
            continue
        try:
            manifest = client.get_manifest(r.digest)
            if manifest is None:
                continue
            layer = json.loads(manifest[0])["layers"][0]
            dsse = json.loads(client.get_blob(layer["digest"]))["dsseEnvelope"]
        except (ServestackError, ValueError, KeyError, TypeError, IndexError):
            continue
        if _signed_envelope(json.dumps(dsse).encode(), signer, f"bundle {r.digest}"):
            found.setdefault(dsse["payload"], r.digest)
    return found


def _signed_envelope(data: bytes, signer: CryptoSigner, what: str) -> bool:
    try:
        signing.verify_envelope(data, signer.public_key, what)
        return True
    except SignatureError:
        return False


def _same_statement(client: Client, layer: dict[str, Any], statement: str, signer: CryptoSigner) -> bool:
    """Whether an attestation layer already carries this statement, signed by this key."""
    if layer.get("mediaType") != DSSE_LAYER:
        return False
    try:
        data = client.get_blob(layer["digest"])
        if json.loads(data).get("payload") != statement:
            return False
    except (ServestackError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return _signed_envelope(data, signer, f"attestation layer {layer['digest']}")
