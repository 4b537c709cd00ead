"""A signature in the referrers listing itself, so pull can tell the publisher's attestations from
junk without fetching anything.

Anyone who can push to a repository can list referrers of an image: 10,000 attestations signed by
another key cost pull 20,000 requests if each must be fetched before its signature is checked, and
a cap on how many are fetched lets junk that sorts first crowd out the real one. So publish puts two
annotations on the attestation manifest (the referrers API copies a manifest's annotations into its
listing; the fallback tag's entry carries them too):

    io.servestack.listing.envelope   the DSSE envelope's digest (a blob of the repository)
    io.servestack.listing.signature  base64 of the key's ECDSA P-256 signature over
                                     "servestack-listing-v1 <image digest> <envelope digest>"

Pull checks every listed signature with the public key (CPU only: about 10,000 a second) and
fetches only the envelopes the key signed for this image, each once however often it is listed.
The annotation says nothing pull trusts beyond which blob to fetch: the envelope is then verified
as before, and only its signed statement decides. A listing signed for another image (a replay)
fails the check, because the image's digest is in the signed text.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.signer import CryptoSigner, SSlibKey

from servestack.sources.registry import DIGEST

LISTING_ENVELOPE = "io.servestack.listing.envelope"
LISTING_SIGNATURE = "io.servestack.listing.signature"
_MAX_SIGNATURE = 200  # base64 characters: a DER ECDSA P-256 signature is at most 72 bytes


def _payload(subject: str, envelope_digest: str) -> bytes:
    return f"servestack-listing-v1 {subject} {envelope_digest}".encode()


def listing_annotations(signer: CryptoSigner, subject: str, envelope_digest: str) -> dict[str, str]:
    signature = bytes.fromhex(signer.sign(_payload(subject, envelope_digest)).signature)
    return {LISTING_ENVELOPE: envelope_digest, LISTING_SIGNATURE: base64.b64encode(signature).decode()}


def listing_checker(key: SSlibKey, subject: str) -> Callable[[dict[str, str]], str | None]:
    """A function of a referrer's annotations: the envelope digest the key signed for SUBJECT, or None."""
    public = serialization.load_pem_public_key(key.keyval["public"].encode())
    assert isinstance(public, ec.EllipticCurvePublicKey)

    def check(annotations: dict[str, str]) -> str | None:
        envelope, signature = annotations.get(LISTING_ENVELOPE), annotations.get(LISTING_SIGNATURE)
        if not isinstance(envelope, str) or not DIGEST.match(envelope) or not isinstance(signature, str) \
                or len(signature) > _MAX_SIGNATURE:
            return None
        try:
            public.verify(base64.b64decode(signature, validate=True), _payload(subject, envelope),
                          ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, binascii.Error, ValueError):
            return None
        return envelope

    return check


def is_listed(annotations: dict[str, str]) -> bool:
    return LISTING_ENVELOPE in annotations or LISTING_SIGNATURE in annotations
