"""The operator's signed revocation list and one card per line and version, on the device: the Python SDK
fetches the list, keeps the newest it verified in its state file (across restarts), refuses an older list, a
different list under the held version, and a list no pinned key signed, and refuses to load a revoked card or
a second card for a line and version it already accepted. The genuine path runs against the real server; the
attacks come from a scripted server playing a compromised one."""

import json

import httpx
import pytest

from fedzoo.clients.client import FedzooClient
from fedzoo.cloud.simulation import DEFAULT_ADMIN_TOKEN, LoopbackServer, prepare_federation
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.revocation import sign_revocation_list
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card

OPERATOR = CardSigningKey.from_seed(bytes(range(32)))
STRANGER = CardSigningKey.from_seed(bytes(range(1, 33)))
PINNED = TrustedKeys([OPERATOR.public_key_raw])


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=2, alpha=1.0, hidden_units=8, pretrain_epochs=1, seed=0)


def _device(url, tmp_path) -> FedzooClient:
    return FedzooClient(url, cache_dir=tmp_path / "cache", trusted_keys=PINNED, state_file=tmp_path / "state.json")


def _serve(scripted_server, documents: dict[str, object], blob: bytes = b"") -> None:
    """A compromised server: answers these JSON documents by path (a blob for `/blob` paths)."""

    def handle(handler):
        body = blob if handler.path.endswith("/blob") else json.dumps(documents[handler.path]).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    scripted_server.handle = handle


def test_a_revoked_card_is_refused_after_the_device_fetched_the_list_even_after_a_restart(federation, tmp_path):
    key_set = tmp_path / "operator-keys.json"
    key_set.write_text(json.dumps(PINNED.to_json()))
    card = sign_card(federation.card, OPERATOR)
    with LoopbackServer(tmp_path / "server", trusted_keys=key_set) as server:
        with FedzooClient(server.url, cache_dir=tmp_path / "admin") as admin:
            admin.publish_model(card, federation.blobs, DEFAULT_ADMIN_TOKEN)
        with _device(server.url, tmp_path) as device:
            assert device.refresh_revocations() is None  # no list published yet
            device.download_model(device.card(card.id))  # fine before the revocation
            listed = sign_revocation_list(OPERATOR, 1, card_ids=[card.id])
            assert httpx.post(f"{server.url}/v1/revocations", json=listed,
                              headers={"Authorization": f"Bearer {DEFAULT_ADMIN_TOKEN}"}).status_code == 201
            assert device.refresh_revocations().version == 1
            with pytest.raises(CardSignatureError, match="revoked by the operator's revocation list version 1") as refused:
                device.session(card)
            assert refused.value.reason == "revoked"
    with FedzooClient("http://127.0.0.1:9", cache_dir=tmp_path / "cache", trusted_keys=PINNED,
                      state_file=tmp_path / "state.json") as restarted:  # no server: the held list alone refuses it
        with pytest.raises(CardSignatureError) as refused:
            restarted.download_model(card)
    assert refused.value.reason == "revoked"
    assert json.loads((tmp_path / "state.json").read_text())["revocation_list"] == listed


def test_a_card_is_revoked_by_its_model_sha256_too(federation, scripted_server, tmp_path):
    card = sign_card(federation.card, OPERATOR)
    _serve(scripted_server, {"/v1/revocations": sign_revocation_list(OPERATOR, 3, card_sha256s=[card.sha256])})
    with _device(scripted_server.url, tmp_path) as device:
        device.refresh_revocations()
        with pytest.raises(CardSignatureError, match="by its model sha256") as refused:
            device.download_model(card)
    assert refused.value.reason == "revoked"
    assert not any(request["path"].endswith("/blob") for request in scripted_server.requests)


@pytest.mark.parametrize("served, reason", [
    (sign_revocation_list(OPERATOR, 1), "rollback"),  # a stale list that revokes less
    (sign_revocation_list(OPERATOR, 2), "version_reused"),  # another list under the held version
    (sign_revocation_list(STRANGER, 9), "unknown_key"),
    ({**sign_revocation_list(OPERATOR, 9, card_ids=["x"]), "payload": sign_revocation_list(OPERATOR, 9)["payload"]},
     "bad_signature"),
])
def test_a_lying_server_cannot_roll_the_revocation_list_back(federation, scripted_server, tmp_path, served, reason):
    held = sign_revocation_list(OPERATOR, 2, card_ids=[federation.card.id])
    _serve(scripted_server, {"/v1/revocations": held})
    with _device(scripted_server.url, tmp_path) as device:
        assert device.refresh_revocations().version == 2
        assert device.refresh_revocations().version == 2  # the same list again is fine
        _serve(scripted_server, {"/v1/revocations": served})
        with pytest.raises(CardSignatureError) as refused:
            device.refresh_revocations()
        assert refused.value.reason == reason
        with pytest.raises(CardSignatureError, match="revoked"):
            device.download_model(sign_card(federation.card, OPERATOR))
    assert json.loads((tmp_path / "state.json").read_text())["revocation_list"] == held


def test_a_second_card_for_an_accepted_line_and_version_is_refused(federation, scripted_server, tmp_path):
    """Two plans on one base both published "version 2" of the line: the device accepts the first it meets and
    refuses the other, validly signed as it is, before downloading it, also after a restart."""
    line = federation.card.id
    first = sign_card(federation.card.model_copy(update={"id": "digits-v2-r1", "version": 2, "line": line}), OPERATOR)
    second = sign_card(federation.card.model_copy(update={"id": "digits-v2-r2", "version": 2, "line": line}), OPERATOR)
    _serve(scripted_server, {}, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        device.download_model(first)
        device.download_model(first)  # the same card again is fine
    blob_requests = len(scripted_server.requests)
    with _device(scripted_server.url, tmp_path) as restarted:
        with pytest.raises(CardSignatureError, match="already accepted as card 'digits-v2-r1'") as refused:
            restarted.download_model(second)
    assert refused.value.reason == "version_reused" and len(scripted_server.requests) == blob_requests
    assert json.loads((tmp_path / "state.json").read_text())["accepted_line_cards"] == {line: "digits-v2-r1"}


def test_revocations_need_pinned_keys(tmp_path):
    with FedzooClient("http://127.0.0.1:9", cache_dir=tmp_path / "cache") as device:
        with pytest.raises(InvalidInputError) as refused:
            device.refresh_revocations()
    assert refused.value.field == "trusted_keys"
