"""Whole SecAgg+ rounds: exact sums whoever drops out when, lying servers refused, bad shares caught.

The two attacks of issue #34 are reproduced in full: each is first run against clients with the defence taken
out, to show the attack really reads the victim's input, then against the real clients, which refuse it."""

import base64
import math
import os
import random
from fractions import Fraction

import numpy as np
import pytest

import fedzoo.secagg.client as client_module
from fedzoo.secagg import (
    ProtocolViolation,
    RoundAborted,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    crypto,
    quantise,
    run_local_round,
    signatures,
)
from fedzoo.secagg.bounds import SecAggBounds, cohort_config, corrupt_devices, threshold_floor
from fedzoo.secagg.client import pairwise_mask, self_mask
from fedzoo.secagg.graph import advertised_bytes, neighbours, read_advertised, ring_order
from fedzoo.secagg.messages import STAGES, from_base64, to_base64
from fedzoo.secagg.shamir import SHARE_BYTES, ShareError, combine_shares
from fedzoo.secagg.signed_rounds import SignedRounds


def _inputs(config, seed):
    rng = np.random.default_rng(seed)
    return {index: quantise(rng.normal(scale=0.5, size=config.vector_length), config, float(rng.uniform(0.1, 1)), rng)
            for index in range(config.num_clients)}


def _plain_sum(config, inputs, clients):
    total = sum(inputs[index].astype(np.int64) for index in clients)
    return (total % 2**config.modulus_bits).astype(inputs[0].dtype)


def _exact(config, inputs, dropouts):
    local = run_local_round(config, inputs, dropouts)
    result = local.result
    # survivors sent a masked input: those dropping at the consistency check or the unmask stage still count
    late = ("consistency_check", "unmask")
    gone_before = set().union(*(c for stage, c in dropouts.items() if stage not in late)) | set(local.refusals)
    assert set(result.survivors) == set(range(config.num_clients)) - gone_before
    assert np.array_equal(result.ring_sum, _plain_sum(config, inputs, result.survivors))
    return local


# 24 clients, 20 neighbours, threshold 12 (the devices' floor): 30% (7 clients) dropping never leaves fewer than 12
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("rate", [0.0, 0.1, 0.3])
def test_the_sum_is_exact_whatever_fraction_drops_at_each_stage(stage, rate):
    config = SecAggConfig("round-7", 24, 20, 12, 20, 1.0)
    for seed in range(3):
        dropping = set(random.Random(seed).sample(range(24), round(rate * 24)))
        local = _exact(config, _inputs(config, seed), {stage: dropping})
        assert local.refusals == {} and local.result.misbehaving == {}
        if stage == "masked_input":
            assert local.result.dropped == sorted(dropping)


def test_the_sum_is_exact_when_clients_drop_at_every_stage_at_once():
    config = SecAggConfig("round-8", 30, 20, 12, 20, 1.0)
    for seed in range(3):
        order = random.Random(seed).sample(range(30), 8)
        dropouts = {"advertise_keys": set(order[:2]), "share_keys": set(order[2:4]),
                    "masked_input": set(order[4:6]), "consistency_check": {order[6]}, "unmask": set(order[7:])}
        _exact(config, _inputs(config, seed), dropouts)


@pytest.mark.slow
def test_many_seeded_rounds_of_sixty_clients_with_30_percent_dropping_after_key_sharing():
    config = SecAggConfig("round-9", 60, 42, 23, 50, 1.0)  # 42 - 18 dropped >= 23 wherever they sit
    for seed in range(4):
        dropping = set(random.Random(seed).sample(range(60), 18))
        _exact(config, _inputs(config, seed), {"masked_input": dropping})


# Bounds that assume no corrupt device: issue #34's attacks need none, and are run at its parameters
NO_CORRUPTION = SecAggBounds(corruption_budget=0.0, least_corrupt_devices=0)


def _parties(config, client_class=SecAggClient, bounds=SecAggBounds()):
    keys = {index: signatures.new_signing_key() for index in range(config.num_clients)}
    clients = {index: client_class(config, index, keys[index], bounds) for index in range(config.num_clients)}
    return clients, SecAggServer(config, {index: signatures.public_bytes(key) for index, key in keys.items()})


def _through_masked_inputs(config, inputs, client_class=SecAggClient, bounds=SecAggBounds()):
    clients, server = _parties(config, client_class, bounds)
    requests = server.collect_keys([c.advertise_keys() for c in clients.values()])
    requests = server.collect_shares([clients[i].share_keys(r) for i, r in requests.items()])
    return clients, server, requests, inputs


def _to_unmask(config, inputs, client_class=SecAggClient):
    """An honest round up to the unmask requests."""
    clients, server, requests, inputs = _through_masked_inputs(config, inputs, client_class)
    requests = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    requests = server.collect_consistency([clients[i].consistency_check(r) for i, r in requests.items()])
    return clients, server, requests


class _TrustingClient(SecAggClient):
    """A client with the consistency check taken out: it reveals for whatever survivor set it is shown (v1)."""

    def _consistency_signers(self, request, survivors):
        return set(self.neighbours)


class _CountingClient(SecAggClient):
    """A client that counts the survivor-set signatures it is shown without verifying them."""

    def _consistency_signers(self, request, survivors):
        return {entry["client"] for entry in request["signatures"]} & self.neighbours


class _UncheckingClient(SecAggClient):
    """A client that takes relayed keys on trust, without checking the neighbour's signature (v1)."""

    def _neighbour_signing_key(self, peer, entry):
        return from_base64(entry["signing_public_key"], "signing_public_key")


def _share_value(share):
    return int.from_bytes(base64.b64decode(share["value"]), "big")


def _read_input(config, masked_vector, victim, seed, mask_key_of, victim_mask_public_key, peers):
    """What the server reads once it holds the victim's self-mask seed and, for each neighbour the victim masked
    with, one private key of that pair: the masked vector minus every mask."""
    value = masked_vector - self_mask(config, seed)
    for peer in peers:
        mask = pairwise_mask(config, mask_key_of[peer], victim_mask_public_key)
        value = value - mask if victim < peer else value + mask
    return value


def _inconsistent_stories(config, inputs, client_class, victim, forward_every_signature=False):
    """Issue #34's attack: the victim's neighbours each hear "the victim and I survived, the victim's other
    neighbours dropped"; everyone else hears "the victim's neighbours dropped". Every story holds the listener
    and is long enough. The server collects b of the victim from its neighbours and the mask key of each
    neighbour from theirs. With `forward_every_signature` it also forwards the signatures made on other stories,
    so every list is t long. Returns (what the server read of the victim's input or None, refusal reasons)."""
    clients, server, requests, inputs = _through_masked_inputs(config, inputs, client_class, NO_CORRUPTION)
    masked = {i: clients[i].masked_input(r, inputs[i]) for i, r in requests.items()}
    around = set(server.graph[victim])
    everyone = set(range(config.num_clients))
    story = {client: sorted((everyone - around) | ({client} if client in around else set())) for client in everyone}
    signed = {client: clients[client].consistency_check({"stage": "consistency_check", "survivors": story[client]})
              for client in everyone}
    refusals = {}
    # the best the server can do: every neighbour's signature made on the very story this client heard (and,
    # with `forward_every_signature`, those made on other stories too)
    shares = _reveal(clients, {client: {"stage": "unmask", "survivors": story[client], "signatures": [
        {"client": peer, "signature": signed[peer]["signature"]} for peer in server.graph[client]
        if forward_every_signature or story[peer] == story[client]]} for client in everyone}, refusals)
    return _read_from_shares(config, server, masked[victim], victim, shares), refusals


def _reveal(clients, requests, refusals):
    """Each client's unmask reply to its request, pooled as (owner, kind) -> [(x, value)]; refusals are recorded."""
    shares = {}
    for client, request in requests.items():
        try:
            reply = clients[client].unmask(request)
        except ProtocolViolation as refusal:
            refusals[client] = refusal.reason
            continue
        for share in reply["shares"]:
            shares.setdefault((share["owner"], share["kind"]), []).append((client + 1, _share_value(share)))
    return shares


def _read_from_shares(config, server, masked_reply, victim, shares):
    """What the server reads of the victim's input from the pooled shares: its seed and its neighbours' mask keys
    recovered, every mask removed from its masked vector; None when a secret cannot be recovered."""
    around = sorted(server.graph[victim])
    try:
        seed = combine_shares(shares.get((victim, "self_mask"), []), config.threshold)
        mask_keys = {peer: crypto.load_private_key(combine_shares(shares.get((peer, "mask_key"), []), config.threshold))
                     for peer in around}
    except ShareError:
        return None
    vector = np.frombuffer(from_base64(masked_reply["masked_vector"], "masked_vector"),
                           dtype=crypto.MASK_DTYPES[config.modulus_bits]).copy()
    return _read_input(config, vector, victim, seed, mask_keys, server.keys[victim][1], around)


# n = 30, k = 8, t = 5: the parameters of the review that found the attack
ATTACKED = SecAggConfig("round-split", 30, 8, 5, 12, 1.0)


def test_without_the_consistency_check_a_server_telling_different_stories_reads_one_input_exactly():
    inputs = _inputs(ATTACKED, 1)
    read, refusals = _inconsistent_stories(ATTACKED, inputs, _TrustingClient, victim=0)
    assert refusals == {}  # every per-client check on its own list passes
    assert read is not None and np.array_equal(read, inputs[0])


@pytest.mark.parametrize("victim", [0, 7, 29])
def test_a_server_telling_neighbours_different_stories_never_gets_both_secrets(victim):
    """Each neighbour of the victim heard a story that no t of its own neighbours signed: it reveals nothing."""
    inputs = _inputs(ATTACKED, 1)
    read, refusals = _inconsistent_stories(ATTACKED, inputs, SecAggClient, victim)
    assert read is None
    assert len(refusals) >= ATTACKED.neighbour_count
    assert set(refusals.values()) == {"too_few_signatures"}


def test_without_verification_a_server_padding_each_list_with_signatures_on_other_stories_reads_one_input():
    inputs = _inputs(ATTACKED, 1)
    read, refusals = _inconsistent_stories(ATTACKED, inputs, _CountingClient, victim=0, forward_every_signature=True)
    assert refusals == {} and read is not None and np.array_equal(read, inputs[0])


@pytest.mark.parametrize("victim", [0, 7])
def test_a_server_padding_each_list_to_t_with_signatures_on_other_stories_is_refused(victim):
    """At least t signatures are listed, but not on the story the listener signed: each one is verified."""
    inputs = _inputs(ATTACKED, 1)
    read, refusals = _inconsistent_stories(ATTACKED, inputs, SecAggClient, victim, forward_every_signature=True)
    assert read is None
    assert len(refusals) >= ATTACKED.neighbour_count  # the victim's neighbours among them: each heard its own story
    assert set(refusals.values()) == {"bad_signature"}


def test_one_bad_signature_among_t_good_ones_is_refused():
    """An honest round's unmask request with one neighbour's signature replaced by another's: t or more good
    signatures do not excuse one the server altered."""
    config = SecAggConfig("round-one-bad", 12, 8, 6, 10, 1.0)  # t at the devices' floor (c = 2)
    clients, _, requests = _to_unmask(config, _inputs(config, 0))
    request = requests[0]
    listed = request["signatures"]
    assert len(listed) > config.threshold
    forged = [dict(listed[0], signature=listed[1]["signature"]), *listed[1:]]
    with pytest.raises(ProtocolViolation) as refusal:
        clients[0].unmask(dict(request, signatures=forged))
    assert refusal.value.reason == "bad_signature"


def test_a_signature_listed_for_a_neighbour_that_never_advertised_is_refused():
    """A neighbour that dropped before advertising has no key this client could check a signature against: the
    server listing one for it (to reach t) is refused as a bad signature, not taken on trust or crashed on."""
    config = SecAggConfig("round-ghost", 12, 8, 6, 10, 1.0)
    inputs = _inputs(config, 0)
    clients, server = _parties(config)
    ghost = 11
    requests = server.collect_keys([client.advertise_keys() for index, client in clients.items() if index != ghost])
    requests = server.collect_shares([clients[i].share_keys(r) for i, r in requests.items()])
    requests = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    requests = server.collect_consistency([clients[i].consistency_check(r) for i, r in requests.items()])
    listener = next(index for index in requests if ghost in clients[index].neighbours)
    request = requests[listener]
    forged = sorted([*request["signatures"], {"client": ghost, "signature": to_base64(bytes(64))}],
                    key=lambda entry: entry["client"])
    with pytest.raises(ProtocolViolation, match=f"client {ghost}'s signature") as refusal:
        clients[listener].unmask(dict(request, signatures=forged))
    assert refusal.value.reason == "bad_signature"


def test_a_survivor_set_signature_that_is_not_base64_is_refused_naming_the_field():
    config = SecAggConfig("round-garbled", 12, 8, 6, 10, 1.0)
    clients, _, requests = _to_unmask(config, _inputs(config, 0))
    listed = requests[0]["signatures"]
    with pytest.raises(ProtocolViolation, match="^signature is not valid base64") as refusal:
        clients[0].unmask(dict(requests[0], signatures=[dict(listed[0], signature="not base64!"), *listed[1:]]))
    assert refusal.value.reason == "malformed"


def _substituted_keys(config, inputs, client_class, victim, forge_signing_keys=False, pin_enrolled_keys=False,
                      insider=False):
    """Issue #34's second attack: the server relays its own X25519 keys as each of the victim's neighbours'. The
    victim then encrypts its self-mask seed's shares to the server and masks with keys the server holds. With
    `insider`, every forged entry is signed by the long-term key of one enrolled client that is not the victim's
    neighbour in this run's graph (a colluding Sybil).
    Returns what the server read of the victim's input (or None) and the victim's refusal reason."""
    keys = {index: signatures.new_signing_key() for index in range(config.num_clients)}
    registered = {index: signatures.public_bytes(key) for index, key in keys.items()}
    pinned = frozenset(registered.values()) if pin_enrolled_keys else None
    clients = {index: client_class(config, index, keys[index], NO_CORRUPTION, trusted_signing_keys=pinned)
               for index in range(config.num_clients)}
    server = SecAggServer(config, registered)
    requests = server.collect_keys([c.advertise_keys() for c in clients.values()])
    insider_key = (keys[next(c for c in range(config.num_clients) if c != victim and c not in server.graph[victim])]
                   if insider else None)
    forged_ciphers, forged_masks = {}, {}
    entries = []
    for entry in requests[victim]["public_keys"]:
        peer = entry["client"]
        forged_ciphers[peer], cipher_public = crypto.new_key_pair()
        forged_masks[peer], mask_public = crypto.new_key_pair()
        forged = dict(entry, cipher_public_key=to_base64(cipher_public), mask_public_key=to_base64(mask_public))
        if forge_signing_keys or insider:  # the server also lies about the neighbour's long-term key
            server_key = insider_key if insider else signatures.new_signing_key()
            forged.update(signing_public_key=to_base64(signatures.public_bytes(server_key)), signature=to_base64(
                server_key.sign(signatures.advertise_payload(config, peer, cipher_public, mask_public,
                                                             server.nonces[peer]))))
        entries.append(forged)
    try:
        dealt = clients[victim].share_keys(dict(requests[victim], public_keys=entries))
    except ProtocolViolation as refusal:
        return None, refusal.reason
    seed_shares = []
    for share in dealt["shares"]:
        holder = share["holder"]
        key = crypto.agree(forged_ciphers[holder], server.keys[victim][0], "share-encryption", config.context)
        plaintext = crypto.decrypt(key, from_base64(share["ciphertext"], "ciphertext"),
                                   client_module.share_associated_data(config, victim, holder))
        seed_shares.append((holder + 1, int.from_bytes(plaintext[8 : 8 + 33], "big")))
    seed = combine_shares(seed_shares, config.threshold)
    encrypted = [{"owner": peer, "ciphertext": to_base64(b"\0" * 60)} for peer in forged_masks]
    masked = clients[victim].masked_input({"stage": "masked_input", "encrypted_shares": encrypted}, inputs[victim])
    vector = np.frombuffer(from_base64(masked["masked_vector"], "masked_vector"),
                           dtype=crypto.MASK_DTYPES[config.modulus_bits]).copy()
    return _read_input(config, vector, victim, seed, forged_masks, server.keys[victim][1], sorted(forged_masks)), None


def test_without_signatures_a_server_substituting_keys_reads_one_input_from_the_masked_vector_alone():
    inputs = _inputs(ATTACKED, 2)
    read, refusal = _substituted_keys(ATTACKED, inputs, _UncheckingClient, victim=3)
    assert refusal is None and np.array_equal(read, inputs[3])


def test_a_server_substituting_keys_is_refused_by_the_neighbours_signatures():
    read, refusal = _substituted_keys(ATTACKED, _inputs(ATTACKED, 2), SecAggClient, victim=3)
    assert read is None and refusal == "bad_signature"


def test_a_server_also_substituting_long_term_keys_is_refused_where_the_enrolled_keys_are_pinned():
    """The server relays the long-term keys too: without pinning this is trust on first use (docs/privacy.md)."""
    inputs = _inputs(ATTACKED, 2)
    read, refusal = _substituted_keys(ATTACKED, inputs, SecAggClient, victim=3, forge_signing_keys=True)
    assert refusal is None and np.array_equal(read, inputs[3])  # the documented limit
    read, refusal = _substituted_keys(ATTACKED, inputs, SecAggClient, victim=3, forge_signing_keys=True,
                                      pin_enrolled_keys=True)
    assert read is None and refusal == "bad_signature"


def test_one_enrolled_insiders_key_relayed_for_every_neighbour_is_refused_even_where_keys_are_pinned():
    """Pinning stops keys the server made up, not an enrolled insider's key standing for many neighbours: that
    insider would decrypt t shares of the victim's seed. One signing key for two neighbours is refused."""
    inputs = _inputs(ATTACKED, 2)
    read, refusal = _substituted_keys(ATTACKED, inputs, SecAggClient, victim=3, pin_enrolled_keys=True, insider=True)
    assert read is None and refusal == "bad_signature"


def test_a_key_advertisement_presented_as_another_clients_or_under_other_parameters_is_refused():
    config = SecAggConfig("round-replay", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    replies = [c.advertise_keys() for c in clients.values()]
    requests = server.collect_keys(replies)
    victim = 0
    entries = requests[victim]["public_keys"]
    swapped = [entries[0], dict(entries[0], client=entries[1]["client"],
                                signing_public_key=entries[1]["signing_public_key"]),
               *entries[2:]]  # the first neighbour's keys presented as the second's, under the second's long-term key
    for tampered in (swapped, [dict(entries[0], signature=entries[1]["signature"]), *entries[1:]]):
        with pytest.raises(ProtocolViolation) as refusal:
            clients[victim].share_keys(dict(requests[victim], public_keys=tampered))
        assert refusal.value.reason == "bad_signature"
    other_parameters = SecAggConfig("round-replay", 12, 6, 5, 11, 1.0)  # another vector length
    peer = entries[0]["client"]
    signed = server.advertise_payload(peer, *server.keys[peer], server.nonces[peer])
    assert signatures.verify(server.signing_keys[peer], from_base64(entries[0]["signature"], "signature"), signed)
    assert not signatures.verify(server.signing_keys[peer], from_base64(entries[0]["signature"], "signature"),
                                 signatures.advertise_payload(other_parameters, peer, *server.keys[peer],
                                                              server.nonces[peer]))


def test_the_server_drops_a_client_whose_advertised_keys_are_not_signed_by_its_registered_key():
    config = SecAggConfig("round-unsigned", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    replies = [c.advertise_keys() for c in clients.values()]
    replies[2]["signature"] = replies[3]["signature"]
    del replies[4]["signature"]
    requests = server.collect_keys(replies)
    assert {2, 4} & set(requests) == set() and "signature" in server.misbehaving[2] and 4 in server.misbehaving


def test_a_server_unmasking_for_another_set_than_the_one_signed_is_refused():
    config = SecAggConfig("round-other-set", 12, 6, 5, 10, 1.0)
    clients, _, requests = _to_unmask(config, _inputs(config, 0))
    request = requests[0]
    with pytest.raises(ProtocolViolation) as refusal:
        clients[0].unmask(dict(request, survivors=[c for c in request["survivors"] if c != 5]))
    assert refusal.value.reason == "inconsistent_survivors"


@pytest.mark.parametrize("tamper, reason", [
    (lambda request: dict(request, survivors=request["survivors"][:2]), "too_few_survivors"),
    (lambda request: dict(request, survivors=[c for c in request["survivors"] if c != 0]), "not_a_survivor"),
    (lambda request: dict(request, survivors="everyone"), "malformed"),
    (lambda request: dict(request, stage="share_keys"), "wrong_stage"),
])
def test_clients_refuse_survivor_sets_that_break_the_rules(tamper, reason):
    config = SecAggConfig("round-rules", 10, 6, 5, 10, 1.0)
    clients, server, requests, inputs = _through_masked_inputs(config, _inputs(config, 2))
    honest = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    with pytest.raises(ProtocolViolation) as refusal:
        clients[0].consistency_check(tamper(honest[0]))
    assert refusal.value.reason == reason


def test_a_survivor_set_of_exactly_the_minimum_is_signed():
    config = SecAggConfig("round-least", 10, 6, 5, 10, 1.0)
    clients, server, requests, inputs = _through_masked_inputs(config, _inputs(config, 2))
    honest = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    least = sorted(honest[0]["survivors"])[: config.minimum_survivors]
    assert 0 in least and len(least) == config.minimum_survivors
    reply = clients[0].consistency_check(dict(honest[0], survivors=least))
    assert len(from_base64(reply["signature"], "signature")) == 64


@pytest.mark.parametrize("field", ["signing_public_key", "signature"])
def test_a_relayed_key_entry_that_is_not_base64_is_refused_naming_the_field(field):
    config = SecAggConfig("round-garbled-keys", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    entries = requests[0]["public_keys"]
    with pytest.raises(ProtocolViolation, match=f"^{field} is not valid base64") as refusal:
        clients[0].share_keys(dict(requests[0], public_keys=[dict(entries[0], **{field: "not base64!"}), *entries[1:]]))
    assert refusal.value.reason == "malformed"


def test_an_advertised_list_that_is_not_base64_is_refused_naming_the_field():
    config = SecAggConfig("round-garbled-advertised", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    with pytest.raises(ProtocolViolation, match="^advertised is not valid base64") as refusal:
        clients[0].share_keys(dict(requests[0], advertised="not base64!"))
    assert refusal.value.reason == "malformed"


@pytest.mark.parametrize("seat", [-1, 12])
def test_a_seat_outside_the_round_is_refused_when_the_client_is_made(seat):
    config = SecAggConfig("round-seat", 12, 6, 5, 10, 1.0)
    with pytest.raises(ProtocolViolation, match=r"^client number -?\d+ is outside \[0, 12\)") as refusal:
        SecAggClient(config, seat, signatures.new_signing_key())
    assert refusal.value.reason == "malformed"
    SecAggClient(config, seat % 12, signatures.new_signing_key())  # the seats at either edge are taken


@pytest.mark.parametrize("story", ["another_nonce", "left_out"])
def test_an_advertised_list_without_this_clients_own_nonce_is_refused(story):
    """A server drawing the graph from a list where client 0's nonce is another (one the server picked, to choose the
    graph) or missing: client 0 knows the nonce it drew, and refuses."""
    config = SecAggConfig("round-own-nonce", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    nonces = read_advertised(from_base64(requests[0]["advertised"], "advertised"), config.num_clients)
    if story == "another_nonce":
        nonces[0] = os.urandom(len(nonces[0]))
    else:
        del nonces[0]
    with pytest.raises(ProtocolViolation, match="does not hold this client's nonce") as refusal:
        clients[0].share_keys(dict(requests[0], advertised=to_base64(advertised_bytes(nonces))))
    assert refusal.value.reason == "malformed"


def test_stages_out_of_order_and_too_few_neighbours_are_refused():
    config = SecAggConfig("round-order", 10, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    client = clients[0]
    with pytest.raises(ProtocolViolation) as refusal:
        client.unmask({"stage": "unmask", "survivors": [0, 1, 2, 3], "signatures": []})
    assert refusal.value.reason == "wrong_stage"
    requests = server.collect_keys([c.advertise_keys() for c in list(clients.values())[:5]])  # 4 others advertised
    with pytest.raises(ProtocolViolation) as refusal:
        client.share_keys(requests[0])
    assert refusal.value.reason == "too_few_neighbours"
    keys = requests[0]["public_keys"]
    stranger = next(c for c in range(10) if c not in server.graph[0] and c != 0)
    with pytest.raises(ProtocolViolation, match="advertised neighbours are"):
        client.share_keys(dict(requests[0], public_keys=[dict(keys[0], client=stranger), *keys[1:]]))


class _LyingHolder(SecAggClient):
    """Returns a wrong value for every share it reveals."""

    def unmask(self, request):
        reply = super().unmask(request)
        for share in reply["shares"]:
            value = int.from_bytes(base64.b64decode(share["value"]), "big")
            share["value"] = base64.b64encode(((value + 1) % 2**256).to_bytes(33, "big")).decode()
        return reply


class _BadDealer(SecAggClient):
    """Shares random secrets instead of its real seed and key (consistently committed, so only recovery shows it)."""

    def share_keys(self, request):
        real = client_module.split_secret
        client_module.split_secret = lambda secret, threshold, holders: real(os.urandom(32), threshold, holders)
        try:
            return super().share_keys(request)
        finally:
            client_module.split_secret = real


def test_a_holder_returning_wrong_shares_is_named_and_the_sum_stays_exact():
    config = SecAggConfig("round-liar", 20, 12, 8, 20, 1.0)
    inputs = _inputs(config, 3)
    key = signatures.new_signing_key()
    local = run_local_round(config, inputs, {"masked_input": {5, 6}}, clients={4: _LyingHolder(config, 4, key)},
                            signing_keys={4: key})
    assert np.array_equal(local.result.ring_sum, _plain_sum(config, inputs, local.result.survivors))
    assert list(local.result.misbehaving) == [4]
    assert "does not match its commitment" in local.result.misbehaving[4]


@pytest.mark.parametrize("dealer_drops", [False, True])
def test_a_dealer_sharing_garbage_aborts_the_round_with_no_sum(dealer_drops):
    config = SecAggConfig("round-dealer", 20, 12, 8, 20, 1.0)
    dropouts = {"masked_input": {9}} if dealer_drops else {}
    key = signatures.new_signing_key()
    with pytest.raises(RoundAborted) as aborted:
        run_local_round(config, _inputs(config, 4), dropouts, clients={9: _BadDealer(config, 9, key)},
                        signing_keys={9: key})
    assert aborted.value.clients == [9]


def test_a_tampered_ciphertext_is_reported_and_others_suffice():
    """The holder names the owner whose ciphertext does not decrypt and still reveals every other owner's share (the
    tampered one is the first it opens, so a holder stopping there would reveal nothing)."""
    config = SecAggConfig("round-tamper", 20, 12, 8, 20, 1.0)
    inputs = _inputs(config, 5)
    clients, server, requests, _ = _through_masked_inputs(config, inputs)
    victim_holder = 2
    entry = min(requests[victim_holder]["encrypted_shares"], key=lambda shared: shared["owner"])
    owners = {shared["owner"] for shared in requests[victim_holder]["encrypted_shares"]}
    entry["ciphertext"] = entry["ciphertext"][:-4] + ("AAAA" if entry["ciphertext"][-4:] != "AAAA" else "BBBB")
    requests = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    requests = server.collect_consistency([clients[i].consistency_check(r) for i, r in requests.items()])
    replies = [clients[i].unmask(r) for i, r in requests.items()]
    reply = next(r for r in replies if r["client"] == victim_holder)
    assert reply["undecryptable"] == [entry["owner"]]
    assert {share["owner"] for share in reply["shares"]} == owners - {entry["owner"]}
    result = server.collect_unmask_shares(replies)
    assert np.array_equal(result.ring_sum, _plain_sum(config, inputs, result.survivors))


class _MislabellingDealer(SecAggClient):
    """Encrypts to each holder, under the right key and associated data, the plaintext `mislabel` makes of the honest
    one: another owner -> holder in its header, or a share value cut short."""

    def __init__(self, *args, mislabel, **kwargs):
        super().__init__(*args, **kwargs)
        self._mislabel = mislabel

    def share_keys(self, request):
        real = client_module.share_plaintext
        client_module.share_plaintext = lambda *values: self._mislabel(real(*values))
        try:
            return super().share_keys(request)
        finally:
            client_module.share_plaintext = real


@pytest.mark.parametrize("mislabel", [lambda plaintext: plaintext[4:8] + plaintext[:4] + plaintext[8:],
                                      lambda plaintext: plaintext[:-1]], ids=["holder_to_owner", "one_byte_short"])
def test_a_share_that_decrypts_but_is_not_owner_to_holder_with_two_values_is_reported_and_the_others_revealed(
        mislabel):
    """An insider dealer (client 0, so the first share each of its holders opens) encrypts properly a share whose
    header names holder -> owner, or that is one byte short: the holder names it undecryptable, reveals no value of
    it, and reveals every other owner's share."""
    config = SecAggConfig("round-mislabel", 12, 8, 6, 10, 1.0)
    inputs = _inputs(config, 6)
    clients, server = _parties(config)
    key = signatures.new_signing_key()
    server.signing_keys[0] = signatures.public_bytes(key)
    clients[0] = _MislabellingDealer(config, 0, key, mislabel=mislabel)
    requests = server.collect_keys([c.advertise_keys() for c in clients.values()])
    requests = server.collect_shares([clients[i].share_keys(r) for i, r in requests.items()])
    holder = server.graph[0][0]
    owners = {shared["owner"] for shared in requests[holder]["encrypted_shares"]}
    assert 0 in owners and len(owners) > 1
    requests = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    requests = server.collect_consistency([clients[i].consistency_check(r) for i, r in requests.items()])
    reply = clients[holder].unmask(requests[holder])
    assert reply["undecryptable"] == [0]
    assert {share["owner"] for share in reply["shares"]} == owners - {0}


def test_exactly_t_neighbours_signatures_unmask_and_one_fewer_is_refused():
    config = SecAggConfig("round-exactly-t", 12, 8, 6, 10, 1.0)
    clients, _, requests = _to_unmask(config, _inputs(config, 7))
    request = requests[0]
    listed = request["signatures"]
    assert len(listed) > config.threshold
    with pytest.raises(ProtocolViolation) as refusal:
        clients[0].unmask(dict(request, signatures=listed[: config.threshold - 1]))
    assert refusal.value.reason == "too_few_signatures"
    reply = clients[0].unmask(dict(request, signatures=listed[: config.threshold]))
    assert reply["undecryptable"] == [] and len(reply["shares"]) == len(clients[0].neighbours)


def test_shares_forwarded_from_a_client_whose_keys_this_client_never_got_are_refused():
    """The server adds to client 0's ciphertexts one from a client that is not its neighbour."""
    config = SecAggConfig("round-stranger-share", 12, 6, 5, 10, 1.0)
    inputs = _inputs(config, 8)
    clients, server, requests, _ = _through_masked_inputs(config, inputs)
    shared = requests[0]["encrypted_shares"]
    stranger = next(c for c in range(config.num_clients) if c not in server.graph[0] and c != 0)
    with pytest.raises(ProtocolViolation, match="whose keys this client never got") as refusal:
        clients[0].masked_input(dict(requests[0], encrypted_shares=[*shared, dict(shared[0], owner=stranger)]),
                                inputs[0])
    assert refusal.value.reason == "malformed"


@pytest.mark.parametrize("tamper, reason, message", [
    (lambda request, vector: (dict(request, encrypted_shares=request["encrypted_shares"][:4]), vector),
     "too_few_neighbours", "only 4 neighbours shared their keys; masking needs 5"),
    (lambda request, vector: (dict(request, encrypted_shares=[dict(request["encrypted_shares"][0], ciphertext="%"),
                                                              *request["encrypted_shares"][1:]]), vector),
     "malformed", "ciphertext is not valid base64"),
    (lambda request, vector: (request, vector[:-1]), "malformed", "the input must have 11 ring values"),
], ids=["fewer_than_t_ciphertexts", "ciphertext_not_base64", "input_one_value_short"])
def test_masked_input_requests_that_break_the_rules_are_refused(tamper, reason, message):
    config = SecAggConfig("round-masked-rules", 12, 6, 5, 10, 1.0)
    inputs = _inputs(config, 9)
    clients, _, requests, _ = _through_masked_inputs(config, inputs)
    request, vector = tamper(requests[0], inputs[0])
    with pytest.raises(ProtocolViolation, match=f"^{message}") as refusal:
        clients[0].masked_input(request, vector)
    assert refusal.value.reason == reason


@pytest.mark.parametrize("key", [bytes(32), bytes(range(31))], ids=["low_order_point", "31_bytes"])
@pytest.mark.parametrize("field", ["cipher_public_key", "mask_public_key"])
def test_a_relayed_neighbour_key_that_gives_no_agreement_is_refused_as_malformed(key, field):
    """The server relays, for an advertised neighbour, the all-zero point (every agreement with it is zero) or a
    short key: refused as malformed before any signature is checked."""
    config = SecAggConfig("round-unusable-key", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    keys = requests[0]["public_keys"]
    with pytest.raises(ProtocolViolation, match=f"^{field} must be a usable 32-byte X25519 public key") as refusal:
        clients[0].share_keys(dict(requests[0], public_keys=[dict(keys[0], **{field: to_base64(key)}), *keys[1:]]))
    assert refusal.value.reason == "malformed"


def test_too_few_masked_inputs_abort_before_anyone_unmasks():
    config = SecAggConfig("round-few", 10, 6, 5, 10, 1.0, minimum_survivors=5)
    with pytest.raises(RoundAborted, match="only 4 masked inputs"):
        run_local_round(config, _inputs(config, 6), {"masked_input": set(range(6))})


def test_a_client_advertising_a_low_order_key_is_dropped_by_the_server_and_refused_by_clients():
    config = SecAggConfig("round-keys", 12, 6, 5, 10, 1.0)
    clients, server = _parties(config)
    replies = [client.advertise_keys() for client in clients.values()]
    replies[5]["mask_public_key"] = base64.b64encode(bytes(32)).decode()  # the all-zero point: no agreement
    requests = server.collect_keys(replies)
    assert 5 not in requests and "malformed keys" in server.misbehaving[5]
    neighbour = server.graph[5][0]
    forged = dict(requests[neighbour])
    forged["public_keys"] = requests[neighbour]["public_keys"] + [
        {"client": 5, "cipher_public_key": replies[5]["cipher_public_key"], "mask_public_key": replies[5]["mask_public_key"],
         "signing_public_key": to_base64(signatures.public_bytes(signatures.new_signing_key())),
         "signature": replies[5]["signature"]}]
    with pytest.raises(ProtocolViolation) as refusal:
        clients[neighbour].share_keys(forged)
    assert refusal.value.reason == "malformed"


def _answers(clients, answer, requests, refusals):
    """Each client's reply to its request; a client that refuses is out (its reason kept in `refusals`)."""
    replies = []
    for index, request in requests.items():
        try:
            replies.append(answer(index, clients[index], request))
        except ProtocolViolation as refusal:
            refusals[index] = refusal.reason
    return replies


def _run_to_signing(config, registered, make_client, inputs, refusals):
    """One run of the round up to its masked inputs, relayed honestly: (clients, server, masked replies)."""
    clients = {index: make_client(index) for index in range(config.num_clients)}
    server = SecAggServer(config, registered)
    requests = server.collect_keys(_answers(clients, lambda i, c, r: c.advertise_keys(), dict.fromkeys(clients),
                                            refusals))
    requests = server.collect_shares(_answers(clients, lambda i, c, r: c.share_keys(r), requests, refusals))
    masked = _answers(clients, lambda i, c, r: c.masked_input(r, inputs[i]), requests, refusals)
    return clients, server, {reply["client"]: reply for reply in masked}


def _stories(graph, victim, threshold):
    """Issue #44's plan: each client x is told that some of the victim's neighbours dropped (at most k - t of its own
    neighbours, so t of them still sign its story), such that every neighbour u of the victim is told dropped by t
    of u's neighbours (who reveal u's mask key) while the victim survives in every story (its neighbours reveal
    b). Returns each client's story, or None where this graph leaves no such plan."""
    spare = len(graph[victim]) - threshold
    dropped = {client: set() for client in graph}
    inside = set(graph[victim]) | {victim}
    # a greedy plan: the neighbours with the fewest tellers outside the victim's neighbourhood first, and tellers
    # from outside it first (their spare capacity serves nothing else); it finds one on every shuffled ring tried
    for peer in sorted(graph[victim], key=lambda peer: (len(set(graph[peer]) & inside), peer)):
        tellers = [x for x in sorted(graph[peer], key=lambda x: (x in inside, len(dropped[x]), x))
                   if len(dropped[x]) < spare]
        if len(tellers) < threshold:
            return None
        for x in tellers[:threshold]:
            dropped[x].add(peer)
    return {client: sorted(set(graph) - dropped[client]) for client in graph}


def _replayed_signatures(config, inputs, victim, make_client):
    """Issue #44's first attack, with honest devices and pinned keys: k "preparation" runs under the round's id,
    each failed before unmasking, collect every device's signature on each story a neighbour of it will be told;
    the real run then tells each device its story with those signatures. Returns (what the server read of the
    victim's input, or None; refusal reasons seen in the real run)."""
    keys = {index: signatures.new_signing_key() for index in range(config.num_clients)}
    registered = {index: signatures.public_bytes(key) for index, key in keys.items()}
    collected, refusals = {}, {}
    for run in range(config.neighbour_count):
        try:
            clients, server, _ = _run_to_signing(config, registered, lambda i: make_client(i, keys[i]), inputs, {})
        except RoundAborted:
            continue
        stories = _stories(server.graph, victim, config.threshold) if server.graph else None
        for signer, client in clients.items():
            if stories is None:
                break
            told = sorted(server.graph[signer])[run] if run < len(server.graph[signer]) else signer
            story = stories[told] if signer in stories[told] else stories[signer]
            try:
                signed = client.consistency_check({"stage": "consistency_check", "survivors": story})
            except ProtocolViolation:
                continue
            collected[(signer, tuple(story))] = signed["signature"]
    clients, server, masked = _run_to_signing(config, registered, lambda i: make_client(i, keys[i]), inputs, refusals)
    stories = _stories(server.graph, victim, config.threshold) if victim in masked else None
    if stories is None:
        return None, refusals
    signed_now = {}
    for client in masked:
        try:
            signed_now[client] = clients[client].consistency_check({"stage": "consistency_check",
                                                                     "survivors": stories[client]})["signature"]
        except ProtocolViolation as refusal:
            refusals[client] = refusal.reason
    requests = {}
    for client in signed_now:
        story = stories[client]
        signed = [{"client": peer, "signature": signed_now[peer] if stories.get(peer) == story and peer in signed_now
                   else collected.get((peer, tuple(story)))} for peer in server.graph[client] if peer in story]
        requests[client] = {"stage": "unmask", "survivors": story,
                            "signatures": [entry for entry in signed if entry["signature"] is not None]}
    shares = _reveal(clients, requests, refusals)
    return _read_from_shares(config, server, masked[victim], victim, shares), refusals


def test_preparation_runs_under_the_same_round_id_are_refused_by_devices_that_remember_the_round():
    """The devices keep their memory of signed round ids (the SDK keeps it in the state file): every run after
    the first is refused at stage 1, so the server has nothing to replay."""
    memory = {index: SignedRounds() for index in range(ATTACKED.num_clients)}
    inputs = _inputs(ATTACKED, 7)
    read, refusals = _replayed_signatures(
        ATTACKED, inputs, 4, lambda i, key: SecAggClient(ATTACKED, i, key, NO_CORRUPTION, signed_rounds=memory[i]))
    assert read is None
    assert set(refusals.values()) == {"round_replayed"} and len(refusals) == ATTACKED.num_clients


def test_survivor_set_signatures_from_preparation_runs_do_not_verify_in_the_real_run():
    """Devices that forgot the round (a fresh memory each run): the graph and every signature are new each run, so
    the signatures collected before do not count and the real run's devices reveal nothing to the attack."""
    inputs = _inputs(ATTACKED, 7)
    read, refusals = _replayed_signatures(
        ATTACKED, inputs, 4, lambda i, key: SecAggClient(ATTACKED, i, key, NO_CORRUPTION))
    assert read is None
    assert refusals and set(refusals.values()) <= {"too_few_signatures", "bad_signature"}
    assert _stories(neighbours(ATTACKED, os.urandom(32)), 4, ATTACKED.threshold) is not None  # the plan exists


def test_a_signature_made_in_another_run_of_the_round_is_refused():
    """The same signer, the same survivor set, the same round id and parameters: only the run differs."""
    config = SecAggConfig("round-runs", 12, 6, 5, 10, 1.0)
    keys = {index: signatures.new_signing_key() for index in range(12)}
    registered = {index: signatures.public_bytes(key) for index, key in keys.items()}
    inputs = _inputs(config, 8)
    runs = []
    for _ in range(2):
        clients, server, masked = _run_to_signing(config, registered, lambda i: SecAggClient(config, i, keys[i]),
                                                  inputs, {})
        requests = server.collect_masked_inputs(list(masked.values()))
        signed = [clients[i].consistency_check(r) for i, r in requests.items()]
        runs.append((clients, {reply["client"]: reply["signature"] for reply in signed},
                     server.collect_consistency(signed)))
    (_, earlier, _), (clients, _, requests) = runs
    request = requests[0]
    first, *others = request["signatures"]
    with pytest.raises(ProtocolViolation) as refusal:
        clients[0].unmask(dict(request, signatures=[dict(first, signature=earlier[first["client"]]), *others]))
    assert refusal.value.reason == "bad_signature"
    assert clients[0].unmask(request)["shares"]  # the run's own signatures are taken


class _Sybil(SecAggClient):
    """A device the server made (or an insider working with it): it follows the protocol, and hands the server both
    shares it holds of any neighbour's secrets."""

    def both_shares(self, owner):
        key = crypto.agree(self._cipher_private, self._cipher_public_keys[owner], "share-encryption",
                           self.config.context)
        plaintext = crypto.decrypt(key, self._received[owner],
                                   client_module.share_associated_data(self.config, owner, self.client))
        return (int.from_bytes(plaintext[8 : 8 + SHARE_BYTES], "big"), int.from_bytes(plaintext[8 + SHARE_BYTES :], "big"))


def _two_sybils_next_to_the_victim(config, inputs, bounds, victim=0):
    """Issue #44's second attack, with pinned keys: the server's two devices sit on either side of the victim (a
    grind of the graph succeeded). Every honest device on the victim's left, the victim included, hears "everyone
    survived"; every one on its right hears "everyone but the victim". Each then finds t signatures on its own
    story among its neighbours (the two Sybils sign both), so the left reveals shares of the victim's seed and the
    right shares of its mask key, and with the Sybils' two shares each the server holds t of both when
    t <= (k + 2)/2. Returns (what the server read of the victim's input or None, refusal reasons)."""
    keys = {index: signatures.new_signing_key() for index in range(config.num_clients)}
    registered = {index: signatures.public_bytes(key) for index, key in keys.items()}
    pinned = frozenset(registered.values())
    try:
        clients = {index: _Sybil(config, index, keys[index], bounds, pinned) for index in range(config.num_clients)}
    except ProtocolViolation as refusal:
        return None, {"every device": refusal.reason}
    server = SecAggServer(config, registered)
    requests = server.collect_keys([client.advertise_keys() for client in clients.values()])
    requests = server.collect_shares([clients[i].share_keys(r) for i, r in requests.items()])
    masked = {i: clients[i].masked_input(r, inputs[i]) for i, r in requests.items()}
    order, n = ring_order(config, server.graph_seed), config.num_clients
    at = order.index(victim)
    sybils = {order[(at - 1) % n], order[(at + 1) % n]}
    right = {order[(at + step) % n] for step in range(1, n - n // 2)}
    story = {client: sorted(set(range(n)) - ({victim} if client in right else set())) for client in range(n)}
    signed = {client: clients[client].consistency_check({"stage": "consistency_check", "survivors": story[client]})
              ["signature"] for client in range(n) if client not in sybils}

    def signature(peer, survivors):
        if peer in sybils:  # the server signs any story with its devices' keys
            return to_base64(keys[peer].sign(server.consistency_payload(peer, survivors)))
        return signed[peer] if story[peer] == survivors else None

    refusals = {}
    shares = _reveal(clients, {client: {"stage": "unmask", "survivors": story[client], "signatures": [
        {"client": peer, "signature": signature(peer, story[client])} for peer in server.graph[client]
        if signature(peer, story[client]) is not None]} for client in server.graph[victim] if client not in sybils},
        refusals)
    for sybil in sybils:
        seed_share, key_share = clients[sybil].both_shares(victim)
        shares.setdefault((victim, "self_mask"), []).append((sybil + 1, seed_share))
        shares.setdefault((victim, "mask_key"), []).append((sybil + 1, key_share))
    try:
        seed = combine_shares(shares[(victim, "self_mask")], config.threshold)
        mask_key = crypto.load_private_key(combine_shares(shares[(victim, "mask_key")], config.threshold))
    except ShareError:
        return None, refusals
    value = np.frombuffer(from_base64(masked[victim]["masked_vector"], "masked_vector"),
                          dtype=crypto.MASK_DTYPES[config.modulus_bits]) - self_mask(config, seed)
    for peer in server.graph[victim]:
        mask = pairwise_mask(config, mask_key, server.keys[peer][1])
        value = value - mask if victim < peer else value + mask
    return value, refusals


@pytest.mark.parametrize("num_clients, neighbour_count", [(30, 8), pytest.param(100, 60, marks=pytest.mark.slow)])
def test_two_sybils_next_to_the_victim_read_it_at_t_k_over_2_plus_1_and_devices_refuse_that_t(num_clients,
                                                                                               neighbour_count):
    """Issue #44: at the server's old default t = k/2 + 1 two of its devices next to the victim suffice, pinned keys
    and the consistency check notwithstanding. A device's default bounds (two corrupt devices at least) refuse that
    t; at their floor the same attack leaves the server short of both secrets."""
    old = SecAggConfig("round-sybils", num_clients, neighbour_count, neighbour_count // 2 + 1, 6, 1.0)
    inputs = _inputs(old, 9)
    read, refusals = _two_sybils_next_to_the_victim(old, inputs, NO_CORRUPTION)
    assert refusals == {} and np.array_equal(read, inputs[0])  # what a device without the bound gives away
    assert _two_sybils_next_to_the_victim(old, inputs, SecAggBounds()) == (None, {"every device": "config_out_of_bounds"})
    threshold = threshold_floor(neighbour_count, corrupt_devices(num_clients))  # 6 at k = 8, 33 at k = 60
    floor = SecAggConfig("round-sybils", num_clients, neighbour_count, threshold, 6, 1.0)
    read, refusals = _two_sybils_next_to_the_victim(floor, _inputs(floor, 9), SecAggBounds())
    assert read is None


@pytest.mark.parametrize("cohort", [3, 5, 20, 120])
def test_a_survivor_fraction_raises_the_signed_floor_and_leaves_k_and_t_alone(cohort):
    """`survivor_fraction` lifts minimum_survivors to ceil(fraction x cohort), never above the cohort nor below the
    default floor; k and t stay what they were, and every default device accepts the config."""
    default = cohort_config("r", cohort, 10, 0.05, 127, 60)
    for fraction in (0.5, 0.9, 1.0):
        raised = cohort_config("r", cohort, 10, 0.05, 127, 60, survivor_fraction=fraction)
        assert (raised.neighbour_count, raised.threshold) == (default.neighbour_count, default.threshold)
        exact = math.ceil(Fraction(str(fraction)) * cohort)  # 0.9 x 120 is 108 devices, not 108.00000000000001
        assert raised.minimum_survivors == min(cohort, max(default.minimum_survivors, exact))
        SecAggBounds().check(raised)
    assert cohort_config("r", cohort, 10, 0.05, 127, 60, survivor_fraction=1.0).minimum_survivors == cohort
