"""Strategies against their definitions computed directly on stacked arrays."""

import math

import numpy as np
import pytest

from fedzoo.errors import InvalidInputError
from fedzoo.aggregation.strategies import (
    ClientUpdate,
    CoordinateMedian,
    MultiKrum,
    FedAdam,
    FedAvg,
    FedProx,
    NormClipping,
    TrimmedMean,
    make_strategy,
)


def _global_parameters():
    return {"b": np.array([1.0, -1.0, 0.5], dtype=np.float32), "w": np.arange(6, dtype=np.float32).reshape(2, 3)}


def _updates(count=7, seed=0):
    rng = np.random.default_rng(seed)
    updates, loads = [], []
    for index in range(count):
        delta = {"b": rng.normal(size=3).astype(np.float32), "w": rng.normal(size=(2, 3)).astype(np.float32)}
        norm = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in delta.values()))
        counter = {"loads": 0}

        def load(delta=delta, counter=counter):
            counter["loads"] += 1
            return {name: value.copy() for name, value in delta.items()}

        updates.append(ClientUpdate(f"device-{index}", int(rng.integers(1, 50)), load, norm))
        loads.append((delta, counter))
    return updates, loads


def _stack(loads, name):
    return np.stack([delta[name] for delta, _ in loads])


def test_fedavg_is_the_example_weighted_mean_and_reads_each_update_once():
    base = _global_parameters()
    updates, loads = _updates()
    result = FedAvg().aggregate_fit(base, updates)
    weights = np.array([u.num_examples for u in updates], dtype=np.float64)
    for name in base:
        expected = base[name] + np.tensordot(weights, _stack(loads, name), axes=1) / weights.sum()
        np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)
        assert result[name].dtype == np.float32
    assert all(counter["loads"] == 1 for _, counter in loads)


def test_fedprox_aggregates_like_fedavg_and_sends_mu_to_clients():
    base = _global_parameters()
    updates, _ = _updates()
    strategy = FedProx(proximal_mu=0.1)
    assert strategy.configure_fit(1) == {"proximal_mu": 0.1}
    assert FedAvg().configure_fit(1) == {}
    for name, value in strategy.aggregate_fit(base, updates).items():
        np.testing.assert_allclose(value, FedAvg().aggregate_fit(base, updates)[name])


def test_fedadam_takes_bias_corrected_adam_steps_and_its_state_survives_a_restart():
    base = _global_parameters()
    updates, loads = _updates()
    weights = np.array([u.num_examples for u in updates], dtype=np.float64)
    strategy = FedAdam(server_lr=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)
    first = strategy.aggregate_fit(base, updates)
    for name in base:
        delta = np.tensordot(weights, _stack(loads, name), axes=1) / weights.sum()
        m, v = 0.1 * delta, 0.01 * delta**2
        step = 0.1 * math.sqrt(1 - 0.99) / (1 - 0.9)
        np.testing.assert_allclose(first[name], base[name] + step * m / (np.sqrt(v) + 1e-3), rtol=1e-4)
    restarted = FedAdam(server_lr=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)
    restarted.load_state(strategy.state())
    assert restarted.step == 1
    second_original = strategy.aggregate_fit(first, updates)
    second_restarted = restarted.aggregate_fit(first, updates)
    for name in base:
        np.testing.assert_allclose(second_restarted[name], second_original[name])


@pytest.mark.parametrize("working_memory_bytes", [1024, 32 * 1024 * 1024])
def test_median_matches_numpy_whatever_the_block_size(working_memory_bytes, tmp_path):
    base = _global_parameters()
    updates, loads = _updates(count=9)
    result = CoordinateMedian(working_memory_bytes=working_memory_bytes, spill_dir=tmp_path).aggregate_fit(base, updates)
    for name in base:
        np.testing.assert_allclose(result[name], base[name] + np.median(_stack(loads, name), axis=0), rtol=1e-6)
    assert list(tmp_path.iterdir()) == []  # the spill file is removed


def test_trimmed_mean_drops_the_extremes_per_coordinate():
    base = _global_parameters()
    updates, loads = _updates(count=10)
    result = TrimmedMean(trim_fraction=0.2, working_memory_bytes=1024).aggregate_fit(base, updates)
    for name in base:
        ordered = np.sort(_stack(loads, name), axis=0)
        np.testing.assert_allclose(result[name], base[name] + ordered[2:8].mean(axis=0), rtol=1e-5, atol=1e-6)


def test_robust_rules_ignore_one_huge_poisoned_update_that_moves_fedavg():
    base = _global_parameters()
    updates, loads = _updates(count=9)
    poisoned_delta = {name: np.full_like(value, 1e4) for name, value in loads[0][0].items()}
    poisoned = ClientUpdate("attacker", 40, lambda: poisoned_delta, norm=1e4 * math.sqrt(9))
    attacked = [poisoned] + updates[1:]
    for strategy in (CoordinateMedian(), TrimmedMean(trim_fraction=0.2), NormClipping(), MultiKrum()):
        moved = max(float(np.max(np.abs(strategy.aggregate_fit(base, attacked)[n] - base[n]))) for n in base)
        assert moved < 5, strategy.name
    fedavg_moved = max(float(np.max(np.abs(FedAvg().aggregate_fit(base, attacked)[n] - base[n]))) for n in base)
    assert fedavg_moved > 100


def test_norm_clipping_scales_long_deltas_down_to_the_bound():
    base = {"w": np.zeros(2, dtype=np.float32)}
    long = ClientUpdate("a", 1, lambda: {"w": np.array([30.0, 40.0], dtype=np.float32)}, norm=50.0)
    short = ClientUpdate("b", 1, lambda: {"w": np.array([0.6, 0.8], dtype=np.float32)}, norm=1.0)
    result = NormClipping(max_norm=5.0).aggregate_fit(base, [long, short])
    np.testing.assert_allclose(result["w"], (np.array([3.0, 4.0]) + np.array([0.6, 0.8])) / 2, rtol=1e-6)
    assert NormClipping().clip_norm([long, short, short]) == 1.0


@pytest.mark.parametrize("strategy_class", [FedAvg, FedProx, CoordinateMedian, TrimmedMean, NormClipping, MultiKrum])
def test_a_server_learning_rate_scales_the_aggregate_delta(strategy_class):
    base = _global_parameters()
    updates, _ = _updates(count=9)
    plain = strategy_class().aggregate_fit(base, updates)
    doubled = strategy_class(server_learning_rate=2.0).aggregate_fit(base, updates)
    for name in base:
        np.testing.assert_allclose(doubled[name] - base[name], 2 * (plain[name] - base[name]), rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidInputError, match="server_learning_rate") as error:
        strategy_class(server_learning_rate=0.0)
    assert error.value.field == "server_learning_rate"


def test_make_strategy_builds_from_json_and_names_bad_options():
    assert isinstance(make_strategy({"name": "trimmed_mean", "trim_fraction": 0.1}), TrimmedMean)
    assert isinstance(make_strategy({}), FedAvg)
    with pytest.raises(InvalidInputError, match="unknown strategy 'krum'") as error:
        make_strategy({"name": "krum"})
    assert error.value.field == "strategy.name"
    with pytest.raises(InvalidInputError, match="bad options for strategy 'fedavg'"):
        make_strategy({"name": "fedavg", "server_lr": 1.0})
    with pytest.raises(InvalidInputError, match="trim_fraction"):
        make_strategy({"name": "trimmed_mean", "trim_fraction": 0.5})
    with pytest.raises(InvalidInputError, match="aggregation needs at least one"):
        FedAvg().aggregate_fit(_global_parameters(), [])


def test_the_server_chooses_where_coordinate_wise_rules_spill(tmp_path):
    assert make_strategy({"name": "median"}, spill_dir=tmp_path).spill_dir == tmp_path
    assert isinstance(make_strategy({"name": "fedavg"}, spill_dir=tmp_path), FedAvg)
    with pytest.raises(InvalidInputError, match="spill_dir is the server's"):
        make_strategy({"name": "median", "spill_dir": "/etc"})


@pytest.mark.parametrize("working_memory_bytes", [1024, 32 * 1024 * 1024])
def test_multi_krum_drops_the_outliers_and_averages_the_rest_by_examples(working_memory_bytes):
    base = _global_parameters()
    updates, loads = _updates(count=10, seed=4)
    poisoned = []
    for index in (2, 7):  # two far-away updates among ten: f = floor(0.2 * 10) = 2 are dropped
        far = {name: np.full_like(value, -50.0) for name, value in loads[index][0].items()}
        poisoned.append(index)
        updates[index] = ClientUpdate(f"attacker-{index}", 30, lambda far=far: far, norm=50.0 * 3)
    strategy = MultiKrum(byzantine_fraction=0.2, working_memory_bytes=working_memory_bytes)
    result = strategy.aggregate_fit(base, updates)
    kept = [index for index in range(10) if index not in poisoned]
    weights = np.array([updates[index].num_examples for index in kept], dtype=np.float64)
    for name in base:
        stacked = np.stack([loads[index][0][name] for index in kept])
        expected = base[name] + np.tensordot(weights, stacked, axes=1) / weights.sum()
        np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidInputError, match="byzantine_fraction"):
        MultiKrum(byzantine_fraction=0.5)


def _flower_fedadam_step(parameters, mean_delta, m, v, server_round, eta, beta_1, beta_2, tau):
    """Flower's FedAdam.aggregate_fit (flwr 1.x, strategy/fedadam.py) rewritten on plain arrays."""
    m = beta_1 * m + (1 - beta_1) * mean_delta
    v = beta_2 * v + (1 - beta_2) * mean_delta * mean_delta
    eta_norm = eta * np.sqrt(1 - np.power(beta_2, server_round + 1.0)) / (1 - np.power(beta_1, server_round + 1.0))
    return parameters + eta_norm * m / (np.sqrt(v) + tau), m, v


def _kingma_ba_fedadam_step(parameters, mean_delta, m, v, t, eta, beta_1, beta_2, tau):
    """Reddi et al.'s FedAdam with Kingma & Ba's alpha_t = eta sqrt(1 - beta_2^t) / (1 - beta_1^t), t = steps taken."""
    m = beta_1 * m + (1 - beta_1) * mean_delta
    v = beta_2 * v + (1 - beta_2) * mean_delta * mean_delta
    return parameters + eta * math.sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (np.sqrt(v) + tau), m, v


def test_fedadam_follows_kingma_ba_step_counting_and_is_one_step_behind_flower():
    rng = np.random.default_rng(3)
    parameters = {"w": rng.normal(size=50).astype(np.float32)}
    strategy = FedAdam(server_lr=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)
    reference = parameters["w"].astype(np.float64)
    m = v = np.zeros(50)
    for t in range(1, 6):
        mean_delta = rng.normal(size=50).astype(np.float32)
        parameters = strategy.apply_mean_delta(parameters, {"w": mean_delta})
        reference, m, v = _kingma_ba_fedadam_step(reference, mean_delta.astype(np.float64), m, v, t, 0.1, 0.9, 0.99, 1e-3)
        np.testing.assert_allclose(parameters["w"], reference, rtol=1e-5, atol=1e-6)
    # Flower's counter is one ahead: from the same start, its round-1 step is 0.74x ours (ours is 1.35x Flower's)
    zero, delta = np.zeros(50), rng.normal(size=50)
    ours = FedAdam(server_lr=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3).apply_mean_delta(
        {"w": zero.astype(np.float32)}, {"w": delta.astype(np.float32)})["w"]
    flower, _, _ = _flower_fedadam_step(zero, delta, zero, zero, 1, 0.1, 0.9, 0.99, 1e-3)
    ratio = float(np.linalg.norm(ours) / np.linalg.norm(flower))
    assert ratio == pytest.approx(1.0 / (math.sqrt(1 - 0.99**2) / (1 - 0.9**2)), rel=1e-5)
    assert ratio == pytest.approx(1.347, abs=1e-3)


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "multi_krum", "norm_clipping"])
def test_rules_that_need_each_update_refuse_secure_aggregation(name):
    from fedzoo.aggregation.strategies import SecureAggregationUnsupportedError, require_secure_aggregation_support

    strategy = make_strategy({"name": name})
    with pytest.raises(SecureAggregationUnsupportedError, match=f"{name}.*cannot run under secure aggregation") as error:
        require_secure_aggregation_support(strategy)
    assert error.value.field == "strategy.name"
    with pytest.raises(SecureAggregationUnsupportedError):
        strategy.apply_mean_delta(_global_parameters(), _global_parameters())


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedadam"])
def test_sum_only_rules_run_on_a_mean_delta_as_they_do_on_updates(name):
    from fedzoo.aggregation.strategies import require_secure_aggregation_support, weighted_mean_delta

    base = _global_parameters()
    updates, _ = _updates()
    require_secure_aggregation_support(make_strategy({"name": name}))
    from_updates = make_strategy({"name": name}).aggregate_fit(base, updates)
    from_mean = make_strategy({"name": name}).apply_mean_delta(base, weighted_mean_delta(base, updates))
    for key in base:
        np.testing.assert_allclose(from_mean[key], from_updates[key])
