"""The operator's signed privacy terms on the server: only the admin uploads them, only terms an operator key
signed are kept (never the server's own key's), a version not newer than the held one is refused without touching
it, and devices (and the operator's tokens) read the newest; an outsider is told 401."""

import json

import pytest
from server_helpers import ADMIN_TOKEN, VIEWER_TOKEN, device_profile, running_live_server

from fedzoo.privacy_terms import sign_privacy_terms
from fedzoo.revocation import sign_revocation_list
from fedzoo.server.card_keys import SERVER_KEY_FILE
from fedzoo.server.config import ServerConfig
from fedzoo.signing import CardSigningKey, TrustedKeys

OPERATOR = CardSigningKey.from_seed(bytes(range(32)))
STRANGER = CardSigningKey.from_seed(bytes(range(1, 33)))
EVERY_LINE = {"*": {"mode": "distributed", "minimum_noise_multiplier": 1.0}}


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


def test_only_the_admin_uploads_and_devices_read_the_newest_terms(server):
    terms = sign_privacy_terms(OPERATOR, 1, EVERY_LINE)
    with server.enroller() as enroller:
        device_token = enroller.post("/v1/devices", json=device_profile("d1")).json()["token"]
    with server.client(device_token) as device:
        assert _error(device.get("/v1/privacy-terms")) == (404, "no_privacy_terms", None)
    for token in (None, device_token, VIEWER_TOKEN, "a-wrong-token-of-the-right-length-xxxxxxxx"):
        with server.client(token) as caller:
            assert caller.post("/v1/privacy-terms", json=terms).status_code == 401, token
    with server.client(ADMIN_TOKEN) as admin:
        stored = admin.post("/v1/privacy-terms", json=terms)
    assert stored.status_code == 201 and stored.json() == {"version": 1, "lines": ["*"]}
    for token in (device_token, VIEWER_TOKEN, ADMIN_TOKEN):
        with server.client(token) as reader:
            assert reader.get("/v1/privacy-terms").json() == terms
    for token in (None, "a-wrong-token-of-the-right-length-xxxxxxxx"):  # an outsider
        with server.client(token) as outsider:
            assert outsider.get("/v1/privacy-terms").status_code == 401


@pytest.mark.parametrize("document, expected", [
    ({"key_id": OPERATOR.key_id, "payload": "e30=", "signature": "AA=="}, (422, "privacy_terms_not_trusted",
                                                                          "signature")),
    (sign_privacy_terms(STRANGER, 2, EVERY_LINE), (422, "privacy_terms_not_trusted", "signature")),
    (sign_revocation_list(OPERATOR, 2), (422, "privacy_terms_not_trusted", "signature")),  # another purpose label
    ("not terms", (422, "invalid_field", "body")),
    ({"key_id": OPERATOR.key_id, "payload": "e30="}, (422, "invalid_field", "signature")),
    ({**sign_privacy_terms(OPERATOR, 2, EVERY_LINE), "extra": 1}, (422, "invalid_field", "extra")),
    ({**sign_privacy_terms(OPERATOR, 2, EVERY_LINE), "key_id": "not-hex"}, (422, "invalid_field", "key_id")),
])
def test_bad_terms_are_refused_naming_the_field_and_the_held_terms_stay(server, document, expected):
    first = sign_privacy_terms(OPERATOR, 1, EVERY_LINE)
    with server.client(ADMIN_TOKEN) as admin:
        assert admin.post("/v1/privacy-terms", json=first).status_code == 201
        refused = admin.post("/v1/privacy-terms", json=document)
        stale = admin.post("/v1/privacy-terms", json=sign_privacy_terms(OPERATOR, 1, {"digits": EVERY_LINE["*"]}))
        not_json = admin.post("/v1/privacy-terms", content=b"{", headers={"Content-Type": "application/json"})
        assert admin.get("/v1/privacy-terms").json() == first  # nothing stored was replaced
    assert _error(refused) == expected
    assert _error(stale) == (409, "stale_privacy_terms", "version")
    assert not_json.status_code == 400


def test_the_servers_own_key_cannot_sign_privacy_terms(server):
    """A server that signs relaxed terms with its own card key is refused: only operator keys sign terms."""
    own_key = CardSigningKey.load(server.config.data_dir / SERVER_KEY_FILE)
    with server.client(ADMIN_TOKEN) as admin:
        refused = admin.post("/v1/privacy-terms", json=sign_privacy_terms(own_key, 1, EVERY_LINE))
    assert _error(refused) == (422, "privacy_terms_not_trusted", "signature")
    assert refused.json()["error"]["reason"] == "unknown_key"
