"""The server's side of signed model cards: GET /v1/keys, signatures checked on publish and import, its own
key (created once, shared by workers) signing the versions federated rounds publish."""

import json
import threading
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from server_helpers import (ADMIN_TOKEN, REFERENCE_CALIBRATION_MS, config_for_tests, make_card, running_live_server,
                            start_gunicorn, stop_gunicorn, tiny_onnx_model)

from fedzoo.cards import ModelCard
from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.server.testing import LoopbackServer
from fedzoo.errors import InvalidInputError
from fedzoo.server.app import prepare_registry
from fedzoo.server.card_keys import SERVER_KEY_FILE, FleetKeys, load_or_create_key
from fedzoo.server.registry_import import import_zoo_into_registry
from fedzoo.server.config import ServerConfig
from fedzoo.server.errors import ValidationFailed
from fedzoo.server.latency import CalibrationScalingEstimator
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card, verify_card
from fedzoo.zoo import Zoo

OPERATOR = CardSigningKey.from_seed(bytes(range(32)))
STRANGER = CardSigningKey.from_seed(bytes(range(1, 33)))
MODEL = tiny_onnx_model(seed=3)


def _config(tmp_path, **overrides) -> ServerConfig:
    """The test server, trusting OPERATOR; `require_signed_cards` follows FEDZOO_TRUSTED_KEYS (on) unless given."""
    key_set = tmp_path / "operator-keys.json"
    key_set.write_text(json.dumps(TrustedKeys([OPERATOR.public_key_raw]).to_json()))
    environment = {"FEDZOO_TRUSTED_KEYS": str(key_set), **overrides}
    return ServerConfig.from_env(environment, data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN)


def _card(model_id: str = "tiny-a", **fields) -> ModelCard:
    return make_card(MODEL, model_id, accuracy=0.9, macs=1000, **fields)


@pytest.fixture
def trusting_server(tmp_path):
    with running_live_server(_config(tmp_path)) as server:
        yield server


def test_keys_are_public_and_list_the_servers_key_and_the_trusted_operator_keys(trusting_server):
    server_key = CardSigningKey.load(trusting_server.config.data_dir / SERVER_KEY_FILE)
    for token in (None, "not-a-token"):  # no authentication, and a bad token is no reason to refuse
        with trusting_server.client(token) as client:
            answer = client.get("/v1/keys")
        assert answer.status_code == 200
        key_set = TrustedKeys.from_json(answer.json())
        assert key_set.key_ids == sorted([server_key.key_id, OPERATOR.key_id])
    assert all(set(entry) == {"key_id", "algorithm", "public_key"} for entry in answer.json()["keys"])


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_keys_refuse_other_methods_with_a_json_error(trusting_server, method):
    with trusting_server.client(ADMIN_TOKEN) as client:
        answer = client.request(method, "/v1/keys", json={"keys": []})
    assert answer.status_code == 405
    assert answer.json()["error"]["code"] == "method_not_allowed"


def test_an_operator_signed_card_is_published_and_served_with_its_signature(trusting_server):
    card = sign_card(_card(), OPERATOR)
    assert trusting_server.publish(card, MODEL).status_code == 201
    with trusting_server.client() as client:
        served = ModelCard.from_dict(client.get(f"/v1/models/{card.id}").json())
        pinned = TrustedKeys.from_json(client.get("/v1/keys").json())
    verify_card(served, pinned)
    assert served.signature == card.signature


@pytest.mark.parametrize("make, reason", [
    (lambda: sign_card(_card(), OPERATOR).model_copy(update={"version": 7}), "field_mismatch"),
    (lambda: sign_card(_card(), OPERATOR).model_copy(update={"size_bytes": len(MODEL) + 1}), "field_mismatch"),
    (lambda: sign_card(_card(), STRANGER), "unknown_key"),
    (lambda: sign_card(_card(), OPERATOR, timedelta(days=1), now=datetime.now(timezone.utc) - timedelta(days=2)),
     "expired"),
    (lambda: _card(), "unsigned"),
])
def test_a_card_no_trusted_key_vouches_for_is_refused_and_nothing_is_stored(trusting_server, make, reason):
    card = make()
    with trusting_server.admin() as admin:
        admin.put(f"/v1/blobs/{card.sha256}", content=MODEL, headers={"Content-Type": "application/octet-stream"})
    before = trusting_server.snapshot()
    with trusting_server.admin() as admin:
        answer = admin.post("/v1/models", content=card.to_json(), headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["field"], error["code"], error["reason"]) == ("signature", "card_not_trusted", reason)
    assert trusting_server.snapshot() == before


def test_a_bad_signature_is_refused_even_when_unsigned_cards_are_allowed(tmp_path):
    with running_live_server(config_for_tests(tmp_path)) as server:  # out of the box: no trusted keys, not required
        assert server.publish(_card("plain"), MODEL).status_code == 201
        answer = server.publish(sign_card(_card("signed"), OPERATOR), MODEL)
    assert answer.status_code == 422 and answer.json()["error"]["reason"] == "unknown_key"
    assert "FEDZOO_TRUSTED_KEYS" in answer.json()["error"]["message"]


def test_require_signed_cards_follows_trusted_keys_unless_set(tmp_path):
    assert _config(tmp_path).require_signed_cards is True
    assert _config(tmp_path, FEDZOO_REQUIRE_SIGNED_CARDS="0").require_signed_cards is False
    assert ServerConfig.from_env({}, data_dir=tmp_path).require_signed_cards is False
    assert ServerConfig.from_env({"FEDZOO_REQUIRE_SIGNED_CARDS": "yes"}, data_dir=tmp_path).require_signed_cards
    with pytest.raises(InvalidInputError, match="FEDZOO_REQUIRE_SIGNED_CARDS"):
        ServerConfig.from_env({"FEDZOO_REQUIRE_SIGNED_CARDS": "maybe"}, data_dir=tmp_path)


def test_the_server_key_is_created_once_owner_readable_and_shared_by_concurrent_starters(tmp_path):
    path = tmp_path / "data" / SERVER_KEY_FILE
    key_ids, barrier = [], threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        key_ids.append(load_or_create_key(path).key_id)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(key_ids)) == 1 and len(key_ids) == 8
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == [SERVER_KEY_FILE]  # no temporary file left
    assert load_or_create_key(path).key_id == key_ids[0]  # a restart keeps it


def test_gunicorn_workers_started_on_an_empty_data_dir_serve_one_and_the_same_key(tmp_path):
    server = start_gunicorn(tmp_path / "data", workers=3)
    try:
        key_ids = set()
        for _ in range(24):  # a fresh connection each time, so the requests spread over the workers
            key_ids.update(entry["key_id"] for entry in httpx.get(f"{server.base_url}/v1/keys").json()["keys"])
    finally:
        assert stop_gunicorn(server) == 0
    assert key_ids == {CardSigningKey.load(tmp_path / "data" / SERVER_KEY_FILE).key_id}


def test_a_configured_server_key_is_used_and_a_missing_one_is_a_clear_error(tmp_path):
    path = tmp_path / "server.pem"
    OPERATOR.save(path)
    config = ServerConfig.from_env({"FEDZOO_SERVER_SIGNING_KEY": str(path)}, data_dir=tmp_path / "data")
    assert FleetKeys.from_config(config).server_key.key_id == OPERATOR.key_id
    assert not (tmp_path / "data" / SERVER_KEY_FILE).exists()
    missing = ServerConfig.from_env({"FEDZOO_SERVER_SIGNING_KEY": str(tmp_path / "nope.pem")}, data_dir=tmp_path)
    with pytest.raises(InvalidInputError, match="nope.pem"):
        FleetKeys.from_config(missing)


def test_importing_a_zoo_with_one_tampered_card_imports_nothing(tmp_path):
    zoo = Zoo.create(tmp_path / "zoo")
    zoo.add_blob_bytes(MODEL)
    zoo.add_card(sign_card(_card("tiny-a"), OPERATOR))
    zoo.add_card(sign_card(_card("tiny-b"), OPERATOR).model_copy(update={"family": "other"}))
    config = _config(tmp_path)
    estimator = CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS)
    prepare_registry(config, estimator)
    with pytest.raises(ValidationFailed, match="tiny-b") as refused:
        import_zoo_into_registry(config, estimator, zoo.root)
    assert refused.value.field == "signature"
    assert not config.blob_dir.exists() or not any(config.blob_dir.rglob("*"))
    Zoo(zoo.root).sign_cards(OPERATOR)  # re-signing the edited card makes the zoo importable
    assert import_zoo_into_registry(config, estimator, zoo.root) == (2, 2)


def test_a_federated_round_publishes_a_version_signed_by_the_servers_key(tmp_path):
    federation = prepare_federation("digits", num_clients=2, alpha=1.0, hidden_units=8, pretrain_epochs=1, seed=0)
    with LoopbackServer(tmp_path / "server") as server, \
            Simulation(federation, server.url, cache_root=tmp_path / "devices") as simulation:
        simulation.publish_base_model()
        simulation.register_devices()
        records = simulation.run({"min_clients": 2, "target_clients": 2, "deadline_s": 60, "local_epochs": 1,
                                  "batch_size": 32, "learning_rate": 0.05, "max_accuracy_drop": 1.0})  # gate open
        assert records[0].state == "closed", records
        published = simulation.admin.card(records[0].result_model_id)
        key_set = TrustedKeys.from_json(simulation.admin.http.get_json("/v1/keys"))
    server_key = CardSigningKey.load(tmp_path / "server" / SERVER_KEY_FILE)
    assert published.signature.key_id == server_key.key_id and key_set.key_ids == [server_key.key_id]
    verify_card(published, key_set, last_accepted_version=1)
    assert published.version == 2
    assert published.line_id == federation.card.id and published.parent_id == federation.card.id
    assert set(published.unsigned) == {"fleet_latency_factor", "fleet_factor_devices", "retired_by", "revoked_by_list",
                                      "server_evaluation"}


def test_the_server_serves_its_measurements_outside_the_signature_and_never_stores_a_publishers(trusting_server):
    """`unsigned` is the server's: a publisher's block is dropped; the served one changes without re-signing."""
    card = sign_card(_card(), OPERATOR).model_copy(update={"unsigned": {"fleet_latency_factor": 0.01}})
    assert trusting_server.publish(card, MODEL).status_code == 201
    with trusting_server.client() as client:
        served = client.get(f"/v1/models/{card.id}").json()
        listed = client.get("/v1/models").json()["models"]
        pinned = TrustedKeys.from_json(client.get("/v1/keys").json())
    assert served["unsigned"] == {"fleet_latency_factor": None, "fleet_factor_devices": 0, "retired_by": None,
                                  "revoked_by_list": None, "server_evaluation": None}
    assert [entry["unsigned"] for entry in listed] == [served["unsigned"]]
    verify_card(ModelCard.from_dict(served), pinned)
    with trusting_server.client(ADMIN_TOKEN) as client:  # publishing it again, measurements and all: the same card
        assert client.post("/v1/models", json=served).status_code == 200
