"""Private rounds in the simulator: SecAgg+ gives FedAvg's model, DP plans stop at their budget, and rules
that need each update are refused."""

import numpy as np
import pytest

from fedzoo.aggregation.private import ServerMomentum
from fedzoo.aggregation.strategies import SecureAggregationUnsupportedError, make_strategy
from fedzoo.cloud.inprocess import DpOptions, SecureAggregationOptions, run_private_rounds
from fedzoo.cloud.simulation import prepare_federation
from fedzoo.dp.accountant import epsilon_after
from fedzoo.dp.noise import AdaptiveClipping
from fedzoo.errors import InvalidInputError

TRAINING = {"optimizer": "sgd", "learning_rate": 0.05, "local_epochs": 1, "batch_size": 16}


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=30, alpha=1.0, hidden_units=16, seed=4)


def test_secure_aggregation_reaches_the_model_plain_fedavg_reaches(federation):
    options = SecureAggregationOptions(neighbour_count=8, levels=32767, clip_range=1.0,
                                       max_examples=max(len(shard) for shard in federation.shards))
    plain = run_private_rounds(federation, 2, 10, TRAINING, executor="in-process", seed=1)
    secure = run_private_rounds(federation, 2, 10, TRAINING, secure_aggregation=options, executor="in-process", seed=1)
    assert [r.survivors for r in secure] == [10, 10]
    # same cohorts and local training; only the 15-bit quantisation of deltas and weights differs
    assert [r.accuracy for r in secure] == pytest.approx([r.accuracy for r in plain], abs=0.01)
    assert all(r.upload_bytes_per_client > 2 * 1210 for r in secure)  # at least the 2-byte-per-value vector


def test_secure_aggregation_survives_dropouts_after_key_sharing(federation):
    # k = 16, t = 10 (the floor against 2 corrupt devices): 6 of 20 dropping leave 10 of any device's neighbours
    options = SecureAggregationOptions(neighbour_count=16, threshold=10, clip_range=0.1, dropout_after_key_sharing=0.3)
    records = run_private_rounds(federation, 2, 20, TRAINING, secure_aggregation=options, executor="in-process")
    assert [r.survivors for r in records] == [14, 14] and not any(r.aborted for r in records)


def test_a_dp_plan_stops_before_its_budget(federation):
    dp = DpOptions(max_epsilon=epsilon_after(2, 2.0, 10 / 30, 1e-5) + 1e-6, noise_multiplier=2.0, clip_norm=0.3)
    records = run_private_rounds(federation, 5, 10, TRAINING, dp=dp, executor="in-process")
    assert len(records) == 2
    assert records[-1].epsilon == pytest.approx(epsilon_after(2, 2.0, 10 / 30, 1e-5))
    assert records[0].epsilon < records[1].epsilon <= dp.max_epsilon


def test_dp_with_secure_aggregation_and_adaptive_clipping_spends_the_planned_budget(federation, caplog):
    dp = DpOptions(max_epsilon=8.0, clip_norm=0.3, adaptive=AdaptiveClipping(clip_learning_rate=0.5))
    options = SecureAggregationOptions(neighbour_count=8, levels=32767)
    with caplog.at_level("WARNING", logger="fedzoo.cloud.inprocess"):
        records = run_private_rounds(federation, 3, 10, TRAINING, dp=dp, secure_aggregation=options,
                                     executor="in-process")
    # its noise follows from the seed: it says so, and that nothing it makes is private
    assert "reproducible (drawn from seed 0)" in caplog.text and "nothing it produces is private" in caplog.text
    assert len(records) == 3 and records[-1].epsilon == pytest.approx(8.0, abs=0.05)
    assert len({r.clip_norm for r in records}) == 3  # the bound moved every round
    assert all(np.isfinite(r.accuracy) for r in records)


@pytest.mark.parametrize("name", ["median", "multi_krum"])
def test_rules_that_need_each_update_are_refused_under_secagg_or_dp(federation, name):
    with pytest.raises(SecureAggregationUnsupportedError, match=name):
        run_private_rounds(federation, 1, 10, TRAINING, {"name": name}, SecureAggregationOptions(), executor="in-process")
    with pytest.raises(SecureAggregationUnsupportedError, match=name):
        run_private_rounds(federation, 1, 10, TRAINING, {"name": name}, dp=DpOptions(max_epsilon=8.0),
                           executor="in-process")



def test_fedprox_devices_get_the_proximal_term_under_secure_aggregation(federation, monkeypatch):
    import fedzoo.cloud.inprocess as simulation

    seen = []

    def recording_train_locally(graph, model, card, training, data, seed):
        seen.append(training)
        return real(graph, model, card, training, data, seed)

    real = simulation.train_locally
    monkeypatch.setattr(simulation, "train_locally", recording_train_locally)
    options = SecureAggregationOptions(neighbour_count=8)
    run_private_rounds(federation, 1, 10, TRAINING, {"name": "fedprox", "proximal_mu": 0.3},
                       secure_aggregation=options, executor="in-process")
    assert len(seen) == 10 and all(training == {**TRAINING, "proximal_mu": 0.3} for training in seen)


def test_server_momentum_steps_along_the_running_sum_of_mean_deltas():
    step = ServerMomentum(make_strategy({"name": "fedavg", "server_learning_rate": 0.5}), momentum=0.9)
    parameters = {"w": np.zeros(2, dtype=np.float32)}
    mean_delta = {"w": np.array([1.0, -2.0])}
    first = step.apply_mean_delta(parameters, mean_delta)
    second = step.apply_mean_delta(first, mean_delta)
    np.testing.assert_allclose(first["w"], 0.5 * mean_delta["w"])
    np.testing.assert_allclose(second["w"], first["w"] + 0.5 * 1.9 * mean_delta["w"], rtol=1e-6)


def test_server_momentum_takes_a_momentum_in_0_to_1_over_fedavg_or_fedprox_only():
    """The edges: 0 (plain FedAvg) and just under 1 are taken; 1 (a velocity that never decays), above it and below 0
    are refused, as is a strategy with its own server state (FedAdam), each naming `server_momentum`."""
    for name, momentum in (("fedavg", 0.0), ("fedprox", 0.999)):
        assert ServerMomentum(make_strategy({"name": name}), momentum).name == f"{name}+momentum"
    for name, momentum, words in (("fedavg", 1.0, r"must lie in \[0, 1\), got 1.0"),
                                  ("fedavg", -0.01, r"must lie in \[0, 1\), got -0.01"),
                                  ("fedadam", 0.5, "applies to fedavg and fedprox, not 'fedadam'")):
        with pytest.raises(InvalidInputError, match=f"^server_momentum {words}$") as refused:
            ServerMomentum(make_strategy({"name": name}), momentum)
        assert refused.value.field == "server_momentum"


def test_momentum_changes_dp_rounds_from_the_second_on_and_is_refused_where_it_has_no_meaning(federation):
    dp = DpOptions(max_epsilon=50.0, clip_norm=0.3)
    plain = run_private_rounds(federation, 2, 10, TRAINING, dp=dp, executor="in-process", seed=2)
    momentum = run_private_rounds(federation, 2, 10, TRAINING, dp=dp, executor="in-process", seed=2, server_momentum=0.9)
    assert momentum[0].accuracy == plain[0].accuracy and momentum[1].accuracy != plain[1].accuracy
    with pytest.raises(InvalidInputError) as error:
        run_private_rounds(federation, 1, 10, TRAINING, {"name": "fedadam"}, executor="in-process", server_momentum=0.9)
    assert error.value.field == "server_momentum"
    with pytest.raises(InvalidInputError) as error:
        run_private_rounds(federation, 1, 10, TRAINING, executor="in-process", server_momentum=1.0)
    assert error.value.field == "server_momentum"


def test_settings_are_chosen_on_the_validation_split_and_the_baseline_can_weigh_devices_equally(federation):
    on_test = run_private_rounds(federation, 1, 10, TRAINING, executor="in-process", seed=3)
    on_validation = run_private_rounds(federation, 1, 10, TRAINING, executor="in-process", seed=3, evaluate_on="validation")
    equal = run_private_rounds(federation, 3, 10, TRAINING, executor="in-process", seed=3, evaluate_on="validation",
                               equal_weights=True)
    weighted = run_private_rounds(federation, 3, 10, TRAINING, executor="in-process", seed=3, evaluate_on="validation")
    # the same model, measured on the other split; then the same cohorts weighted 1 each instead of by examples
    assert on_validation[0].accuracy != on_test[0].accuracy
    assert [r.accuracy for r in equal] != [r.accuracy for r in weighted]
    with pytest.raises(InvalidInputError) as error:
        run_private_rounds(federation, 1, 10, TRAINING, executor="in-process", evaluate_on="train")
    assert error.value.field == "evaluate_on"


def test_the_server_and_the_simulator_size_a_cohort_by_one_rule():
    from fedzoo.cloud.inprocess import SecureAggregationOptions
    from fedzoo.secagg.bounds import SecAggBounds, cohort_config
    from fedzoo.server.fl.schemas import SecureAggregationSettings
    from fedzoo.server.fl.secure_rounds import secagg_config

    options, settings = SecureAggregationOptions(), SecureAggregationSettings()
    for cohort in (3, 4, 10, 61, 100, 250):
        simulated = cohort_config("r", cohort, 10, 0.05, options.levels, options.neighbour_count, options.threshold)
        served = secagg_config(settings, 1, cohort, 10, 0.05, 0)
        assert (simulated.neighbour_count, simulated.threshold, simulated.minimum_survivors) == (
            served.neighbour_count, served.threshold, served.minimum_survivors)
        SecAggBounds().check(simulated)
