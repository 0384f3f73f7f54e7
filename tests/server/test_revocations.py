"""The operator's signed revocation list on the server: only the admin uploads one, only a list a trusted key
signed is kept, a version not newer than the held one is refused without touching it, and anyone fetches the
newest (it is signed: devices verify it themselves)."""

import base64
import json

import pytest
from server_helpers import ADMIN_TOKEN, VIEWER_TOKEN, device_profile, running_live_server

from fedzoo.revocation import sign_revocation_list
from fedzoo.server.config import ServerConfig
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card

OPERATOR = CardSigningKey.from_seed(bytes(range(32)))
STRANGER = CardSigningKey.from_seed(bytes(range(1, 33)))
REVOKED_SHA256 = "ab" * 32


@pytest.fixture
def server(tmp_path):
    key_set = tmp_path / "operator-keys.json"
    key_set.write_text(json.dumps(TrustedKeys([OPERATOR.public_key_raw]).to_json()))
    config = ServerConfig.from_env({"FEDZOO_TRUSTED_KEYS": str(key_set)}, data_dir=tmp_path / "data",
                                   admin_token=ADMIN_TOKEN, viewer_token=VIEWER_TOKEN)
    with running_live_server(config) as running:
        yield running


def _error(response):
    return response.status_code, response.json()["error"]["code"], response.json()["error"]["field"]


def test_only_the_admin_uploads_and_anyone_fetches_the_newest_list(server):
    listed = sign_revocation_list(OPERATOR, 1, card_ids=["digits-v2"], card_sha256s=[REVOKED_SHA256])
    with server.enroller() as enroller:
        device_token = enroller.post("/v1/devices", json=device_profile("d1")).json()["token"]
    with server.client() as anyone:
        assert _error(anyone.get("/v1/revocations")) == (404, "no_revocation_list", None)
    for token in (None, device_token, VIEWER_TOKEN, "a-wrong-token-of-the-right-length-xxxxxxxx"):
        with server.client(token) as caller:
            assert caller.post("/v1/revocations", json=listed).status_code == 401, token
    with server.client(ADMIN_TOKEN) as admin:
        stored = admin.post("/v1/revocations", json=listed)
    assert stored.status_code == 201 and stored.json() == {
        "version": 1, "revoked_card_ids": 1, "revoked_card_sha256s": 1, "revoked_device_keys": 0}
    with server.client() as anyone:
        assert anyone.get("/v1/revocations").json() == listed


@pytest.mark.parametrize("document, expected", [
    ({"key_id": OPERATOR.key_id, "payload": "e30=", "signature": "AA=="}, (422, "revocation_list_not_trusted",
                                                                          "signature")),
    (sign_revocation_list(STRANGER, 2, card_ids=["x"]), (422, "revocation_list_not_trusted", "signature")),
    ("not a list", (422, "invalid_field", "body")),  # not an object at all
    ({"key_id": OPERATOR.key_id, "payload": "e30="}, (422, "invalid_field", "signature")),
    ({**sign_revocation_list(OPERATOR, 2), "extra": 1}, (422, "invalid_field", "extra")),
    ({**sign_revocation_list(OPERATOR, 2), "key_id": "not-hex"}, (422, "invalid_field", "key_id")),
])
def test_bad_lists_are_refused_naming_the_field_and_the_held_list_stays(server, document, expected):
    first = sign_revocation_list(OPERATOR, 1, card_ids=["digits-v2"])
    with server.client(ADMIN_TOKEN) as admin:
        assert admin.post("/v1/revocations", json=first).status_code == 201
        refused = admin.post("/v1/revocations", json=document)
        stale = admin.post("/v1/revocations", json=sign_revocation_list(OPERATOR, 1))  # an empty list, version 1
        not_json = admin.post("/v1/revocations", content=b"{", headers={"Content-Type": "application/json"})
        assert admin.get("/v1/revocations").json() == first  # nothing stored was replaced
    assert _error(refused) == expected
    assert _error(stale) == (409, "stale_revocation_list", "version")
    assert not_json.status_code == 400


def test_a_card_signature_does_not_pass_for_a_revocation_list(server):
    """The purpose label differs: the operator's signature over a card's payload is no list signature."""
    card_block = sign_card(_any_card(), OPERATOR).signature
    forged = {"key_id": card_block.key_id, "payload": card_block.payload, "signature": card_block.signature}
    with server.client(ADMIN_TOKEN) as admin:
        refused = admin.post("/v1/revocations", json=forged)
    assert _error(refused) == (422, "revocation_list_not_trusted", "signature")
    assert refused.json()["error"]["reason"] == "bad_signature"
    payload = json.loads(base64.b64decode(card_block.payload))
    assert "purpose" not in payload  # and a card payload has no list's purpose either


def _any_card():
    from server_helpers import make_card, tiny_onnx_model

    return make_card(tiny_onnx_model(seed=1), "any-card", 0.9, 1000)
