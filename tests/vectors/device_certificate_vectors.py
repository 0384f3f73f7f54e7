"""Test vectors for device certificates, shared by the Python and Java SDKs.

Ed25519 is deterministic, so fixed key seeds and fixed times give the same file on every run:
`python tests/vectors/device_certificate_vectors.py` rewrites `device_certificates.json`, and a test checks that
the committed file is what this script writes. Each certificate case is what a neighbour's entry carries (device
id, signing key, certificate), the verifier's clock and revoked key fingerprints, and the expected verdict: `ok`
or a `DeviceCertificateError.reason`. `signed_bytes_hex` pins the bytes the operator signs for the valid case.
Revoked device keys are a section of the operator's one revocation list: its vectors are `revocation_lists.json`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fedzoo.device_certificates import CERTIFICATE_DOMAIN, issue_certificate, key_fingerprint
from fedzoo.secagg import signatures
from fedzoo.signing import CardSigningKey, TrustedKeys
from card_signature_vectors import _card, fleet_key, stranger_key  # noqa: E402  (run from tests/vectors)

VECTORS_PATH = Path(__file__).with_name("device_certificates.json")
ISSUED_AT = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
LIFETIME = timedelta(days=30)


def device_key(name: str) -> bytes:
    """A device's raw public signing key from a fixed seed."""
    seed = hashlib.sha256(f"fedzoo test vector device key {name}".encode()).digest()
    return signatures.public_bytes(signatures.load_signing_key(seed))


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _card_signature_as_certificate(key: CardSigningKey) -> dict[str, str]:
    """A card's signature block, which an operator key made, handed over as if it were a certificate."""
    from fedzoo.signing import sign_card
    block = sign_card(_card(), key, LIFETIME, now=ISSUED_AT).signature
    return {"key_id": block.key_id, "payload": block.payload, "signature": block.signature}


def _certificate_bytes_as_card_domain(key: CardSigningKey, device_id: str, raw: bytes) -> dict[str, str]:
    """A genuine certificate payload signed under the card domain: the label must make it fail."""
    certificate = issue_certificate(device_id, raw, key, LIFETIME, ISSUED_AT)
    payload = base64.b64decode(certificate["payload"])
    return {**certificate, "signature": base64.b64encode(key.private_key.sign(b"fedzoo-card-v2\n" + payload)).decode()}


def device_certificate_vectors() -> dict[str, Any]:
    operator = fleet_key()
    alice, bob = device_key("alice"), device_key("bob")
    valid = issue_certificate("alice", alice, operator, LIFETIME, ISSUED_AT)
    within = ISSUED_AT + timedelta(days=1)
    tampered = json.loads(base64.b64decode(valid["payload"]))
    tampered["signing_public_key"] = base64.b64encode(bob).decode()
    tampered_payload = json.dumps(tampered, sort_keys=True, separators=(",", ":")).encode()
    cases = [
        ("valid", "alice", alice, valid, within, [], "ok"),
        ("no_certificate", "alice", alice, None, within, [], "uncertified"),
        ("not_a_sealed_document", "alice", alice, {"key_id": operator.key_id}, within, [], "malformed"),
        ("signed_by_a_key_not_pinned", "alice", alice,
         issue_certificate("alice", alice, stranger_key(), LIFETIME, ISSUED_AT), within, [], "unknown_key"),
        ("payload_altered", "alice", alice, {**valid, "payload": base64.b64encode(tampered_payload).decode()},
         within, [], "bad_signature"),
        ("card_signature_as_certificate", "alice", alice, _card_signature_as_certificate(operator), within, [],
         "bad_signature"),
        ("certificate_signed_under_the_card_label", "alice", alice,
         _certificate_bytes_as_card_domain(operator, "alice", alice), within, [], "bad_signature"),
        ("for_another_device_id", "bob", alice, valid, within, [], "wrong_device"),
        ("for_another_key", "alice", bob, valid, within, [], "wrong_key"),
        ("expired", "alice", alice, valid, ISSUED_AT + LIFETIME, [], "expired"),
        ("revoked", "alice", alice, valid, within, [key_fingerprint(alice)], "revoked"),
        ("another_key_revoked", "alice", alice, valid, within, [key_fingerprint(bob)], "ok"),
    ]
    return {
        "description": __doc__.split("\n\n")[0],
        "operator_keys": TrustedKeys([operator.public_key_raw]).to_json(),
        "signed_bytes_hex": (CERTIFICATE_DOMAIN + base64.b64decode(valid["payload"])).hex(),
        "certificates": [
            {"name": name, "device_id": device_id, "signing_public_key": base64.b64encode(raw).decode(),
             "certificate": certificate, "now": _time(now), "revoked_keys": revoked, "expect": expect}
            for name, device_id, raw, certificate, now, revoked, expect in cases
        ],
    }


def vectors_text() -> str:
    return json.dumps(device_certificate_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
