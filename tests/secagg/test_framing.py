"""The binary framing of the share replies: the shared vectors, real replies round-trip, and bytes it did not
write are refused as malformed (never half-read)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "vectors"))  # the vector writer (importlib mode)
from secagg_vectors import VECTORS_PATH  # noqa: E402

from fedzoo.secagg import ProtocolViolation, SecAggClient, SecAggConfig, SecAggServer, signatures
from fedzoo.secagg.framing import decode_share_keys, decode_unmask, encode_share_keys, encode_unmask

FRAMING = json.loads(VECTORS_PATH.read_text())["framing"]


@pytest.mark.parametrize("stage, encode, decode", [("share_keys", encode_share_keys, decode_share_keys),
                                                   ("unmask", encode_unmask, decode_unmask)])
def test_the_vectors_frame_and_read_back(stage, encode, decode):
    case = FRAMING[stage]
    assert encode(case["reply"]).hex() == case["framed"]
    assert decode(bytes.fromhex(case["framed"])) == case["reply"]
    framed = bytes.fromhex(case["framed"])
    for broken in (framed[:-1], framed + b"\0", framed[:1]):
        with pytest.raises(ProtocolViolation) as refusal:
            decode(broken)
        assert refusal.value.reason == "malformed"


def test_a_real_rounds_replies_round_trip_at_about_173_bytes_a_neighbour():
    config = SecAggConfig("framing", num_clients=9, neighbour_count=8, threshold=6, vector_length=4, clip_range=1.0)
    keys = {index: signatures.new_signing_key() for index in range(config.num_clients)}
    clients = {index: SecAggClient(config, index, keys[index]) for index in range(config.num_clients)}
    server = SecAggServer(config, {index: signatures.public_bytes(key) for index, key in keys.items()})
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    replies = [clients[index].share_keys(request) for index, request in requests.items()]
    requests = server.collect_shares(replies)
    masked = [clients[index].masked_input(request, np.zeros(5, dtype=np.uint16)) for index, request in requests.items()]
    requests = server.collect_masked_inputs(masked)
    checked = [clients[index].consistency_check(request) for index, request in requests.items()]
    unmask = [clients[index].unmask(request) for index, request in server.collect_consistency(checked).items()]
    for reply, framed_reply in ((replies[0], encode_share_keys(replies[0])), (unmask[0], encode_unmask(unmask[0]))):
        decoded = (decode_share_keys if "self_mask_seed_commitment" in reply else decode_unmask)(framed_reply)
        assert decoded == {key: value for key, value in reply.items() if key not in ("stage", "client")}
    per_neighbour = (len(encode_share_keys(replies[0])) + len(encode_unmask(unmask[0]))) / config.neighbour_count
    assert 168 <= per_neighbour <= 180
    as_json = len(json.dumps(replies[0])) + len(json.dumps(unmask[0]))
    assert as_json / config.neighbour_count > 1.8 * per_neighbour


def test_bad_kinds_and_ids_are_refused():
    with pytest.raises(ProtocolViolation):
        decode_unmask(b"\x00\x01\x00\x02\x05" + bytes(33) + b"\x00\x00")  # kind 5
    with pytest.raises(ProtocolViolation):
        encode_unmask({"shares": [{"owner": 70_000, "kind": "self_mask", "value": "AA=="}], "undecryptable": []})
    with pytest.raises(ProtocolViolation):
        encode_share_keys({"self_mask_seed_commitment": "AA==", "shares": []})
