"""Test vectors for signed model cards, shared by the Python and Java SDKs.

Ed25519 is deterministic, so fixed key seeds and fixed times give the same file on every run:
`python tests/vectors/card_signature_vectors.py` rewrites `card_signatures.json`, and a test checks that the
committed file is what this script writes. Each case is a card as a device receives it, the verifier's clock,
the last version it accepted for the family, and the expected verdict: `ok` or a `CardSignatureError.reason`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fedzoo.cards import InputSpec, Metrics, ModelCard, Normalisation
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card

VECTORS_PATH = Path(__file__).with_name("card_signatures.json")
SIGNED_AT = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
LIFETIME = timedelta(days=30)


def fleet_key() -> CardSigningKey:
    return CardSigningKey.from_seed(hashlib.sha256(b"fedzoo test vector fleet key").digest())


def stranger_key() -> CardSigningKey:
    return CardSigningKey.from_seed(hashlib.sha256(b"fedzoo test vector stranger key").digest())


def _card(version: int = 3) -> ModelCard:
    return ModelCard(
        id=f"digits-mlp-v{version}",
        family="digits-mlp",
        version=version,
        parent_id="digits-mlp-v1",
        task="digits",
        input=InputSpec(name="input", shape=["batch", 1, 8, 8],
                        normalisation=Normalisation(mean=[0.5], std=[0.25])),
        labels=[str(digit) for digit in range(10)],
        metrics=Metrics(accuracy=0.91, loss=0.3, num_examples=360),
        macs=1200,
        params=1300,
        size_bytes=5432,
        sha256=hashlib.sha256(b"model bytes").hexdigest(),
        training_graph=hashlib.sha256(b"training graph bytes").hexdigest(),
        artifacts={"torch_state": hashlib.sha256(b"torch state").hexdigest()},
        created_at=SIGNED_AT,
    )


def _tamper_payload(card: ModelCard) -> ModelCard:
    """Change one signed byte (the size) while keeping valid base64 and JSON: the signature must fail."""
    payload = base64.b64decode(card.signature.payload).replace(b'"size_bytes":5432', b'"size_bytes":5433')
    block = card.signature.model_copy(update={"payload": base64.b64encode(payload).decode()})
    return card.model_copy(update={"signature": block})


def card_signature_vectors() -> dict[str, Any]:
    key = fleet_key()
    signed = sign_card(_card(), key, LIFETIME, now=SIGNED_AT)
    within = SIGNED_AT + timedelta(days=1)
    cases = [
        ("valid", signed, within, None, "ok"),
        ("valid_same_version_as_last_accepted", signed, within, 3, "ok"),
        ("unsigned", _card(), within, None, "unsigned"),
        ("unknown_key", sign_card(_card(), stranger_key(), LIFETIME, now=SIGNED_AT), within, None, "unknown_key"),
        ("payload_altered", _tamper_payload(signed), within, None, "bad_signature"),
        ("model_sha256_swapped", signed.model_copy(update={"sha256": "0" * 64}), within, None, "field_mismatch"),
        ("version_raised_without_resigning", signed.model_copy(update={"version": 4}), within, None,
         "field_mismatch"),
        ("training_graph_dropped", signed.model_copy(update={"training_graph": None}), within, None,
         "field_mismatch"),
        ("expired", signed, SIGNED_AT + LIFETIME, None, "expired"),
        ("rollback", signed, within, 4, "rollback"),
    ]
    return {
        "description": __doc__.split("\n\n")[0],
        "trusted_keys": TrustedKeys([key.public_key_raw]).to_json(),
        "cases": [
            {
                "name": name,
                "card": json.loads(card.to_json()),
                "now": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "last_accepted_version": last_accepted,
                "expect": expect,
            }
            for name, card, now, last_accepted, expect in cases
        ],
    }


def vectors_text() -> str:
    return json.dumps(card_signature_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
