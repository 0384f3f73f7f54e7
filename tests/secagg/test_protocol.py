"""Whole SecAgg+ rounds: exact sums whoever drops out when, lying servers refused, bad shares caught."""

import base64
import os
import random

import numpy as np
import pytest

import fedzoo.secagg.client as client_module
from fedzoo.secagg import (
    ProtocolViolation,
    RoundAborted,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    quantise,
    run_local_round,
)
from fedzoo.secagg.graph import neighbours
from fedzoo.secagg.messages import STAGES
from fedzoo.secagg.shamir import ShareError, combine_shares


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
    # survivors sent a masked input: those dropping at the unmask stage still count
    gone_before_unmask = set().union(*(c for stage, c in dropouts.items() if stage != "unmask")) | set(local.refusals)
    assert set(result.survivors) == set(range(config.num_clients)) - gone_before_unmask
    assert np.array_equal(result.ring_sum, _plain_sum(config, inputs, result.survivors))
    return local


# 24 clients, 16 neighbours, threshold 9: 30% (7 clients) dropping can never leave fewer than 9 of 16
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("rate", [0.0, 0.1, 0.3])
def test_the_sum_is_exact_whatever_fraction_drops_at_each_stage(stage, rate):
    config = SecAggConfig("round-7", 24, 16, 9, 20, 1.0)
    for seed in range(3):
        dropping = set(random.Random(seed).sample(range(24), round(rate * 24)))
        local = _exact(config, _inputs(config, seed), {stage: dropping})
        assert local.refusals == {} and local.result.misbehaving == {}
        if stage == "masked_input":
            assert local.result.dropped == sorted(dropping)


def test_the_sum_is_exact_when_clients_drop_at_every_stage_at_once():
    config = SecAggConfig("round-8", 30, 20, 11, 20, 1.0)
    for seed in range(3):
        order = random.Random(seed).sample(range(30), 8)
        dropouts = {"advertise_keys": set(order[:2]), "share_keys": set(order[2:4]),
                    "masked_input": set(order[4:6]), "unmask": set(order[6:])}
        _exact(config, _inputs(config, seed), dropouts)


@pytest.mark.slow
def test_many_seeded_rounds_of_sixty_clients_with_30_percent_dropping_after_key_sharing():
    config = SecAggConfig("round-9", 60, 30, 16, 50, 1.0)
    for seed in range(8):
        dropping = set(random.Random(seed).sample(range(60), 18))
        _exact(config, _inputs(config, seed), {"masked_input": dropping})


def _through_masked_inputs(config, inputs):
    clients = {index: SecAggClient(config, index) for index in range(config.num_clients)}
    server = SecAggServer(config)
    requests = server.collect_keys([c.advertise_keys() for c in clients.values()])
    requests = server.collect_shares([clients[i].share_keys(r) for i, r in requests.items()])
    return clients, server, requests, inputs


def test_clients_refuse_a_server_that_lists_a_client_as_survived_and_dropped():
    config = SecAggConfig("round-lie", 12, 6, 4, 10, 1.0)
    clients, server, requests, inputs = _through_masked_inputs(config, _inputs(config, 0))
    victim = 3
    masked = [clients[i].masked_input(r, inputs[i]) for i, r in requests.items()]
    honest = server.collect_masked_inputs(masked)
    for index, request in honest.items():
        lie = dict(request, dropped=sorted(set(request["dropped"]) | {victim}))
        if index == victim:
            continue
        with pytest.raises(ProtocolViolation) as refusal:
            clients[index].unmask(lie)
        assert refusal.value.reason == "overlapping_lists"


def test_a_server_telling_neighbours_different_stories_never_gets_both_secrets():
    """Half the victim's neighbours hear it dropped, half that it survived: since t > k/2, one half is short."""
    config = SecAggConfig("round-split", 16, 8, 5, 10, 1.0)
    clients, server, requests, inputs = _through_masked_inputs(config, _inputs(config, 1))
    masked = [clients[i].masked_input(r, inputs[i]) for i, r in requests.items()]
    honest = server.collect_masked_inputs(masked)
    victim = 0
    victim_neighbours = neighbours(config)[victim]
    told_dropped = set(victim_neighbours[: len(victim_neighbours) // 2])
    shares = {"self_mask": [], "mask_key": []}
    for index in victim_neighbours:
        request = honest[index]
        if index in told_dropped:
            request = {"stage": "unmask", "survivors": [c for c in request["survivors"] if c != victim],
                       "dropped": sorted(set(request["dropped"]) | {victim})}
        reply = clients[index].unmask(request)
        for share in reply["shares"]:
            if share["owner"] == victim:
                shares[share["kind"]].append((index + 1, int.from_bytes(base64.b64decode(share["value"]), "big")))
    assert len(shares["self_mask"]) + len(shares["mask_key"]) == len(victim_neighbours)  # one kind each, never both
    assert min(len(shares["self_mask"]), len(shares["mask_key"])) < config.threshold
    with pytest.raises(ShareError):
        combine_shares(min(shares.values(), key=len), config.threshold)


@pytest.mark.parametrize("tamper, reason", [
    (lambda request: dict(request, survivors=request["survivors"][:1]), "too_few_survivors"),
    (lambda request: dict(request, survivors=[c for c in request["survivors"] if c != 0],
                          dropped=request["dropped"] + [0]), "not_a_survivor"),
    (lambda request: dict(request, survivors="everyone"), "malformed"),
    (lambda request: dict(request, stage="share_keys"), "wrong_stage"),
])
def test_clients_refuse_unmask_requests_that_break_the_rules(tamper, reason):
    config = SecAggConfig("round-rules", 10, 6, 4, 10, 1.0, minimum_survivors=3)
    clients, server, requests, inputs = _through_masked_inputs(config, _inputs(config, 2))
    honest = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    with pytest.raises(ProtocolViolation) as refusal:
        clients[0].unmask(tamper(honest[0]))
    assert refusal.value.reason == reason


def test_stages_out_of_order_and_too_few_neighbours_are_refused():
    config = SecAggConfig("round-order", 10, 6, 4, 10, 1.0)
    client = SecAggClient(config, 0)
    with pytest.raises(ProtocolViolation) as refusal:
        client.unmask({"stage": "unmask", "survivors": [0, 1], "dropped": []})
    assert refusal.value.reason == "wrong_stage"
    client.advertise_keys()
    others = [SecAggClient(config, peer).advertise_keys() for peer in neighbours(config)[0][:3]]
    keys = [{k: v for k, v in reply.items() if k != "stage"} for reply in others]
    with pytest.raises(ProtocolViolation) as refusal:
        client.share_keys({"stage": "share_keys", "public_keys": keys})
    assert refusal.value.reason == "too_few_neighbours"
    stranger = next(c for c in range(10) if c not in neighbours(config)[0] and c != 0)
    fresh = SecAggClient(config, 0)
    fresh.advertise_keys()
    with pytest.raises(ProtocolViolation, match="not this client's neighbours"):
        fresh.share_keys({"stage": "share_keys", "public_keys": [dict(keys[0], client=stranger)]})


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
    config = SecAggConfig("round-liar", 20, 12, 7, 20, 1.0)
    inputs = _inputs(config, 3)
    local = run_local_round(config, inputs, {"masked_input": {5, 6}}, clients={4: _LyingHolder(config, 4)})
    assert np.array_equal(local.result.ring_sum, _plain_sum(config, inputs, local.result.survivors))
    assert list(local.result.misbehaving) == [4]
    assert "does not match its commitment" in local.result.misbehaving[4]


@pytest.mark.parametrize("dealer_drops", [False, True])
def test_a_dealer_sharing_garbage_aborts_the_round_with_no_sum(dealer_drops):
    config = SecAggConfig("round-dealer", 20, 12, 7, 20, 1.0)
    dropouts = {"masked_input": {9}} if dealer_drops else {}
    with pytest.raises(RoundAborted) as aborted:
        run_local_round(config, _inputs(config, 4), dropouts, clients={9: _BadDealer(config, 9)})
    assert aborted.value.clients == [9]


def test_a_tampered_ciphertext_is_reported_and_others_suffice():
    config = SecAggConfig("round-tamper", 20, 12, 7, 20, 1.0)
    inputs = _inputs(config, 5)
    clients, server, requests, _ = _through_masked_inputs(config, inputs)
    victim_holder = 2
    entry = requests[victim_holder]["encrypted_shares"][0]
    entry["ciphertext"] = entry["ciphertext"][:-4] + ("AAAA" if entry["ciphertext"][-4:] != "AAAA" else "BBBB")
    requests = server.collect_masked_inputs([clients[i].masked_input(r, inputs[i]) for i, r in requests.items()])
    replies = [clients[i].unmask(r) for i, r in requests.items()]
    assert next(r for r in replies if r["client"] == victim_holder)["undecryptable"] == [entry["owner"]]
    result = server.collect_unmask_shares(replies)
    assert np.array_equal(result.ring_sum, _plain_sum(config, inputs, result.survivors))


def test_too_few_masked_inputs_abort_before_anyone_unmasks():
    config = SecAggConfig("round-few", 10, 6, 4, 10, 1.0, minimum_survivors=5)
    with pytest.raises(RoundAborted, match="only 4 masked inputs"):
        run_local_round(config, _inputs(config, 6), {"masked_input": set(range(6))})


def test_a_client_advertising_a_low_order_key_is_dropped_by_the_server_and_refused_by_clients():
    config = SecAggConfig("round-keys", 12, 6, 4, 10, 1.0)
    clients = {index: SecAggClient(config, index) for index in range(12)}
    replies = [client.advertise_keys() for client in clients.values()]
    replies[5]["mask_public_key"] = base64.b64encode(bytes(32)).decode()  # the all-zero point: no agreement
    server = SecAggServer(config)
    requests = server.collect_keys(replies)
    assert 5 not in requests and "malformed keys" in server.misbehaving[5]
    neighbour = neighbours(config)[5][0]
    forged = dict(requests[neighbour])
    forged["public_keys"] = requests[neighbour]["public_keys"] + [
        {"client": 5, "cipher_public_key": replies[5]["cipher_public_key"], "mask_public_key": replies[5]["mask_public_key"]}]
    with pytest.raises(ProtocolViolation) as refusal:
        clients[neighbour].share_keys(forged)
    assert refusal.value.reason == "malformed"
