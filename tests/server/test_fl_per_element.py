"""Per-element aggregation over a supernet: the mean over the devices covering each element, uncovered (and
under-covered) elements kept, strategies that need only the mean, and the coverage report."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.nas.space import tiny_space
from fedzoo.nas.subnet_mapping import MappedDelta, extract_weights, map_back
from fedzoo.server.fl.per_element import (
    MIN_RUNNING_VARIANCE, CoverageSum, apply_per_element, coverage_by_layer, coverage_report, layer_of, require_mean_only,
    step_supernet,
)
from fedzoo.server.fl.strategies import FedAdam, FedAvg, make_strategy

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
