"""A device takes part in a SecAgg+ round id once, and remembers it across restarts (issue #44)."""

import json

import pytest

from fedzoo.clients.device_state import SIGNED_ROUNDS_STATE, StateFileSignedRounds, update_state
from fedzoo.secagg import ProtocolViolation, SecAggClient, SecAggConfig, signatures


def test_a_round_id_claimed_once_is_refused_after_a_restart_and_kept_with_the_rest_of_the_state(tmp_path):
    path = tmp_path / "client.json"
    update_state(path, {"server": "https://fl.example", "token": "secret"})
    StateFileSignedRounds(path).claim("fl-round-7")
    with pytest.raises(ProtocolViolation) as refusal:
        StateFileSignedRounds(path).claim("fl-round-7")  # a new process reading the same state
    assert refusal.value.reason == "round_replayed"
    StateFileSignedRounds(path).claim("fl-round-8")
    state = json.loads(path.read_text())
    assert state["token"] == "secret" and len(state[SIGNED_ROUNDS_STATE]) == 2
    assert "fl-round-7" not in path.read_text()  # digests only
    update_state(path, {"server": "https://other.example"})
    StateFileSignedRounds(path).claim("fl-round-7")  # another server's round of the same name


def test_a_client_refuses_to_advertise_keys_twice_under_one_round_id(tmp_path):
    config = SecAggConfig("fl-round-3", 10, 6, 5, 4, 1.0)
    key = signatures.new_signing_key()
    memory = StateFileSignedRounds(tmp_path / "client.json")
    assert SecAggClient(config, 2, key, signed_rounds=memory).advertise_keys()["nonce"]
    again = SecAggClient(config, 2, key, signed_rounds=StateFileSignedRounds(tmp_path / "client.json"))
    with pytest.raises(ProtocolViolation) as refusal:
        again.advertise_keys()
    assert refusal.value.reason == "round_replayed"


def test_the_sdk_client_keeps_its_round_memory_in_its_state_file(tmp_path):
    from fedzoo.clients.client import FedzooClient

    path = tmp_path / "client.json"
    with FedzooClient("http://127.0.0.1:9", cache_dir=tmp_path / "cache", state_file=path) as client:
        client.signed_rounds.claim("fl-round-1")
    with FedzooClient("http://127.0.0.1:9", cache_dir=tmp_path / "cache", state_file=path) as restarted:
        with pytest.raises(ProtocolViolation) as refusal:
            restarted.signed_rounds.claim("fl-round-1")
    assert refusal.value.reason == "round_replayed"


def test_a_device_takes_part_in_one_cohort_of_a_round(tmp_path):
    """A zoo-wide round runs one SecAgg+ cohort per subnet (`fl-round-<id>/subnet-<i>`): a lying server that seats a
    device in two cohorts of one round (to difference their sums) is refused at the second."""
    memory = StateFileSignedRounds(tmp_path / "client.json")
    memory.claim("fl-round-7/subnet-0")
    for replay in ("fl-round-7/subnet-1", "fl-round-7"):
        with pytest.raises(ProtocolViolation) as refusal:
            memory.claim(replay)
        assert refusal.value.reason == "round_replayed"
    memory.claim("fl-round-70/subnet-0")  # another round
