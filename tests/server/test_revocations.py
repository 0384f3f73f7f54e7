"""The operator's signed revocation list on the server: only the admin uploads one, only a list a trusted key
signed is kept, a version not newer than the held one is refused without touching it, and anyone fetches the
newest (it is signed: devices verify it themselves)."""

import base64
import json

import pytest
from server_helpers import ADMIN_TOKEN, VIEWER_TOKEN, device_profile, running_live_server

from fedzoo.revocation import sign_revocation_list
from fedzoo.server.card_keys import SERVER_KEY_FILE
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


def test_the_servers_own_card_key_cannot_sign_a_revocation_list(server):
    """The server signs the cards its federated rounds publish, and devices pin that key for cards: were it to
    sign lists too, it could lift what the operator revoked. Only the operator keys (FEDZOO_TRUSTED_KEYS) count."""
    own = CardSigningKey.load(server.config.data_dir / SERVER_KEY_FILE)
    with server.client(ADMIN_TOKEN) as admin:
        refused = admin.post("/v1/revocations", json=sign_revocation_list(own, 1))
    assert _error(refused) == (422, "revocation_list_not_trusted", "signature")
    assert refused.json()["error"]["reason"] == "unknown_key"


def test_lookup_never_chooses_a_revoked_card_and_the_registry_marks_it(server):
    """Over REST: the most accurate card is revoked (by its model sha256), so lookup chooses the next; the
    registry shows the list version that revokes it; a card published later under a revoked id is marked at
    once; a newer list that drops the revocation makes the card eligible again."""
    from server_helpers import make_card, tiny_onnx_model

    models = {name: tiny_onnx_model(seed=seed) for seed, name in enumerate(("best", "second", "later"), start=2)}
    cards = {name: sign_card(make_card(models[name], name, accuracy, 1000), OPERATOR)
             for name, accuracy in (("best", 0.95), ("second", 0.9), ("later", 0.99))}
    for name in ("best", "second"):
        assert server.publish(cards[name], models[name]).status_code == 201
    token = server.register(device_profile("phone-1"))

    def chosen():
        with server.client(token) as device:
            answer = device.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 1000})
        assert answer.status_code == 200, answer.text
        return answer.json()["model"]["id"]

    def marks():
        with server.client(ADMIN_TOKEN) as admin:
            listed = admin.get("/v1/models").json()["models"]
        return {card["id"]: card["unsigned"]["revoked_by_list"] for card in listed}

    assert chosen() == "best"
    with server.client(ADMIN_TOKEN) as admin:
        assert admin.post("/v1/revocations", json=sign_revocation_list(
            OPERATOR, 1, card_ids=["later"], card_sha256s=[cards["best"].sha256])).status_code == 201
    assert chosen() == "second" and marks() == {"best": 1, "second": None}
    assert server.publish(cards["later"], models["later"]).status_code == 201  # revoked by id before it came
    assert chosen() == "second" and marks() == {"best": 1, "second": None, "later": 1}
    with server.client(ADMIN_TOKEN) as admin:
        assert admin.post("/v1/revocations", json=sign_revocation_list(OPERATOR, 2, card_ids=["later"])).status_code \
            == 201
    assert chosen() == "best" and marks() == {"best": None, "second": None, "later": 2}
