"""Device certificates: the operator, not the server, vouches that a SecAgg+ signing key belongs to an enrolled device.

A device's long-term Ed25519 key (registered with the server, `fedzoo.secagg.signatures`) signs its round keys; a
neighbour that took the key from the server alone would trust whatever key the server relays, so a lying server
could seat Sybils it made or put its own key in a device's place. A certificate is the operator's signature, made
offline with the card-signing key (`fedzoo keys`, `fedzoo devices certify`), over

    {"purpose": "device_certificate", "device_id", "signing_public_key", "issued_at", "expires_at", "key_id"}

and the signed bytes are `"fedzoo-device-certificate-v1\\n" + payload`: a card signature (`"fedzoo-card-v2\\n"`)
never verifies as a certificate, nor a certificate as a card. As with cards, the certificate carries its signed
payload (base64), `{"key_id", "payload", "signature"}`; a verifier checks the signature over those bytes and then
reads them, so no JSON re-encoding has to agree between Python and Java (tests/vectors/device_certificates.json).

Neighbours check certificates against the operator's public key set only (`fedzoo keys export-public`), never the
fleet set `GET /v1/keys`, which holds the server's own key: a server could certify its own Sybils with that one.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from cryptography.exceptions import InvalidSignature

from fedzoo.errors import FedzooError
from fedzoo.signing import TIMESTAMP_FORMAT, CardSigningKey, TrustedKeys

CERTIFICATE_DOMAIN = b"fedzoo-device-certificate-v1\n"
CERTIFICATE_PURPOSE = "device_certificate"
DEFAULT_CERTIFICATE_LIFETIME = timedelta(days=365)


class DeviceCertificateError(FedzooError):
    """A certificate a device must not accept. `reason` is one stable word both SDKs give (shared vectors):
    `uncertified` (none), `malformed`, `unknown_key` (not an operator key), `bad_signature` (also a card
    signature or another document presented as a certificate), `wrong_device`, `wrong_key`, `expired`, `revoked`."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class DeviceCertificate:
    """What a verified certificate says."""

    device_id: str
    signing_public_key: bytes
    issued_at: datetime
    expires_at: datetime
    key_id: str


def key_fingerprint(signing_public_key: bytes) -> str:
    """How revocation lists name a device key: the hex sha256 of its 32 raw bytes."""
    return hashlib.sha256(signing_public_key).hexdigest()


def seal(domain: bytes, fields: dict[str, Any], key: CardSigningKey) -> dict[str, str]:
    """An operator-signed document: the payload (compact JSON of `fields`) and the signature over domain + payload."""
    payload = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return {"key_id": key.key_id, "payload": _b64(payload),
            "signature": _b64(key.private_key.sign(domain + payload))}


def _require_shape(document: Any, purpose: str) -> None:
    if document is None:
        raise DeviceCertificateError(f"no {purpose} was given", reason="uncertified")
    if not isinstance(document, dict) or not all(isinstance(document.get(name), str)
                                                 for name in ("key_id", "payload", "signature")):
        raise DeviceCertificateError(f'a {purpose} is {{"key_id", "payload", "signature"}} (strings)',
                                     reason="malformed")


def sealed_fields(document: Any, purpose: str) -> dict[str, Any]:
    """The fields of a document `seal` made for `purpose`, read WITHOUT checking who signed it (only the server
    uses this, where it was not given the operator keys; devices call `open_sealed`)."""
    _require_shape(document, purpose)
    try:
        fields = json.loads(base64.b64decode(document["payload"], validate=True))
    except ValueError:
        raise DeviceCertificateError(f"the {purpose}'s payload is not base64 of JSON", reason="malformed") from None
    if not isinstance(fields, dict) or fields.get("purpose") != purpose or fields.get("key_id") != document["key_id"]:
        raise DeviceCertificateError(f"the signed payload is not a {purpose}", reason="bad_signature")
    return fields


def open_sealed(document: Any, domain: bytes, purpose: str, operator_keys: TrustedKeys) -> dict[str, Any]:
    """The fields of a document `seal` made for `purpose`, once a key of `operator_keys` is shown to have signed
    exactly its payload under `domain`; raises `DeviceCertificateError` (with its reason) otherwise."""
    _require_shape(document, purpose)
    public_key = operator_keys.get(document["key_id"])
    if public_key is None:
        raise DeviceCertificateError(f"the {purpose} is signed by key {document['key_id']}, not one of the operator keys "
                    f"{operator_keys.key_ids}", reason="unknown_key")
    try:
        public_key.verify(base64.b64decode(document["signature"], validate=True),
                          domain + base64.b64decode(document["payload"], validate=True))
    except (InvalidSignature, ValueError):
        raise DeviceCertificateError(f"the {purpose}'s signature does not verify: not an operator-signed {purpose}",
                                     reason="bad_signature") from None
    return sealed_fields(document, purpose)


def issue_certificate(device_id: str, signing_public_key: bytes, key: CardSigningKey,
                      lifetime: timedelta = DEFAULT_CERTIFICATE_LIFETIME, now: datetime | None = None
                      ) -> dict[str, str]:
    """The operator's certificate that `signing_public_key` is device `device_id`'s, valid for `lifetime`."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    fields = {"purpose": CERTIFICATE_PURPOSE, "device_id": device_id, "signing_public_key": _b64(signing_public_key),
              "issued_at": now.strftime(TIMESTAMP_FORMAT), "expires_at": (now + lifetime).strftime(TIMESTAMP_FORMAT),
              "key_id": key.key_id}
    return seal(CERTIFICATE_DOMAIN, fields, key)


def read_certificate(certificate: Any, operator_keys: TrustedKeys | None) -> DeviceCertificate:
    """What an operator-signed certificate says (signature checked; expiry, device and key are the caller's).
    `operator_keys` None reads it unchecked: only for a server that was not given the operator keys."""
    fields = (sealed_fields(certificate, CERTIFICATE_PURPOSE) if operator_keys is None
              else open_sealed(certificate, CERTIFICATE_DOMAIN, CERTIFICATE_PURPOSE, operator_keys))
    try:
        device_id, key_text = fields["device_id"], fields["signing_public_key"]
        signing_public_key = base64.b64decode(key_text, validate=True)
        issued_at, expires_at = (datetime.strptime(fields[name], TIMESTAMP_FORMAT).replace(tzinfo=timezone.utc)
                                 for name in ("issued_at", "expires_at"))
    except (KeyError, TypeError, ValueError):
        raise DeviceCertificateError("the certificate's signed fields are incomplete or malformed",
                                     reason="malformed") from None
    if not isinstance(device_id, str) or len(signing_public_key) != 32:
        raise DeviceCertificateError("the certificate's signed fields are incomplete or malformed", reason="malformed")
    return DeviceCertificate(device_id, signing_public_key, issued_at, expires_at, fields["key_id"])


def verify_certificate(certificate: Any, operator_keys: TrustedKeys, device_id: str,
                       signing_public_key: bytes, revoked_fingerprints: frozenset[str] = frozenset(),
                       now: datetime | None = None) -> DeviceCertificate:
    """Raise `DeviceCertificateError` unless an operator key certified `signing_public_key` as the key of
    `device_id`, the certificate has not expired at `now`, and the key is not among
    `revoked_fingerprints` (`key_fingerprint`s of revoked device keys)."""
    read = read_certificate(certificate, operator_keys)
    if read.device_id != device_id:
        raise DeviceCertificateError(f"the certificate is device {read.device_id!r}'s, not {device_id!r}'s",
                                     reason="wrong_device")
    if read.signing_public_key != signing_public_key:
        raise DeviceCertificateError(f"the certificate of device {read.device_id!r} certifies another signing key",
                                     reason="wrong_key")
    if (now or datetime.now(timezone.utc)) >= read.expires_at:
        raise DeviceCertificateError(f"the certificate of device {read.device_id!r} expired at "
                                     f"{read.expires_at:{TIMESTAMP_FORMAT}}", reason="expired")
    if key_fingerprint(signing_public_key) in revoked_fingerprints:
        raise DeviceCertificateError(f"the operator revoked device {read.device_id!r}'s signing key",
                                     reason="revoked")
    return read


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class CertificatePolicy:
    """What a device accepts as a SecAgg+ neighbour's key: one the operator certified for the device the server
    names, unexpired, and not among the revoked keys of the newest revocation list this device verified."""

    operator_keys: TrustedKeys
    revoked_fingerprints: frozenset[str] = frozenset()

    def verify(self, certificate: Any, device_id: Any, signing_public_key: bytes) -> DeviceCertificate:
        """`verify_certificate` now; a device id the server did not give as a string never matches."""
        return verify_certificate(certificate, self.operator_keys, device_id if isinstance(device_id, str) else "",
                                  signing_public_key, self.revoked_fingerprints)
