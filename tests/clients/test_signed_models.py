"""Attacks on what a device downloads, each refused by the SDK before onnxruntime sees a byte: a blob swapped
in transit or on disk, card fields edited after signing, a stranger's key, an expired card, an unsigned card,
a rollback to an older version (also after a restart), a round task naming blobs its card does not sign, a
card of another model answered for the one asked for, a second card for a line and version already accepted, a
card the operator's revocation list revokes (and a stale list a lying server serves to un-revoke it).
The genuine path runs against the real server with keys fetched from GET /v1/keys; the attacks come from a scripted server playing a compromised one."""

import json
import re
import shutil
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import onnxruntime
import pytest
from click.testing import CliRunner

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.cards import ModelCard
from fedzoo.clients.card_trust import CardVerifier
from fedzoo.clients.cli import client as client_cli
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.errors import CardSignatureError, IntegrityError
from fedzoo.clients.participation import participate_once, run_task
from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.errors import InvalidInputError
from fedzoo.revocation import sign_revocation_list
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card

OPERATOR = CardSigningKey.from_seed(bytes(range(32)))
STRANGER = CardSigningKey.from_seed(bytes(range(1, 33)))
PINNED = TrustedKeys([OPERATOR.public_key_raw])


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=2, alpha=1.0, hidden_units=8, pretrain_epochs=1, seed=0)


@pytest.fixture
def loaded_models(monkeypatch):
    """Every model onnxruntime is asked to load, recorded (the sessions are real)."""
    loaded = []
    real_session = onnxruntime.InferenceSession

    def recording_session(model, *args, **kwargs):
        loaded.append(model)
        return real_session(model, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", recording_session)
    return loaded


def _serve(scripted_server, card: ModelCard, blob: bytes) -> None:
    """A compromised server: answers this card and these bytes for its blob, whatever they are."""

    def handle(handler):
        body = blob if handler.path.endswith("/blob") else card.to_json().encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    scripted_server.handle = handle


def _device(url, tmp_path, trusted=PINNED) -> FedzooClient:
    return FedzooClient(url, cache_dir=tmp_path / "cache", trusted_keys=trusted, state_file=tmp_path / "state.json")


def test_a_card_signed_by_a_key_fetched_from_the_server_downloads_verifies_and_runs(federation, tmp_path,
                                                                                   loaded_models):
    key_set = tmp_path / "operator-keys.json"
    key_set.write_text(json.dumps(PINNED.to_json()))
    with LoopbackServer(tmp_path / "server", trusted_keys=key_set) as server:
        with OperatorClient(server.url, cache_dir=tmp_path / "admin") as admin:
            admin.publish_model(sign_card(federation.card, OPERATOR), federation.blobs, DEFAULT_ADMIN_TOKEN)
        pinned = TrustedKeys.from_json(httpx.get(f"{server.url}/v1/keys").json())  # out of band, once
        assert OPERATOR.key_id in pinned.key_ids
        with _device(server.url, tmp_path, pinned) as device:
            card = device.card(federation.card.id)
            logits = device.session(card).run(federation.split.test.x[:8])
    assert logits.shape == (8, len(card.labels)) and np.isfinite(logits).all()
    device_loads = [model for model in loaded_models if str(tmp_path / "cache") in str(model)]  # not the server's
    assert device_loads == [str(device.cache.blob_path(card.sha256))]
    assert json.loads((tmp_path / "state.json").read_text())["accepted_line_versions"] == {card.line_id: 1}


def test_swapped_blob_bytes_are_refused_and_never_loaded(federation, scripted_server, tmp_path, loaded_models):
    card = sign_card(federation.card, OPERATOR)
    swapped = federation.model.replace(federation.model[-64:], bytes(64))
    _serve(scripted_server, card, swapped)
    with _device(scripted_server.url, tmp_path) as device:
        with pytest.raises(IntegrityError, match="hashing to"):
            device.session(card)
        assert device.cache.get(card.sha256) is None
    assert loaded_models == []
    assert not (tmp_path / "state.json").exists()  # a refused card is not an accepted version


def test_a_cached_blob_altered_on_disk_is_refused_before_loading(federation, scripted_server, tmp_path, loaded_models):
    card = sign_card(federation.card, OPERATOR)
    _serve(scripted_server, card, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        path = device.download_model(card)
        path.write_bytes(path.read_bytes()[:-1] + b"\x00")
        with pytest.raises(IntegrityError, match="cached blob"):
            device.session(card)
        assert not path.exists()
    assert loaded_models == []


@pytest.mark.parametrize("forge, reason", [
    (lambda card: card.model_copy(update={"sha256": "0" * 64}), "field_mismatch"),
    (lambda card: card.model_copy(update={"version": 9}), "field_mismatch"),
    (lambda card: card.model_copy(update={"training_graph": None}), "field_mismatch"),
    (lambda card: card.model_copy(update={"labels": card.labels[::-1]}), "field_mismatch"),
    (lambda card: card.model_copy(update={"input": card.input.model_copy(update={"normalisation": None})}),
     "field_mismatch"),
    (lambda card: sign_card(card, STRANGER), "unknown_key"),
    (lambda card: sign_card(card, OPERATOR, timedelta(days=1), now=datetime.now(timezone.utc) - timedelta(days=3)),
     "expired"),
    (lambda card: card.model_copy(update={"signature": None}), "unsigned"),
])
def test_a_forged_card_is_refused_before_a_single_byte_is_downloaded(federation, scripted_server, tmp_path,
                                                                    loaded_models, forge, reason):
    forged = forge(sign_card(federation.card, OPERATOR))
    _serve(scripted_server, forged, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        with pytest.raises(CardSignatureError) as refused:
            device.session(forged.model_dump(mode="json"))
    assert refused.value.reason == reason
    assert scripted_server.requests == [] and loaded_models == []


def test_a_rollback_to_an_older_version_is_refused_even_after_a_restart(federation, scripted_server, tmp_path,
                                                                      loaded_models):
    newer = sign_card(federation.card.model_copy(update={"id": "digits-v2", "version": 2,
                                                         "line": federation.card.id}), OPERATOR)
    older = sign_card(federation.card, OPERATOR)
    _serve(scripted_server, newer, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        device.session(newer)
        with pytest.raises(CardSignatureError, match="rollback refused") as refused:
            device.session(older)
        assert refused.value.reason == "rollback"
    with _device(scripted_server.url, tmp_path) as restarted:
        with pytest.raises(CardSignatureError, match="rollback refused"):
            restarted.download_model(older)
        restarted.download_model(newer)  # the same version stays acceptable
    assert len(loaded_models) == 1


def test_rollback_is_kept_per_line_in_the_state_directory_not_the_cache(federation, scripted_server, tmp_path):
    """Another line of the same family at version 1 is no rollback; clearing the cache resets nothing."""
    newer = sign_card(federation.card.model_copy(update={"id": "digits-v2", "version": 2,
                                                         "line": federation.card.id}), OPERATOR)
    other_line = sign_card(federation.card.model_copy(update={"id": "digits-pruned"}), OPERATOR)
    older = sign_card(federation.card, OPERATOR)
    _serve(scripted_server, newer, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        device.download_model(newer)
        device.download_model(other_line)
    shutil.rmtree(tmp_path / "cache")
    with _device(scripted_server.url, tmp_path) as device:
        with pytest.raises(CardSignatureError) as refused:
            device.download_model(older)
    assert refused.value.reason == "rollback"
    assert json.loads((tmp_path / "state.json").read_text())["accepted_line_versions"] == {
        federation.card.id: 2, "digits-pruned": 1}


def test_accepting_is_a_compare_and_swap_against_a_newer_version_accepted_meanwhile(federation, tmp_path):
    """Two processes verify concurrently: the one whose version became stale cannot write it over the newer."""
    newer = sign_card(federation.card.model_copy(update={"id": "digits-v3", "version": 3,
                                                         "line": federation.card.id}), OPERATOR)
    older = sign_card(federation.card, OPERATOR)
    first, second = (CardVerifier(PINNED, tmp_path / "state" / "client.json") for _ in range(2))
    first.verify(older)  # passes: nothing accepted yet
    second.verify(newer)
    second.accept(newer)
    with pytest.raises(CardSignatureError, match="older than version 3, accepted meanwhile") as refused:
        first.accept(older)
    assert refused.value.reason == "rollback"
    assert first.accepted_version(federation.card.id) == 3


def test_accepting_is_a_compare_and_swap_against_another_card_accepted_meanwhile_at_that_version(federation,
                                                                                              tmp_path):
    """Two processes each verify one of two cards both calling themselves version 2 of the line: the second to
    accept is refused (version_reused); a newer version is another card and is accepted."""
    line = federation.card.id
    first, second, newer = (sign_card(federation.card.model_copy(update={"id": card_id, "version": version,
                                                                         "line": line}), OPERATOR)
                            for card_id, version in (("digits-v2-r1", 2), ("digits-v2-r2", 2), ("digits-v3", 3)))
    one, other = (CardVerifier(PINNED, tmp_path / "state" / "client.json") for _ in range(2))
    one.verify(second)  # passes: nothing accepted yet
    other.verify(first)
    other.accept(first)
    other.accept(first)  # the same card again is fine
    with pytest.raises(CardSignatureError, match="accepted meanwhile as card 'digits-v2-r1'") as refused:
        one.accept(second)
    assert refused.value.reason == "version_reused"
    one.verify(newer)
    one.accept(newer)
    state = json.loads((tmp_path / "state" / "client.json").read_text())
    assert state["accepted_line_versions"] == {line: 3} and state["accepted_line_cards"] == {line: "digits-v3"}


def _serve_shortlist(scripted_server, card: ModelCard, blob: bytes, latency_ms: float = 0.01,
                     latency_source: str = "predicted") -> None:
    """A compromised server whose lookup shortlists `card` (said to fit), served with these bytes."""
    entry = {"model_id": card.id, "sha256": card.sha256, "size_bytes": card.size_bytes, "latency_ms": latency_ms,
             "latency_source": latency_source, "accuracy": 0.9}
    answer = json.dumps({"model": json.loads(card.to_json()), "latency_ms": latency_ms,
                         "shortlist": [entry]}).encode()

    def handle(handler):
        telemetry = handler.path == "/v1/telemetry"
        body = (b"{}" if telemetry else answer if handler.path == "/v1/lookup" else
                blob if handler.path.endswith("/blob") else card.to_json().encode())
        handler.send_response(201 if telemetry else 200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    scripted_server.handle = handle


@pytest.mark.parametrize("tamper", [
    lambda card: card.model_copy(update={"labels": card.labels[::-1]}),
    lambda card: card.model_copy(update={"input": card.input.model_copy(update={"normalisation": None})}),
    lambda card: sign_card(card, STRANGER),
])
def test_confirmed_lookup_refuses_a_tampered_shortlisted_card_before_downloading_it(
        federation, scripted_server, tmp_path, tamper):
    tampered = tamper(sign_card(federation.card, OPERATOR))
    _serve_shortlist(scripted_server, tampered, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        with pytest.raises(CardSignatureError):
            device.lookup_confirmed(federation.card.task, latency_budget_ms=50.0)
    assert not any(request["path"].endswith("/blob") for request in scripted_server.requests)
    assert not (tmp_path / "state.json").exists()


def test_confirmed_lookup_refuses_bytes_that_are_not_the_signed_cards(federation, scripted_server, tmp_path):
    card = sign_card(federation.card, OPERATOR)
    _serve_shortlist(scripted_server, card, federation.model.replace(federation.model[-64:], bytes(64)))
    with _device(scripted_server.url, tmp_path) as device:
        with pytest.raises(IntegrityError, match="hashing to"):
            device.lookup_confirmed(federation.card.task, latency_budget_ms=50.0)
        assert device.cache.get(card.sha256) is None


def test_confirmed_lookup_times_a_verified_shortlisted_model(federation, scripted_server, tmp_path):
    card = sign_card(federation.card, OPERATOR)
    _serve_shortlist(scripted_server, card, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        answer = device.lookup_confirmed(federation.card.task, latency_budget_ms=1000.0)
    assert answer["confirmed"] and [entry["model_id"] for entry in answer["measurements"]] == [card.id]
    assert json.loads((tmp_path / "state.json").read_text())["accepted_line_versions"] == {card.line_id: 1}


def test_card_refuses_a_validly_signed_card_of_another_model(federation, scripted_server, tmp_path):
    """Asked for one model, a lying server answers another model's genuine signed card: it would verify, so
    `card(model_id)` itself refuses it, and nothing is downloaded."""
    other = sign_card(federation.card, OPERATOR)
    _serve(scripted_server, other, federation.model)
    with _device(scripted_server.url, tmp_path) as device:
        with pytest.raises(IntegrityError, match="asked for the card of 'digits-pinned'"):
            device.card("digits-pinned")
        with pytest.raises(IntegrityError):
            device.card_json("digits-pinned")
        assert device.card(other.id) == other
    assert [request["path"] for request in scripted_server.requests] == ["/v1/models/digits-pinned"] * 2 + [
        f"/v1/models/{other.id}"]


def test_a_model_the_server_labels_measured_is_still_timed_on_the_device(federation, scripted_server, tmp_path):
    """A lying server says the model was measured at 0 ms: the device times it itself, finds it over a budget
    no real model meets, and does not call the server's choice confirmed."""
    card = sign_card(federation.card, OPERATOR)
    _serve_shortlist(scripted_server, card, federation.model, latency_ms=0.0, latency_source="measured")
    with _device(scripted_server.url, tmp_path) as device:
        answer = device.lookup_confirmed(federation.card.task, latency_budget_ms=1e-9)
    assert [(entry["model_id"], entry["fits"]) for entry in answer["measurements"]] == [(card.id, False)]
    assert not answer["confirmed"]
    assert any(request["path"].endswith("/blob") for request in scripted_server.requests)


def test_pinned_keys_without_a_state_file_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="state_file") as refused:
        FedzooClient("http://127.0.0.1:9", cache_dir=tmp_path / "cache", trusted_keys=PINNED)
    assert refused.value.field == "state_file"


@pytest.mark.parametrize("state, what", [([], "is not a JSON object"),
                                          ({"accepted_line_versions": [3]}, "accepted_line_versions is not"),
                                          ({"accepted_line_cards": "digits-v2"}, "accepted_line_cards is not")])
def test_a_state_file_that_does_not_say_what_was_accepted_is_refused_not_guessed(federation, tmp_path, state, what):
    """Read as empty, such a file would let any older card through; the device refuses until it is repaired."""
    path = tmp_path / "state" / "client.json"
    path.parent.mkdir()
    path.write_text(json.dumps(state))
    with pytest.raises(InvalidInputError, match=f"^client state {re.escape(str(path))}:? {what}") as refused:
        CardVerifier(PINNED, path).verify(sign_card(federation.card, OPERATOR))
    assert refused.value.field == "state"


@pytest.mark.parametrize("recorded", ["9", None, 9.5, True, 0, -3])
def test_a_recorded_version_that_is_not_a_whole_number_is_refused_not_read_as_nothing_accepted(federation, tmp_path,
                                                                                                recorded):
    """A device whose state file says `{"line": "9"}` has accepted something: reading it as "nothing accepted" would
    let any older card of that line through, so both checking and accepting refuse until the file is repaired."""
    card = sign_card(federation.card, OPERATOR)
    path = tmp_path / "state" / "client.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"accepted_line_versions": {card.line_id: recorded}}))
    verifier = CardVerifier(PINNED, path)
    for step in (verifier.verify, verifier.accept):
        with pytest.raises(InvalidInputError, match=f"^client state {re.escape(str(path))}: the version accepted for "
                                                    f"line {re.escape(repr(card.line_id))} is .*not a whole number") \
                as refused:
            step(card)
        assert refused.value.field == "state"
    assert json.loads(path.read_text())["accepted_line_versions"] == {card.line_id: recorded}, "nothing is rewritten"


def test_without_pinned_keys_the_sdk_keeps_working_as_before(federation, scripted_server, tmp_path):
    _serve(scripted_server, federation.card, federation.model)
    with FedzooClient(scripted_server.url, cache_dir=tmp_path / "cache") as device:
        assert not device.signed_cards_required
        assert device.download_model(federation.card).read_bytes() == federation.model


def test_the_cli_pins_trusted_keys_in_its_state_file_and_refuses_a_forged_card(federation, scripted_server, tmp_path):
    key_set = tmp_path / "fleet-keys.json"
    key_set.write_text(json.dumps(PINNED.to_json()))
    state = tmp_path / "client.json"
    base = ["--server", scripted_server.url, "--state", str(state), "--cache-dir", str(tmp_path / "cache")]
    _serve(scripted_server, sign_card(federation.card, OPERATOR), federation.model)
    result = CliRunner().invoke(client_cli, [*base, "--trusted-keys", str(key_set), "download", federation.card.id])
    assert result.exit_code == 0, result.output
    saved = json.loads(state.read_text())
    assert saved["trusted_keys"] == PINNED.to_json() and saved["accepted_line_versions"] == {federation.card.line_id: 1}
    assert state.stat().st_mode & 0o777 == 0o600
    _serve(scripted_server, sign_card(federation.card, STRANGER), federation.model)
    result = CliRunner().invoke(client_cli, [*base, "download", federation.card.id])  # pinned from the state file
    assert result.exit_code != 0 and isinstance(result.exception, CardSignatureError)
    assert result.exception.reason == "unknown_key"


def test_a_pinned_device_takes_part_in_a_round_and_refuses_a_task_naming_blobs_its_card_does_not_sign(
        federation, tmp_path, loaded_models):
    key_set = tmp_path / "operator-keys.json"
    key_set.write_text(json.dumps(PINNED.to_json()))
    with LoopbackServer(tmp_path / "server", trusted_keys=key_set) as server, \
            Simulation(federation, server.url, cache_root=tmp_path / "sim", operator_key=OPERATOR) as simulation:
        simulation.publish_base_model(signing_key=OPERATOR)
        simulation.register_devices()  # and certifies their keys with OPERATOR, the key this server trusts
        simulation.start_plan({"min_clients": 1, "target_clients": 2, "deadline_s": 60, "local_epochs": 1,
                               "batch_size": 32, "learning_rate": 0.05})
        pinned = TrustedKeys.from_json(httpx.get(f"{server.url}/v1/keys").json())
        devices = [FedzooClient(server.url, token=simulation.tokens[index], cache_dir=tmp_path / f"device-{index}",
                                trusted_keys=pinned, state_file=tmp_path / f"state-{index}" / "client.json")
                   for index in range(2)]
        work = devices[0].fl_task(federation.card.task)["task"]
        forged = {**work, "model_sha256": "0" * 64, "model_url": "/v1/blobs/" + "0" * 64}
        with pytest.raises(IntegrityError, match="does not"):
            run_task(devices[0], forged, federation.client_data(0))
        assert devices[0].downloaded_bytes == 0 and not any("device-0" in str(model) for model in loaded_models)
        result = participate_once(devices[1], federation.card.task, federation.client_data(1))
        for device in devices:
            device.close()
    assert result.outcome == "accepted"
    assert json.loads((tmp_path / "state-1" / "client.json").read_text())["accepted_line_versions"] == {
        federation.card.line_id: 1}


def _serve_documents(scripted_server, documents: dict[str, object], blob: bytes = b"") -> None:
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
        with OperatorClient(server.url, cache_dir=tmp_path / "admin") as admin:
            admin.publish_model(card, federation.blobs, DEFAULT_ADMIN_TOKEN)
        with _device(server.url, tmp_path) as device:
            assert device.refresh_revocations() is None  # no list published yet
            device.download_model(device.card(card.id))  # fine before the revocation
            listed = sign_revocation_list(OPERATOR, 1, card_ids=[card.id])
            assert httpx.post(f"{server.url}/v1/revocations", json=listed,
                              headers={"Authorization": f"Bearer {DEFAULT_ADMIN_TOKEN}"}).status_code == 201
            assert device.refresh_revocations().version == 1
            with pytest.raises(CardSignatureError, match="revoked by the operator's revocation list version 1") as \
                    refused:
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
    listed = sign_revocation_list(OPERATOR, 3, card_sha256s=[card.sha256])
    _serve_documents(scripted_server, {"/v1/revocations": listed})
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
    _serve_documents(scripted_server, {"/v1/revocations": held})
    with _device(scripted_server.url, tmp_path) as device:
        assert device.refresh_revocations().version == 2
        assert device.refresh_revocations().version == 2  # the same list again is fine
        _serve_documents(scripted_server, {"/v1/revocations": served})
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
    _serve_documents(scripted_server, {}, federation.model)
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
    assert refused.value.field == "operator_keys"


def test_the_held_list_outlives_a_rotation_of_the_pinned_keys(federation, scripted_server, tmp_path):
    """The operator rotates keys (the old one retired from the pinned set): the list the device verified under the
    old key still revokes, and the next list, signed by the new key, must still be newer."""
    new_key = CardSigningKey.from_seed(bytes(range(2, 34)))
    listed = sign_revocation_list(OPERATOR, 5, card_ids=[federation.card.id])
    _serve_documents(scripted_server, {"/v1/revocations": listed})
    with _device(scripted_server.url, tmp_path) as device:
        device.refresh_revocations()
    rotated = TrustedKeys([new_key.public_key_raw])
    with _device(scripted_server.url, tmp_path, rotated) as device:
        with pytest.raises(CardSignatureError) as refused:
            device.download_model(sign_card(federation.card, new_key))
        assert refused.value.reason == "revoked"
        _serve_documents(scripted_server, {"/v1/revocations": sign_revocation_list(new_key, 4)})
        with pytest.raises(CardSignatureError) as stale:
            device.refresh_revocations()
        assert stale.value.reason == "rollback"
        _serve_documents(scripted_server, {"/v1/revocations": sign_revocation_list(new_key, 6)}, federation.model)
        assert device.refresh_revocations().version == 6
        device.download_model(sign_card(federation.card, new_key))  # no longer revoked
