"""Test vectors for the operator's signed privacy terms (`fedzoo.privacy_terms`), shared by both SDKs.

Ed25519 is deterministic, so fixed key seeds and a fixed time give the same file on every run:
`python tests/vectors/privacy_terms_vectors.py` rewrites `privacy_terms.json`, and a test checks that the
committed file is what this script writes. Each case is terms as a server serves them, the terms the device already
holds (or null), and the expected verdict: `ok` (with the version, and the policy a device with no policy of its
owner's applies on each of `lines`: null where the terms do not cover the line) or a `CardSignatureError.reason`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from card_signature_vectors import SIGNED_AT, fleet_key, stranger_key

from fedzoo.dp.distributed import NoisePolicy, policy_for
from fedzoo.privacy_terms import TERMS_DOMAIN, sign_privacy_terms, verify_privacy_terms
from fedzoo.revocation import sign_revocation_list
from fedzoo.signing import CardSigningKey, TrustedKeys

VECTORS_PATH = Path(__file__).with_name("privacy_terms.json")
LINES = ["digits-mlp", "another-line"]  # the lines each ok case's policies are given for


def _distributed(floor: Any) -> dict[str, Any]:
    return {"mode": "distributed", "minimum_noise_multiplier": floor}


def _signed_payload(key: CardSigningKey, payload: dict[str, Any]) -> dict[str, Any]:
    """Terms whose payload is exactly `payload`, validly signed under the terms' purpose label."""
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return {"key_id": key.key_id, "algorithm": "ed25519", "payload": base64.b64encode(raw).decode(),
            "signature": base64.b64encode(key.private_key.sign(TERMS_DOMAIN + raw)).decode()}


def privacy_terms_vectors() -> dict[str, Any]:
    key = fleet_key()
    held = sign_privacy_terms(key, 2, {"digits-mlp": _distributed(1.2)}, now=SIGNED_AT)
    newer = sign_privacy_terms(key, 3, {"digits-mlp": _distributed(1.5), "*": _distributed(1)}, now=SIGNED_AT)
    payload = json.loads(base64.b64decode(newer["payload"]))
    revocation_list = sign_revocation_list(key, 3, now=SIGNED_AT)
    cases = [
        ("newer_than_held", newer, held, "ok"),
        ("first_terms", held, None, "ok"),
        ("the_held_terms_again", held, held, "ok"),
        ("older_than_held", held, newer, "rollback"),
        ("other_terms_under_the_held_version", sign_privacy_terms(key, 2, {"*": _distributed(0.5)}, now=SIGNED_AT),
         held, "version_reused"),
        ("unknown_key", sign_privacy_terms(stranger_key(), 4, {"*": _distributed(0.1)}, now=SIGNED_AT), held,
         "unknown_key"),
        ("payload_altered", {**newer, "payload": held["payload"]}, None, "bad_signature"),
        ("a_revocation_list_as_terms", revocation_list, None, "bad_signature"),
        ("another_purpose", _signed_payload(key, {**payload, "purpose": "revocation_list"}), None, "field_mismatch"),
        ("central_mode", _signed_payload(key, {**payload, "lines": {"*": {**_distributed(1), "mode": "central"}}}),
         None, "field_mismatch"),
        ("floor_zero", _signed_payload(key, {**payload, "lines": {"*": _distributed(0)}}), None, "field_mismatch"),
        ("floor_a_boolean", _signed_payload(key, {**payload, "lines": {"*": _distributed(True)}}), None,
         "field_mismatch"),
        ("floor_text", _signed_payload(key, {**payload, "lines": {"*": _distributed("1.5")}}), None, "field_mismatch"),
        ("a_line_that_is_no_id", _signed_payload(key, {**payload, "lines": {"no line!": _distributed(1)}}), None,
         "field_mismatch"),
        ("no_lines", _signed_payload(key, {**payload, "lines": {}}), None, "field_mismatch"),
        ("version_not_a_number", _signed_payload(key, {**payload, "version": "3"}), None, "field_mismatch"),
        ("key_id_not_the_signed_one", {**newer, "key_id": stranger_key().key_id}, None, "unknown_key"),
    ]
    trusted = TrustedKeys([key.public_key_raw])
    return {
        "description": __doc__.split("\n\n")[0],
        "trusted_keys": trusted.to_json(),
        "signed_prefix": TERMS_DOMAIN.decode(),
        "lines": LINES,
        "cases": [
            {"name": name, "document": document, "held": held_document, "expect": expect,
             "version": _payload(document)["version"] if expect == "ok" else None,
             "policies": _policies(document, trusted) if expect == "ok" else None}
            for name, document, held_document, expect in cases
        ],
    }


def _policies(document: dict[str, Any], trusted: TrustedKeys) -> dict[str, Any]:
    """Per line of LINES, what a default device requires there: null where the terms leave the line uncovered."""
    terms = verify_privacy_terms(document, trusted)
    policies = {line: policy_for(terms, line, NoisePolicy()) for line in LINES}
    return {line: None if policy == NoisePolicy() else
            {"require_distributed": policy.require_distributed,
             "minimum_noise_multiplier": policy.minimum_noise_multiplier} for line, policy in policies.items()}


def _payload(document: dict[str, Any]) -> dict[str, Any]:
    return json.loads(base64.b64decode(document["payload"]))


def vectors_text() -> str:
    return json.dumps(privacy_terms_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
