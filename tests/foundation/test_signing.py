"""Signed model cards: the shared test vectors, key files and key sets (fedzoo.signing)."""

import base64
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "vectors"))  # the vector writer (importlib mode)
from card_signature_vectors import VECTORS_PATH, card_signature_vectors, fleet_key, vectors_text
import revocation_list_vectors

from fedzoo.cards import ModelCard
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.revocation import verify_revocation_list
from fedzoo.signing import (SIGNATURE_CONTRACT, UNSIGNED_FIELDS, CardSigningKey, TrustedKeys, key_id_of, sign_card,
                            verify_card)

VECTORS = card_signature_vectors()


def test_the_committed_vectors_are_what_the_writer_writes():
    assert VECTORS_PATH.read_text() == vectors_text()


REVOCATION_VECTORS = revocation_list_vectors.revocation_list_vectors()


def _device_verdict(case, trusted: TrustedKeys) -> None:
    """What a device decides for the case's card: its signature and line order, then the list it holds."""
    card = ModelCard.from_dict(case["card"])
    now = datetime.strptime(case["now"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    verify_card(card, trusted, now=now, last_accepted_version=case["last_accepted_version"],
                last_accepted_card_id=case["last_accepted_card_id"])
    if case["revocation_list"] is not None:
        verify_revocation_list(case["revocation_list"], trusted).refuse_revoked(card)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda case: case["name"])
def test_each_vector_gets_its_expected_verdict(case):
    trusted = TrustedKeys.from_json(VECTORS["trusted_keys"])
    if case["expect"] == "ok":
        _device_verdict(case, trusted)
    else:
        with pytest.raises(CardSignatureError) as caught:
            _device_verdict(case, trusted)
        assert caught.value.reason == case["expect"]


def test_the_vectors_cover_every_reason():
    reasons = {case["expect"] for case in VECTORS["cases"]}
    assert reasons == {"ok", "unsigned", "unknown_key", "bad_signature", "field_mismatch", "expired", "rollback",
                       "version_reused", "revoked"}


def test_the_committed_revocation_list_vectors_are_what_the_writer_writes():
    assert revocation_list_vectors.VECTORS_PATH.read_text() == revocation_list_vectors.vectors_text()


@pytest.mark.parametrize("case", REVOCATION_VECTORS["cases"], ids=lambda case: case["name"])
def test_each_revocation_list_vector_gets_its_expected_verdict(case):
    trusted = TrustedKeys.from_json(REVOCATION_VECTORS["trusted_keys"])
    held = None if case["held"] is None else verify_revocation_list(case["held"], trusted)
    if case["expect"] == "ok":
        listed = verify_revocation_list(case["document"], trusted, held=held)
        assert listed.version == case["version"]
        assert sorted(listed.device_key_fingerprints) == case["device_key_fingerprints"]
    else:
        with pytest.raises(CardSignatureError) as caught:
            verify_revocation_list(case["document"], trusted, held=held)
        assert caught.value.reason == case["expect"]


def test_a_card_survives_its_json_round_trip_still_verifying():
    valid = next(case for case in VECTORS["cases"] if case["name"] == "valid")
    card = ModelCard.from_json(ModelCard.from_dict(valid["card"]).to_json())
    now = datetime(2026, 12, 2, tzinfo=timezone.utc)
    verify_card(card, TrustedKeys.from_json(VECTORS["trusted_keys"]), now=now)


def test_a_saved_key_loads_back_owner_readable_only(tmp_path):
    key = CardSigningKey.generate()
    path = tmp_path / "keys" / "signing.pem"
    path.parent.mkdir()
    path.write_text("an older, world-readable file")
    path.chmod(0o644)
    key.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert CardSigningKey.load(path).key_id == key.key_id == key_id_of(key.public_key_raw)


@pytest.mark.parametrize("content", [b"not a key", b""])
def test_a_file_that_is_not_a_pem_key_is_refused_naming_it(tmp_path, content):
    path = tmp_path / "bogus.pem"
    path.write_bytes(content)
    with pytest.raises(InvalidInputError, match="bogus.pem"):
        CardSigningKey.load(path)


def test_a_new_key_added_to_the_set_lets_both_old_and_new_cards_verify():
    old, new = fleet_key(), CardSigningKey.generate()
    trusted = TrustedKeys.from_json(TrustedKeys([old.public_key_raw, new.public_key_raw]).to_json())
    card = ModelCard.from_dict(VECTORS["cases"][0]["card"]).model_copy(update={"signature": None})
    now = datetime(2026, 12, 2, tzinfo=timezone.utc)
    for key in (old, new):
        verify_card(sign_card(card, key, now=now), trusted, now=now)


def test_a_key_set_whose_id_does_not_match_its_key_is_refused():
    entry = dict(VECTORS["trusted_keys"]["keys"][0], key_id="0" * 16)
    with pytest.raises(InvalidInputError, match="key_id"):
        TrustedKeys.from_json({"keys": [entry]})


@pytest.mark.parametrize("bad", [{}, {"keys": "x"}, {"keys": [{"public_key": "not base64!"}]},
                                 {"keys": [{"public_key": "AAAA"}]}])
def test_a_malformed_key_set_is_refused_with_a_clear_error(bad):
    with pytest.raises(InvalidInputError):
        TrustedKeys.from_json(bad)


def test_the_payload_signs_every_card_field_but_the_signature_and_the_unsigned_measurements():
    card = ModelCard.from_dict(VECTORS["cases"][0]["card"])
    payload = json.loads(base64.b64decode(card.signature.payload))
    assert payload["contract"] == SIGNATURE_CONTRACT
    assert set(payload["card"]) == set(ModelCard.model_fields) - set(UNSIGNED_FIELDS)
    assert set(UNSIGNED_FIELDS) == {"signature", "unsigned"}


def test_a_contract_one_signature_is_refused():
    """A signature over the old domain (identity and blobs only) never passes for a whole-card one."""
    key = fleet_key()
    card = ModelCard.from_dict(VECTORS["cases"][0]["card"])
    payload = base64.b64decode(card.signature.payload)
    old = card.signature.model_copy(update={
        "signature": base64.b64encode(key.private_key.sign(b"fedzoo-card-v1\n" + payload)).decode()})
    with pytest.raises(CardSignatureError) as caught:
        verify_card(card.model_copy(update={"signature": old}), TrustedKeys([key.public_key_raw]),
                    now=datetime(2026, 12, 2, tzinfo=timezone.utc))
    assert caught.value.reason == "bad_signature"
