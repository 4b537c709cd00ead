"""Signing and verifying in-toto statements in DSSE envelopes with a local ECDSA P-256 key.

Keys are PEM files: the private key PKCS#8 (mode 0600, optionally encrypted with the password in
`$SERVESTACK_KEY_PASSWORD`), the public key SubjectPublicKeyInfo, which is also what
`cosign verify-blob-attestation --key` reads. The private key's bytes and its password are never
logged, never part of an error and never written anywhere but the key file.

Verification does not match key ids: cosign writes envelopes with an empty `keyid`, and the key
the user names on the command line is the only one that counts anyway.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import CryptoSigner, Signature, SSlibKey

from servestack import settings
from servestack.errors import InputError, SignatureError
from servestack.util.fsutil import atomic_write_bytes

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SCHEME = "ecdsa-sha2-nistp256"


def _password() -> bytes | None:
    value = settings.value("SERVESTACK_KEY_PASSWORD")
    return value.encode() if value else None


def keygen(private_path: Path, public_path: Path | None = None) -> tuple[Path, Path]:
    """A new ECDSA P-256 key pair; refuses to overwrite an existing private key."""
    public_path = public_path or private_path.with_suffix(".pub")
    if private_path.exists():
        raise InputError(private_path, "", "a key already exists here; remove it or choose another path")
    key = ec.generate_private_key(ec.SECP256R1())
    password = _password()
    encryption = (serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    atomic_write_bytes(public_path, public_pem)
    return private_path, public_path


def key_permission_problem(path: Path) -> str | None:
    """A warning, as ssh gives one, when others than its owner may read or write the private key."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"WARNING: UNPROTECTED PRIVATE KEY FILE: permissions {mode:04o} for {path} are too open; anyone who can "
            f"read it can publish as you (chmod 600 {path})")


def load_signer(path: Path) -> CryptoSigner:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "", f"cannot read the private key ({exc.strerror})") from None
    try:
        key = serialization.load_pem_private_key(data, password=_password())
    except (ValueError, TypeError):
        # Never echo the parser's message: it could quote key material.
        raise InputError(path, "", "not a PEM private key (or $SERVESTACK_KEY_PASSWORD does not open it)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(path, "", "expected an ECDSA P-256 private key (`servestack keygen` makes one)")
    return CryptoSigner(key, SSlibKey.from_crypto(key.public_key(), scheme=SCHEME))


def load_public_key(path: Path) -> SSlibKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise InputError(path, "", f"cannot read the public key ({exc.strerror})") from None
    except ValueError:
        raise InputError(path, "", "not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(path, "", "expected an ECDSA P-256 public key")
    return SSlibKey.from_crypto(key, scheme=SCHEME)


@dataclass(frozen=True, kw_only=True)
class Subject:
    name: str
    sha256: str  # hex


def statement(subjects: list[Subject], predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": s.name, "digest": {"sha256": s.sha256}} for s in subjects],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def sign_statement(document: dict[str, Any], signer: CryptoSigner) -> bytes:
    """The DSSE envelope (JSON bytes) over the canonical JSON of an in-toto statement."""
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(signer)
    return json.dumps(envelope.to_dict(), sort_keys=True).encode()


def verify_envelope(data: bytes, key: SSlibKey, what: str) -> dict[str, Any]:
    """The statement inside a DSSE envelope, once a signature verifies with KEY."""
    try:
        envelope = Envelope.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{what}: not a DSSE envelope ({exc})") from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise SignatureError(f"{what}: payload type {envelope.payload_type!r}, expected {PAYLOAD_TYPE!r}")
    pae = envelope.pae()
    for signature in envelope.signatures.values():
        try:
            key.verify_signature(Signature(key.keyid, signature.signature), pae)
            break
        except UnverifiedSignatureError:
            continue
    else:
        raise SignatureError(f"{what}: no signature verifies with the given public key "
                             f"({len(envelope.signatures)} signature(s), none by key {key.keyid[:16]})")
    try:
        document = json.loads(envelope.payload)
    except ValueError as exc:
        raise SignatureError(f"{what}: the signed payload is not JSON ({exc})") from None
    if document.get("_type") != STATEMENT_TYPE:
        raise SignatureError(f"{what}: the signed payload is not an in-toto v1 statement")
    return document

