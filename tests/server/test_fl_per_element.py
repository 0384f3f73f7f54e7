"""Per-element aggregation over a supernet: the mean over the devices covering each element, uncovered (and
under-covered) elements kept, strategies that need only the mean, and the coverage report."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.nas.space import tiny_space
from fedzoo.nas.subnet_mapping import MappedDelta, extract_weights, map_back
from fedzoo.aggregation.per_element import (
    MIN_RUNNING_VARIANCE, CoverageSum, apply_per_element, coverage_by_layer, coverage_report, coverage_step_scale,
    is_statistic, layer_of, require_mean_only, step_supernet,
)
from fedzoo.aggregation.strategies import FedAdam, FedAvg, make_strategy

SPACE = tiny_space(8)


def random_weights(seed: int) -> dict[str, np.ndarray]:
    import torch

    from fedzoo.nas.supernet import Supernet

    torch.manual_seed(seed)
    return {name: value.numpy().copy() for name, value in Supernet(SPACE, 10, 1).state_dict().items()
            if not name.endswith("num_batches_tracked")}


def aggregate(weights, mapped: list[MappedDelta], examples: list[float], min_coverage: int = 1, strategy=None):
    total = CoverageSum({name: value.shape for name, value in weights.items() if "kernel_transforms" not in name})
    for delta, count in zip(mapped, examples):
        total.add(delta, count)
    released = total.released(min_coverage)
    return apply_per_element(strategy or FedAvg(), weights, total.mean(released), released), total, released


@settings(max_examples=15, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4), examples=st.lists(
    st.integers(1, 500), min_size=4, max_size=4))
def test_the_mean_of_identical_supernet_deltas_is_that_delta_where_covered(seeds, examples):
    """Devices with different subnets each send the slice of one supernet delta D: the result moves every
    covered element by exactly D and leaves the rest."""
    weights = random_weights(0)
    rng = np.random.default_rng(seeds[0])
    supernet_delta = {name: rng.normal(size=value.shape).astype(np.float32) * 0.01 for name, value in weights.items()}
    archs = [SPACE.sample_arch(np.random.default_rng(seed)) for seed in seeds]
    archs[0] = SPACE.max_arch()  # so kernels are covered directly too: the slices agree there
    mapped = [map_back(SPACE, arch, weights, extract_slices(arch, supernet_delta, weights)) for arch in archs]
    result, total, released = aggregate(weights, mapped, examples[: len(mapped)])
    for name, value in result.items():
        covered = released[name]
        np.testing.assert_allclose(value[covered], (weights[name] + supernet_delta[name])[covered], atol=1e-5)
        np.testing.assert_array_equal(value[~covered], weights[name][~covered])


def extract_slices(arch, supernet_delta, weights):
    """The subnet's share of a supernet delta D: what a device sends that moved its subnet by D. A fresh
    supernet's kernel transforms are the identity, so a smaller kernel's share is D's centre."""
    assert all(np.array_equal(value, np.eye(len(value))) for name, value in weights.items() if "kernel_transforms" in name)
    return extract_weights(SPACE, arch, {**supernet_delta, **{name: value for name, value in weights.items()
                                                              if "kernel_transforms" in name}})


def test_an_element_is_averaged_over_the_devices_covering_it_weighted_by_examples():
    weights = random_weights(1)
    large, small = SPACE.max_arch(), SPACE.min_arch()
    ones = {name: np.ones_like(value) for name, value in extract_weights(SPACE, large, weights).items()}
    threes = {name: np.full_like(value, 3.0) for name, value in extract_weights(SPACE, small, weights).items()}
    mapped = [map_back(SPACE, large, weights, ones), map_back(SPACE, small, weights, threes)]
    result, total, _ = aggregate(weights, mapped, [100, 300])
    name = "stages.0.0.expand_weight"
    mid = SPACE.stem_channels * min(SPACE.expand_ratio_choices)
    # both cover the first `mid` channels: (1 * 100 + 3 * 300) / 400 = 2.5; only the large one the rest
    np.testing.assert_allclose(result[name][:mid] - weights[name][:mid], 2.5, rtol=1e-6)
    np.testing.assert_allclose(result[name][mid:] - weights[name][mid:], 1.0, rtol=1e-6)
    assert total.counts[name][:mid].min() == 2 and total.counts[name][mid:].max() == 1


def test_elements_below_the_coverage_threshold_are_never_released():
    weights = random_weights(2)
    large, small = SPACE.max_arch(), SPACE.min_arch()
    mapped = [map_back(SPACE, arch, weights, {name: np.ones_like(value) for name, value in
                                             extract_weights(SPACE, arch, weights).items()}) for arch in (large, small)]
    result, total, released = aggregate(weights, mapped, [10, 10], min_coverage=2)
    for name, value in result.items():
        single = total.counts[name] < 2
        np.testing.assert_array_equal(value[single], weights[name][single])
        assert not released[name][single].any()
    report = coverage_report(total.counts, released)
    assert report["classifier.weight"].released == report["classifier.weight"].elements  # every device has it
    assert report["classifier.weight"].min_count == 2 and report["stages.0.1.expand_weight"].max_count == 1
    assert report["stages.0.1.expand_weight"].released == 0  # only the largest subnet has a second block


def test_fedadam_moves_only_covered_elements_and_keeps_its_state():
    weights = random_weights(3)
    arch = SPACE.min_arch()
    mapped = [map_back(SPACE, arch, weights, {name: np.full_like(value, 0.1) for name, value in
                                             extract_weights(SPACE, arch, weights).items()})]
    strategy = FedAdam(server_lr=0.05)
    result, total, released = aggregate(weights, mapped, [5], strategy=strategy)
    for name, value in result.items():
        np.testing.assert_array_equal(value[~released[name]], weights[name][~released[name]])
        assert np.all(value[released[name]] > weights[name][released[name]])
    assert int(strategy.state()["step"]) == 1


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "multi_krum", "norm_clipping"])
def test_rules_that_need_each_update_are_refused(name):
    strategy = make_strategy({"name": name})
    with pytest.raises(InvalidInputError, match="per element") as error:
        require_mean_only(strategy)
    assert error.value.field == "strategy.name"


def test_a_zero_weight_is_refused():
    with pytest.raises(InvalidInputError, match="positive"):
        CoverageSum({"a": (2,)}).add(MappedDelta({"a": np.zeros(2, np.float32)}, {"a": np.ones(2, bool)}), 0)


def test_coverage_by_layer_sums_tensors_of_a_layer():
    counts = {"stages.0.1.expand_weight": np.array([0, 1, 2]), "stages.0.1.expand_norm.bias": np.array([2]),
              "stem.0.weight": np.array([3, 3])}
    released = {name: count >= 2 for name, count in counts.items()}
    layers = coverage_by_layer(coverage_report(counts, released))
    assert layers["stages.0.1"] == {"elements": 4, "uncovered": 1, "single": 1, "released": 2, "min_count": 0,
                                    "max_count": 2, "mean_count": 1.25}
    assert layers["stem"]["released"] == 2 and layer_of("head.1.weight") == "head"


def test_a_supernet_step_moves_statistics_by_their_mean_and_keeps_variances_positive():
    weights = random_weights(4)
    arch = SPACE.min_arch()
    shares = extract_weights(SPACE, arch, weights)
    deltas = {name: np.full_like(value, -5.0 if name.endswith("running_var") else 0.5) for name, value in shares.items()}
    total = CoverageSum({name: value.shape for name, value in weights.items()})
    total.add(map_back(SPACE, arch, weights, deltas), 3)
    stepped, released = step_supernet(FedAvg(), weights, total, min_coverage=1)
    mean_name, var_name = "stages.0.0.expand_norm.running_mean", "stages.0.0.expand_norm.running_var"
    covered = released[mean_name]
    np.testing.assert_allclose(stepped[mean_name][covered], weights[mean_name][covered] + 0.5, rtol=1e-6)
    assert np.all(stepped[var_name][covered] == MIN_RUNNING_VARIANCE)  # 1 - 5 < 0: clamped, never negative
    np.testing.assert_array_equal(stepped[var_name][~covered], weights[var_name][~covered])
    for name in weights:
        if "kernel_transforms" in name:
            np.testing.assert_array_equal(stepped[name], weights[name])


def ones_from(arch, weights, value: float = 1.0) -> MappedDelta:
    """A device of `arch` whose delta is `value` on every tensor it holds."""
    return map_back(SPACE, arch, weights, {name: np.full_like(share, value)
                                           for name, share in extract_weights(SPACE, arch, weights).items()})


def cohorts(weights, devices: list[tuple[str, object, float]]) -> CoverageSum:
    total = CoverageSum({name: value.shape for name, value in weights.items()})
    for subnet, arch, value in devices:
        total.add(ones_from(arch, weights, value), 10, subnet)
    return total


def test_a_server_learning_rate_of_one_and_exponent_zero_reproduce_the_plain_per_element_mean():
    weights = random_weights(5)
    devices = [("small", SPACE.min_arch(), 3.0), ("large", SPACE.max_arch(), 1.0), ("large", SPACE.max_arch(), 2.0)]
    plain, released = step_supernet(FedAvg(), weights, cohorts(weights, devices), min_coverage=1)
    explicit, _ = step_supernet(FedAvg(server_learning_rate=1.0), weights, cohorts(weights, devices), min_coverage=1,
                                coverage_step_exponent=0.0)
    total = cohorts(weights, devices)
    mean = total.mean(total.released(1))
    for name, value in plain.items():
        np.testing.assert_array_equal(explicit[name], value)
        if not is_statistic(name) and "kernel_transforms" not in name:
            np.testing.assert_allclose(value, np.where(released[name], weights[name] + mean[name], weights[name]),
                                       rtol=1e-6, atol=1e-7)


def test_a_server_learning_rate_scales_only_released_elements():
    weights = random_weights(6)
    devices = [("small", SPACE.min_arch(), 0.5)]
    once, released = step_supernet(FedAvg(), weights, cohorts(weights, devices), min_coverage=1)
    twice, _ = step_supernet(FedAvg(server_learning_rate=2.0), weights, cohorts(weights, devices), min_coverage=1)
    name = "stages.0.0.expand_weight"
    covered = released[name]
    assert covered.any() and not covered.all()  # the smallest subnet holds the leading channels only
    np.testing.assert_allclose((twice[name] - weights[name])[covered], 2 * (once[name] - weights[name])[covered],
                               rtol=1e-5)
    np.testing.assert_array_equal(twice[name][~covered], weights[name][~covered])


def test_one_subnet_gets_the_plain_mean_whatever_the_exponent():
    """A round of one subnet is a single-model plan's shape: no element is covered by more than its cohort."""
    weights = random_weights(7)
    devices = [("only", SPACE.max_arch(), 1.0), ("only", SPACE.max_arch(), 3.0)]
    plain, _ = step_supernet(FedAvg(), weights, cohorts(weights, devices), min_coverage=1)
    scaled, _ = step_supernet(FedAvg(), weights, cohorts(weights, devices), min_coverage=1, coverage_step_exponent=1.0)
    for name, value in plain.items():
        np.testing.assert_array_equal(scaled[name], value)


@pytest.mark.parametrize("exponent", [0.5, 1.0])
def test_elements_several_cohorts_cover_step_further_and_uncovered_ones_keep_their_values(exponent):
    weights = random_weights(8)
    small, large = SPACE.min_arch(), SPACE.max_arch()
    devices = [("small", small, 1.0), ("small", small, 1.0), ("large", large, 1.0), ("large", large, 1.0)]
    total = cohorts(weights, devices)
    assert total.devices_per_subnet == 2
    stepped, released = step_supernet(FedAvg(), weights, total, min_coverage=1, coverage_step_exponent=exponent)
    name = "stages.0.0.expand_weight"
    shared = total.counts[name] == 4  # both cohorts: 4 devices over 2 per subnet
    only_large = total.counts[name] == 2
    assert shared.any() and only_large.any()
    moved = stepped[name] - weights[name]
    np.testing.assert_allclose(moved[shared], 2.0**exponent, rtol=1e-6)
    np.testing.assert_allclose(moved[only_large], 1.0, rtol=1e-6)  # one cohort's worth: never below the mean
    # one cohort of the smallest subnet alone: what it does not hold keeps its value
    lone = cohorts(weights, [("a", small, 1.0), ("b", small, 1.0)])
    lone_step, lone_released = step_supernet(FedAvg(), weights, lone, min_coverage=1, coverage_step_exponent=exponent)
    for tensor, value in lone_step.items():
        np.testing.assert_array_equal(value[~lone_released[tensor]], weights[tensor][~lone_released[tensor]])
    # running statistics move by their plain mean, never scaled
    statistic = "stages.0.0.expand_norm.running_mean"
    np.testing.assert_allclose((stepped[statistic] - weights[statistic])[released[statistic]], 1.0, rtol=1e-6)


def test_the_coverage_scale_lies_between_one_and_the_subnet_count_to_the_exponent():
    counts = {"w": np.array([0, 1, 2, 3, 6])}
    released = {"w": counts["w"] >= 1}
    scale = coverage_step_scale(counts, released, devices_per_subnet=2.0, exponent=1.0)["w"]
    np.testing.assert_allclose(scale, [0.0, 1.0, 1.0, 1.5, 3.0])  # 3 subnets of 2 devices: at most 3


@pytest.mark.parametrize("exponent", [-0.1, 1.5, float("nan")])
def test_an_exponent_outside_zero_to_one_is_refused(exponent):
    with pytest.raises(InvalidInputError, match="exponent") as error:
        coverage_step_scale({"w": np.ones(2)}, {"w": np.ones(2, bool)}, 1.0, exponent)
    assert error.value.field == "zoo.coverage_step_exponent"


def test_a_cohorts_sum_counts_as_its_devices_added_one_by_one():
    """Under SecAgg+ the server sees each subnet cohort's sum only: mapping that sum onto the supernet (a linear map)
    and adding it with the cohort's weight and size gives the same sums, weights, counts and mean as its devices."""
    weights = random_weights(3)
    rng = np.random.default_rng(0)
    archs = {"large": SPACE.max_arch(), "small": SPACE.min_arch()}
    cohorts = {arch_name: [{name: rng.normal(size=value.shape).astype(np.float32) for name, value in
                            extract_weights(SPACE, arch, weights).items()} for _ in range(3)]
               for arch_name, arch in archs.items()}
    shapes = {name: value.shape for name, value in weights.items() if "kernel_transforms" not in name}
    one_by_one, summed = CoverageSum(shapes), CoverageSum(shapes)
    for arch_name, deltas in cohorts.items():
        for delta in deltas:
            one_by_one.add(map_back(SPACE, archs[arch_name], weights, delta), 1.0, arch_name)
        total = {name: sum(delta[name] for delta in deltas) for name in deltas[0]}
        summed.add_sum(map_back(SPACE, archs[arch_name], weights, total), 3.0, 3, arch_name)
    for name in shapes:
        np.testing.assert_allclose(summed.sums[name], one_by_one.sums[name], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(summed.weights[name], one_by_one.weights[name])
        np.testing.assert_array_equal(summed.counts[name], one_by_one.counts[name])
    assert summed.devices_per_subnet == one_by_one.devices_per_subnet == 3.0
    with pytest.raises(InvalidInputError):
        summed.add_sum(map_back(SPACE, archs["small"], weights, total), 0.0, 3, "small")
