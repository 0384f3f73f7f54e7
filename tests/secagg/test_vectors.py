"""The shared SecAgg+ test vectors: the committed file is what the writer writes, and this SDK reproduces it."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "vectors"))  # the vector writer (importlib mode)
from secagg_vectors import CONFIG, VECTORS_PATH, vectors_text  # noqa: E402

from fedzoo.secagg import ProtocolViolation, SecAggClient, SecAggConfig, SecAggServer, quantise
from fedzoo.secagg import crypto, signatures
from fedzoo.secagg.client import MASK_KEY, SELF_MASK, self_mask_commitment, share_commitment
from fedzoo.secagg.graph import advertised_bytes, graph_seed, neighbours, read_advertised
from fedzoo.secagg.messages import from_base64, to_base64
from fedzoo.secagg.shamir import combine_shares

VECTORS = json.loads(VECTORS_PATH.read_text())


def test_the_committed_vectors_are_what_the_writer_writes():
    assert VECTORS_PATH.read_text() == vectors_text()


def test_key_derivation_agreement_and_masks():
    config = SecAggConfig.from_dict(VECTORS["config"])
    assert config == CONFIG and config.context.decode() == VECTORS["context"]
    hkdf = VECTORS["hkdf"]
    assert crypto.derive_key(bytes.fromhex(hkdf["secret"]), hkdf["purpose"], config.context).hex() == hkdf["key"]
    x25519 = VECTORS["x25519"]
    bob = crypto.load_private_key(bytes.fromhex(x25519["bob_private"]))
    assert crypto.public_bytes(bob).hex() == x25519["bob_public"]
    assert crypto.agree(bob, bytes.fromhex(x25519["alice_public"]), x25519["purpose"], config.context).hex() == x25519["key"]
    mask = VECTORS["mask"]
    for bits in (16, 32):
        values = crypto.mask(bytes.fromhex(mask["key"]), mask["length"], bits)
        assert values[:8].tolist() == mask[f"first_{bits}bit"]
        assert hashlib.sha256(values.tobytes()).hexdigest() == mask[f"sha256_{bits}bit"]


def test_share_decryption_shamir_and_commitments():
    case = VECTORS["share_decryption"]
    plaintext = crypto.decrypt(bytes.fromhex(case["key"]), bytes.fromhex(case["ciphertext"]),
                               bytes.fromhex(case["associated_data"]))
    assert plaintext.hex() == case["plaintext"]
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(bytes.fromhex(case["key"]), bytes.fromhex(case["ciphertext"]), b"another context")
    shamir = VECTORS["shamir"]
    shares = [(x, int(value, 16)) for x, value in shamir["shares"]]
    for start in range(len(shares) - shamir["threshold"] + 1):
        assert combine_shares(shares[start:], shamir["threshold"]).hex() == shamir["secret"]
    commitments = VECTORS["commitments"]
    for kind, name in ((SELF_MASK, "self_mask_share"), (MASK_KEY, "mask_key_share")):
        case = commitments[name]
        assert share_commitment(CONFIG, kind, case["owner"], case["holder"], int(case["value"], 16)) == case["commitment"]
    seed = commitments["self_mask_seed"]
    assert self_mask_commitment(CONFIG, seed["owner"], bytes.fromhex(seed["seed"])) == seed["commitment"]


def test_graph_and_quantisation():
    graph = VECTORS["graph"]
    nonces = {int(client): bytes.fromhex(nonce) for client, nonce in graph["nonces"].items()}
    assert advertised_bytes(nonces).hex() == graph["advertised"]
    assert read_advertised(bytes.fromhex(graph["advertised"]), CONFIG.num_clients) == nonces
    seed = graph_seed(CONFIG, nonces)
    assert seed.hex() == graph["seed"]
    assert {str(client): peers for client, peers in neighbours(CONFIG, seed).items()} == graph["neighbours"]
    case = VECTORS["quantise"]
    for generator_seed in range(3):  # on exact levels the rounding does not depend on the generator
        ring = quantise(np.array(case["vector"]), CONFIG, case["weight"], np.random.default_rng(generator_seed))
        assert ring.tolist() == case["ring"]


def test_signed_payloads_and_signatures():
    case = VECTORS["signing"]
    key = signatures.load_signing_key(bytes.fromhex(case["private_key"]))
    public_key = bytes.fromhex(case["public_key"])
    assert signatures.public_bytes(key) == public_key
    assert signatures.config_digest(CONFIG).hex() == case["config_digest"]
    advertise = case["advertise"]
    keys = bytes.fromhex(advertise["cipher_public_key"]), bytes.fromhex(advertise["mask_public_key"])
    nonce = bytes.fromhex(advertise["nonce"])
    payload = signatures.advertise_payload(CONFIG, advertise["client"], *keys, nonce)
    consistency = case["consistency"]
    survivors = consistency["survivors"]
    signer, seed = consistency["client"], bytes.fromhex(consistency["graph_seed"])
    for signed, expected in ((payload, advertise),
                             (signatures.consistency_payload(CONFIG, signer, *keys, nonce, seed, survivors), consistency),
                             (signatures.consistency_payload(CONFIG, signer, *keys, nonce, seed, survivors[::-1]),
                              consistency)):
        assert signed.hex() == expected["payload"]
        assert key.sign(signed).hex() == expected["signature"]
        assert signatures.verify(public_key, bytes.fromhex(expected["signature"]), signed)
        assert not signatures.verify(public_key, bytes.fromhex(expected["signature"]), signed[:-1] + b"\x00")
    other_round = SecAggConfig.from_dict(dict(VECTORS["config"], round_id="vector-round-2"))
    for other in (signatures.consistency_payload(other_round, signer, *keys, nonce, seed, survivors),
                  signatures.consistency_payload(CONFIG, signer, *keys, bytes(32), seed, survivors),
                  signatures.consistency_payload(CONFIG, signer, *keys, nonce, bytes(32), survivors)):
        assert other.hex() != consistency["payload"]


def _round_through_masked_inputs():
    keys = {index: signatures.new_signing_key() for index in range(CONFIG.num_clients)}
    clients = {index: SecAggClient(CONFIG, index, keys[index]) for index in range(CONFIG.num_clients)}
    server = SecAggServer(CONFIG, {index: signatures.public_bytes(key) for index, key in keys.items()})
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    requests = server.collect_shares([clients[i].share_keys(r) for i, r in requests.items()])
    for index, client in clients.items():
        client.masked_input(requests[index], np.zeros(CONFIG.vector_length + 1, dtype=np.uint16))
    return clients


def _resolved(request, client):
    """The request with "neighbour" / "stranger" signers replaced by one of `client`'s neighbours / another client."""
    stand_ins = {"neighbour": min(client.neighbours),
                 "stranger": min(set(range(CONFIG.num_clients)) - client.neighbours - {client.client})}
    signed = [dict(entry, client=stand_ins.get(entry["client"], entry["client"]))
              for entry in request.get("signatures", [])]
    return dict(request, signatures=signed) if "signatures" in request else request


@pytest.mark.parametrize("case", VECTORS["refusals"], ids=lambda case: case["reason"])
def test_refusals(case):
    client = _round_through_masked_inputs()[case["client"]]
    if case["signed_survivors"] is not None:
        client.consistency_check({"stage": "consistency_check", "survivors": case["signed_survivors"]})
    with pytest.raises(ProtocolViolation) as refusal:
        getattr(client, "unmask" if case["signed_survivors"] is not None else "consistency_check")(
            _resolved(case["request"], client))
    assert refusal.value.reason == case["reason"]


@pytest.mark.parametrize("config", VECTORS["bounds_refusals"], ids=lambda config: str(config["neighbour_count"]))
def test_configurations_outside_the_default_bounds_are_refused(config):
    with pytest.raises(ProtocolViolation) as refusal:
        SecAggClient(SecAggConfig.from_dict(config), 0, signatures.new_signing_key())
    assert refusal.value.reason == "config_out_of_bounds"


STAGED = VECTORS["staged_refusals"]
STAGED_CONFIG = SecAggConfig.from_dict(STAGED["config"])


def _in_this_run(request, nonces):
    """A staged step as the server sends it in a run where client 0 advertised `nonces[0]`: a share_keys step with
    the advertised list, an unmask step with each listed signature made in this run by the client `signed_by`
    names (see tests/vectors/secagg_vectors.py)."""
    if request["stage"] == "share_keys":
        return dict(request, advertised=to_base64(advertised_bytes(nonces)))
    if request["stage"] != "unmask":
        return request
    seed = graph_seed(STAGED_CONFIG, nonces)
    neighbours_by_id = {neighbour["client"]: neighbour for neighbour in STAGED["neighbours"]}

    def signature(signer):
        neighbour = neighbours_by_id[signer]
        payload = signatures.consistency_payload(
            STAGED_CONFIG, signer, *(bytes.fromhex(neighbour[name]) for name in ("cipher_public_key", "mask_public_key",
                                                                                 "nonce")),
            seed, request["survivors"])
        return to_base64(signatures.load_signing_key(bytes.fromhex(neighbour["signing_private_key"])).sign(payload))

    return dict(request, signatures=[{"client": entry["client"], "signature": signature(entry["signed_by"])}
                                     for entry in request["signatures"]])


def _answer(client, request):
    if request["stage"] == "masked_input":
        return client.masked_input(request, np.zeros(STAGED_CONFIG.vector_length + 1, dtype=np.uint16))
    return getattr(client, request["stage"])(request)


@pytest.mark.parametrize("case", STAGED["cases"], ids=lambda case: case["name"])
def test_staged_refusals(case):
    client = SecAggClient(STAGED_CONFIG, case["client"], signatures.new_signing_key())
    nonces = {neighbour["client"]: bytes.fromhex(neighbour["nonce"]) for neighbour in STAGED["neighbours"]}
    nonces[case["client"]] = from_base64(client.advertise_keys()["nonce"], "nonce")
    *accepted, refused = (_in_this_run(request, nonces) for request in case["steps"])
    for request in accepted:
        _answer(client, request)
    with pytest.raises(ProtocolViolation) as refusal:
        _answer(client, refused)
    assert refusal.value.reason == case["reason"]
