"""Test vectors for signed model cards, shared by the Python and Java SDKs.

Ed25519 is deterministic, so fixed key seeds and fixed times give the same file on every run:
`python tests/vectors/card_signature_vectors.py` rewrites `card_signatures.json`, and a test checks that the
committed file is what this script writes. Each case is a card as a device receives it, the verifier's clock,
the last version it accepted for the card's line and the id of the card it accepted at that version, the
operator's revocation list it holds (`fedzoo.revocation`, or null), and the expected verdict: `ok` or a
`CardSignatureError.reason`.
Contract 2 signs the whole card but `signature` and `unsigned`: the `*_edited` cases change one field each a
device acts on, and `field_left_unsigned` is a card carrying a field its signer never signed.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fedzoo.cards import InputSpec, Latency, Metrics, ModelCard, Normalisation
from fedzoo.revocation import sign_revocation_list
from fedzoo.signing import SIGNATURE_DOMAIN, CardSigningKey, TrustedKeys, sign_card

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
        parent_id="digits-mlp-v2",
        line="digits-mlp-v1",
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
        details={"federated": {"privacy": {"dp": {"epsilon": 4.0, "delta": 1e-05}}}},
        latency_ms={"phone": Latency(median_ms=2.5, source="measured", threads=1)},
        created_at=SIGNED_AT,
    )


def _tamper_payload(card: ModelCard) -> ModelCard:
    """Change one signed byte (the size) while keeping valid base64 and JSON: the signature must fail."""
    payload = base64.b64decode(card.signature.payload).replace(b'"size_bytes":5432', b'"size_bytes":5433')
    block = card.signature.model_copy(update={"payload": base64.b64encode(payload).decode()})
    return card.model_copy(update={"signature": block})


def _signed_without(card: ModelCard, field: str, key: CardSigningKey) -> ModelCard:
    """A card whose signer left `field` out of the signed payload (validly signed), served with the field."""
    payload = json.loads(base64.b64decode(sign_card(card, key, LIFETIME, now=SIGNED_AT).signature.payload))
    del payload["card"][field]
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    block = sign_card(card, key, LIFETIME, now=SIGNED_AT).signature.model_copy(update={
        "payload": base64.b64encode(raw).decode(),
        "signature": base64.b64encode(key.private_key.sign(SIGNATURE_DOMAIN + raw)).decode()})
    return card.model_copy(update={"signature": block})


def _edited(card: ModelCard, **changes: Any) -> ModelCard:
    """The signed card with fields changed after signing (validated, as a device parses it)."""
    return ModelCard.from_dict({**json.loads(card.to_json()), **changes})


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
        ("normalisation_edited", _edited(signed, input={**json.loads(signed.to_json())["input"],
                                                        "normalisation": {"mean": [0.0], "std": [1.0]}}),
         within, None, "field_mismatch"),
        ("labels_edited", _edited(signed, labels=[str(9 - digit) for digit in range(10)]), within, None,
         "field_mismatch"),
        ("precision_edited", _edited(signed, precision="int8"), within, None, "field_mismatch"),
        ("metrics_edited", _edited(signed, metrics={"accuracy": 0.99, "loss": 0.3, "num_examples": 360}), within,
         None, "field_mismatch"),
        ("latency_edited", _edited(signed, latency_ms={"phone": {"median_ms": 0.5, "source": "measured"}}), within,
         None, "field_mismatch"),
        ("parent_id_edited", _edited(signed, parent_id="digits-mlp-v0"), within, None, "field_mismatch"),
        ("line_edited", _edited(signed, line="another-line"), within, None, "field_mismatch"),
        ("privacy_claim_edited", _edited(signed, details={"federated": {"privacy": {"dp": {"epsilon": 1.0,
                                                                                            "delta": 1e-05}}}}),
         within, None, "field_mismatch"),
        ("field_left_unsigned", _signed_without(_card(), "labels", key), within, None, "field_mismatch"),
        ("unsigned_measurements_changed", _edited(signed, unsigned={"fleet_latency_factor": 1.7}), within, None,
         "ok"),
        ("expired", signed, SIGNED_AT + LIFETIME, None, "expired"),
        ("rollback", signed, within, 4, "rollback"),
    ]
    revocations = {  # name: (last accepted card id, revocation list, verdict), with the valid card at version 3
        "same_card_at_the_last_accepted_version": ("digits-mlp-v3", None, "ok"),
        "second_card_for_the_line_and_version": ("digits-mlp-v3-r9", None, "version_reused"),
        "revoked_by_id": (None, sign_revocation_list(key, 1, card_ids=[signed.id], now=SIGNED_AT), "revoked"),
        "revoked_by_model_sha256": (None, sign_revocation_list(key, 2, card_sha256s=[signed.sha256], now=SIGNED_AT),
                                    "revoked"),
        "revocation_list_of_other_cards": (None, sign_revocation_list(key, 3, card_ids=["digits-mlp-v2"],
                                                                      card_sha256s=["0" * 64], now=SIGNED_AT), "ok"),
    }
    rows = [(name, card, now, last, None, None, expect) for name, card, now, last, expect in cases]
    rows += [(name, signed, within, None if card_id is None else 3, card_id, listed, expect)
             for name, (card_id, listed, expect) in revocations.items()]
    return {
        "description": __doc__.split("\n\n")[0],
        "trusted_keys": TrustedKeys([key.public_key_raw]).to_json(),
        "cases": [
            {
                "name": name,
                "card": json.loads(card.to_json()),
                "now": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "last_accepted_version": last_accepted,
                "last_accepted_card_id": last_card_id,
                "revocation_list": revocation_list,
                "expect": expect,
            }
            for name, card, now, last_accepted, last_card_id, revocation_list, expect in rows
        ],
    }


def vectors_text() -> str:
    return json.dumps(card_signature_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
