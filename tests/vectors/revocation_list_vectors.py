"""Test vectors for the operator's signed revocation lists (`fedzoo.revocation`), shared by both SDKs.

Ed25519 is deterministic, so fixed key seeds and a fixed time give the same file on every run:
`python tests/vectors/revocation_list_vectors.py` rewrites `revocation_lists.json`, and a test checks that the
committed file is what this script writes. Each case is a list as a server serves it, the list the device
already holds (or null), and the expected verdict: `ok` (with the list's version and the device key fingerprints
it revokes) or a `CardSignatureError.reason`. The one list carries both sections: cards, and device signing keys
by fingerprint (hex sha256 of the raw key, `fedzoo.device_certificates.key_fingerprint`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from card_signature_vectors import SIGNED_AT, _card, fleet_key, stranger_key

from fedzoo.device_certificates import issue_certificate, key_fingerprint
from fedzoo.revocation import REVOCATION_DOMAIN, sign_revocation_list
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card

VECTORS_PATH = Path(__file__).with_name("revocation_lists.json")
REVOKED_SHA256 = hashlib.sha256(b"model bytes").hexdigest()
DEVICE_KEY = bytes(range(100, 132))  # a device's raw 32-byte signing public key


def _signed_payload(key: CardSigningKey, payload: dict[str, Any]) -> dict[str, Any]:
    """A list document whose payload is exactly `payload`, validly signed under the revocation purpose."""
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return {"key_id": key.key_id, "algorithm": "ed25519", "payload": base64.b64encode(raw).decode(),
            "signature": base64.b64encode(key.private_key.sign(REVOCATION_DOMAIN + raw)).decode()}


def revocation_list_vectors() -> dict[str, Any]:
    key = fleet_key()
    held = sign_revocation_list(key, 2, card_ids=["digits-mlp-v3"], now=SIGNED_AT)
    newer = sign_revocation_list(key, 3, card_ids=["digits-mlp-v3"], card_sha256s=[REVOKED_SHA256],
                                 device_key_fingerprints=[key_fingerprint(DEVICE_KEY)], now=SIGNED_AT)
    payload = json.loads(base64.b64decode(newer["payload"]))
    card_signature = sign_card(_card(), key, now=SIGNED_AT).signature
    certificate = issue_certificate("phone-1", DEVICE_KEY, key, now=SIGNED_AT)
    cases = [
        ("newer_than_held", newer, held, "ok"),
        ("first_list", held, None, "ok"),
        ("the_held_list_again", held, held, "ok"),
        ("older_than_held", held, newer, "rollback"),
        ("another_list_under_the_held_version", sign_revocation_list(key, 2, now=SIGNED_AT), held, "version_reused"),
        ("unknown_key", sign_revocation_list(stranger_key(), 3, now=SIGNED_AT), held, "unknown_key"),
        ("payload_altered", {**newer, "payload": sign_revocation_list(key, 3, now=SIGNED_AT)["payload"]}, held,
         "bad_signature"),
        ("a_card_signature_as_a_list", {"key_id": key.key_id, "algorithm": "ed25519",
                                        "payload": card_signature.payload, "signature": card_signature.signature},
         None, "bad_signature"),
        ("a_device_certificate_as_a_list", {**certificate, "algorithm": "ed25519"}, None, "bad_signature"),
        ("another_purpose", _signed_payload(key, {**payload, "purpose": "card"}), None, "field_mismatch"),
        ("version_not_a_number", _signed_payload(key, {**payload, "version": "3"}), None, "field_mismatch"),
        ("malformed_sha256", _signed_payload(key, {**payload, "revoked_cards": {"ids": [], "sha256s": ["zz"]}}),
         None, "field_mismatch"),
        ("device_key_not_a_fingerprint", _signed_payload(key, {**payload, "revoked_device_keys": ["device-key-0"]}),
         None, "field_mismatch"),
        ("key_id_not_the_signed_one", {**newer, "key_id": stranger_key().key_id}, None, "unknown_key"),
    ]
    return {
        "description": __doc__.split("\n\n")[0],
        "trusted_keys": TrustedKeys([key.public_key_raw]).to_json(),
        "signed_prefix": REVOCATION_DOMAIN.decode(),
        "cases": [
            {"name": name, "document": document, "held": held_document, "expect": expect,
             "version": _payload(document)["version"] if expect == "ok" else None,
             "device_key_fingerprints": _payload(document)["revoked_device_keys"] if expect == "ok" else None}
            for name, document, held_document, expect in cases
        ],
    }


def _payload(document: dict[str, Any]) -> dict[str, Any]:
    return json.loads(base64.b64decode(document["payload"]))


def vectors_text() -> str:
    return json.dumps(revocation_list_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
