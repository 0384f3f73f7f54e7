"""The round's outcome serialises to the JSON the round views read: sections no stage filled are absent (never
null), the counts are top-level fields, and a private round's unknown example count stays an explicit null."""

import json

from fedzoo.server.fl.outcome import RoundOutcome, ScreeningTally, SecureAggregationTally, UpdateCounts, ZooRound


def test_an_outcome_holds_only_what_its_stages_wrote_in_the_stored_order():
    assert json.loads(RoundOutcome(strategy="fedavg", failure="the root set cannot score updates").to_json()) == {
        "failure": "the root set cannot score updates", "strategy": "fedavg"}
    outcome = RoundOutcome(counts=UpdateCounts(3, 2, 60), upload_bytes=900,
                           screening=ScreeningTally(1, 1, 1, norm_limit=0.5), defences={"ran": [], "not_run": {}},
                           strategy="fedavg", publication={"published": True, "reason": "ok"})
    stored = json.loads(outcome.to_json())
    assert list(stored) == ["accepted_updates", "aggregated_updates", "num_examples", "upload_bytes", "screening",
                            "defences", "strategy", "publication"]
    assert stored["screening"] == {"norm_limit": 0.5, "counted": 1, "clipped": 1, "rejected": 1}
    assert "privacy" not in stored and "gate" not in stored and "root_trust" not in stored


def test_a_private_round_states_null_examples_and_its_secagg_tally():
    outcome = RoundOutcome(counts=UpdateCounts(4, 4, None), client_reported_metrics={},
                           screening=ScreeningTally(4, 0, 0, norm_limit=None),
                           secure_aggregation=SecureAggregationTally(5, 4, 3, 1024, 0.1, 4, 1, {"2": "bad share"}))
    stored = json.loads(outcome.to_json())
    assert stored["num_examples"] is None and stored["client_reported_metrics"] == {}
    assert stored["screening"]["norm_limit"] is None
    assert stored["secure_aggregation"] == {"num_clients": 5, "neighbour_count": 4, "threshold": 3, "levels": 1024,
                                            "clip_range": 0.1, "survivors": 4, "dropped": 1,
                                            "misbehaving": {"2": "bad share"}}


def test_a_zoo_round_states_per_subnet_limits_and_its_publication_only_once_published():
    zoo = ZooRound("sn-v1", {"m1": 2}, 1, 1.0, 1.5, {"parameters": 10}, 0.1, {"upload": 100})
    outcome = RoundOutcome(screening=ScreeningTally(2, 0, 0, per_subnet_norm_limit={"m1": 0.3}), zoo=zoo)
    stored = json.loads(outcome.to_json())
    assert stored["screening"] == {"per_subnet_norm_limit": {"m1": 0.3}, "counted": 2, "clipped": 0, "rejected": 0}
    assert "models" not in stored["zoo"] and "publication_s" not in stored["zoo"]
    zoo.models, zoo.new_versions, zoo.retired_from_lookup, zoo.publication_s = [], 0, [], 0.2
    assert json.loads(outcome.to_json())["zoo"]["retired_from_lookup"] == []
