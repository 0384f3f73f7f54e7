"""DP-FedAvg's server side: the noise has the scale the accountant assumes; clipping bounds and adapts."""

import math

import numpy as np
import pytest

from fedzoo.dp.accountant import PrivacyBudgetExhausted, PrivacyLedger
from fedzoo.dp.clipping import clip_delta, l2_norm
from fedzoo.dp.noise import (AdaptiveClipping, DpFedAvg, SeededNoise, adaptive_noise_split, noised_unclipped_fraction,
                             quantised_sensitivity)
from fedzoo.errors import InvalidInputError


def _ledger(z=1.2, max_epsilon=1000.0, sampling_probability=0.1):
    return PrivacyLedger(noise_multiplier=z, sampling_probability=sampling_probability, delta=1e-5,
                         max_epsilon=max_epsilon)


def test_noise_on_the_mean_has_standard_deviation_z_c_over_m():
    dp = DpFedAvg(_ledger(z=1.2), expected_clients=50, clip_norm=0.7, seed=0)
    draws = dp.noised_mean(np.zeros(200_000), grid_step=0.7 / 1000)
    expected = 1.2 * 0.7 / 50
    # the sample std of 2e5 normal draws is within 3 x std/sqrt(2n) of the true one
    assert abs(draws.std() - expected) < 3 * expected / math.sqrt(2 * 200_000)
    assert abs(draws.mean()) < 3 * expected / math.sqrt(200_000)
    assert dp.ledger.rounds_done == 1


def test_quantisation_widens_the_sensitivity_and_the_noise_with_it():
    dp = DpFedAvg(_ledger(z=1.0), expected_clients=10, clip_norm=1.0, seed=1)
    sensitivity = quantised_sensitivity(1.0, 1.0 / 127, 10_000)
    assert sensitivity == pytest.approx(1.0 + 100 / 127)
    assert dp.noise_stddev(sensitivity) == pytest.approx(sensitivity)
    with pytest.raises(InvalidInputError, match="below clip_norm"):
        dp.noised_mean(np.zeros(3), sensitivity=0.5)


def test_clipping_bounds_the_norm_and_reports_whether_it_was_needed():
    delta = {"a": np.full(4, 3.0, dtype=np.float32), "b": np.full(2, 4.0, dtype=np.float32)}
    clipped, within = clip_delta(delta, 2.0)
    assert l2_norm(clipped) == pytest.approx(2.0, rel=1e-6) and within is False
    assert np.allclose(clipped["a"] / clipped["b"][0], 0.75)  # direction kept
    same, within = clip_delta(delta, 100.0)
    assert within is True and all(np.array_equal(same[k], delta[k]) for k in delta)
    with pytest.raises(InvalidInputError, match="clip_norm"):
        clip_delta(delta, 0.0)


def test_clipping_bounds_every_norm_and_refuses_what_it_cannot_measure():
    """A device's delta of any norm leaves it within the bound, as float32 (what it uploads): below 1 too (a
    bound of 0.1 on a delta of norm 0.5), at 0 (no division by it), and past float32's range (1e20 squared
    overflows float32, not the float64 the norm is taken in): such a delta is clipped, not refused."""
    small, within = clip_delta({"w": np.array([0.3, 0.4])}, 0.1)
    assert l2_norm(small) == pytest.approx(0.1, rel=1e-6) and within is False and small["w"].dtype == np.float32
    zero, within = clip_delta({"w": np.zeros(3, dtype=np.float32)}, 1.0)
    assert within is True and np.array_equal(zero["w"], np.zeros(3))
    huge, within = clip_delta({"w": np.array([1e20, 1e20], dtype=np.float32)}, 1.0)
    assert l2_norm(huge) == pytest.approx(1.0, rel=1e-6) and within is False and huge["w"].dtype == np.float32
    at_the_bound = clip_delta({"w": np.array([3.0, 4.0])}, 5.0)
    assert at_the_bound[1] is True and at_the_bound[0]["w"].dtype == np.float32  # within means norm <= bound
    for bad_norm in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InvalidInputError, match="^clip_norm must be a positive number") as refused:
            clip_delta({"w": np.ones(2)}, bad_norm)
        assert refused.value.field == "clip_norm"
    for bad_value in (math.nan, math.inf):
        with pytest.raises(InvalidInputError, match="^the delta holds NaN or infinite values$") as refused:
            clip_delta({"w": np.array([1.0, bad_value])}, 1.0)
        assert refused.value.field == "delta"


def test_adaptive_clipping_moves_the_bound_to_the_target_quantile_of_the_norms():
    rng = np.random.default_rng(2)
    dp = DpFedAvg(_ledger(z=1.0, sampling_probability=1.0), expected_clients=1000, clip_norm=0.05,
                  adaptive=AdaptiveClipping(target_unclipped_quantile=0.5, clip_learning_rate=0.3), seed=3)
    for _ in range(80):
        norms = rng.lognormal(mean=0.0, sigma=0.3, size=1000)  # median 1.0
        dp.noised_mean(np.zeros(2), unclipped_count=int(np.sum(norms <= dp.clip_norm)), contributors=1000)
    assert dp.clip_norm == pytest.approx(1.0, rel=0.1)
    # the deltas get a little more noise so that, with the count's noise, the round still costs z
    assert dp.delta_noise_multiplier == pytest.approx((1.0 - (2 * 50) ** -2) ** -0.5)


def test_adaptive_clipping_needs_the_count_and_enough_count_noise():
    large_noise = DpFedAvg(_ledger(z=11.0), expected_clients=50, clip_norm=1.0, adaptive=AdaptiveClipping())
    assert large_noise.clipped_count_stddev == 11.0  # m / 20 = 2.5 could not carry z = 11
    assert large_noise.delta_noise_multiplier == pytest.approx(11.0 / math.sqrt(0.75))
    with pytest.raises(InvalidInputError, match="clipped_count_stddev"):
        DpFedAvg(_ledger(z=4.0), expected_clients=10, clip_norm=1.0, adaptive=AdaptiveClipping(clipped_count_stddev=1.0))
    dp = DpFedAvg(_ledger(), expected_clients=100, clip_norm=1.0, adaptive=AdaptiveClipping())
    with pytest.raises(InvalidInputError, match="unclipped"):
        dp.noised_mean(np.zeros(3))


@pytest.mark.parametrize("settings, field", [
    ({"target_unclipped_quantile": 0.0}, "target_unclipped_quantile"),
    ({"target_unclipped_quantile": 1.0}, "target_unclipped_quantile"),
    ({"target_unclipped_quantile": 1.5}, "target_unclipped_quantile"),
    ({"clip_learning_rate": 0.0}, "clip_learning_rate"),
    ({"clip_learning_rate": math.nan}, "clip_learning_rate"),
    ({"clip_learning_rate": math.inf}, "clip_learning_rate"),
    ({"clipped_count_stddev": 0.0}, "clipped_count_stddev")])
def test_adaptive_clipping_refuses_settings_that_would_not_bound_or_not_move_the_norm(settings, field):
    with pytest.raises(InvalidInputError, match=f"^{field} must") as refused:
        AdaptiveClipping(**settings)
    assert refused.value.field == field


@pytest.mark.parametrize("expected_clients, clip_norm, field", [
    (0, 1.0, "expected_clients"), (-5, 1.0, "expected_clients"),
    (10, 0.0, "clip_norm"), (10, math.nan, "clip_norm"), (10, math.inf, "clip_norm")])
def test_the_server_mechanism_refuses_a_plan_that_would_divide_by_zero_or_clip_nothing(expected_clients, clip_norm,
                                                                                       field):
    with pytest.raises(InvalidInputError, match=f"^{field} must be (a )?positive") as refused:
        DpFedAvg(_ledger(), expected_clients=expected_clients, clip_norm=clip_norm)
    assert refused.value.field == field


def test_the_noised_mean_keeps_the_sum_and_noises_it_at_the_sensitivity_it_is_told():
    """Attacks on the release itself: a mean that lost the sum (the grid's division), noise scaled by clip_norm
    where the caller said the sensitivity is larger (rounding under SecAgg+), a one-coordinate sum's own rounding
    left out of the sensitivity, a seed that does not reproduce, a count refused or accepted at its edges."""
    dp = DpFedAvg(_ledger(z=1e-3, max_epsilon=1e12), expected_clients=4, clip_norm=1.0, seed=0)
    assert (dp.released_sensitivity, dp.released_unclipped_fraction, dp.clipped_count_stddev) == (None, None, None)
    assert dp.noise_stddev() == pytest.approx(1e-3)
    total = np.array([[2.0, -1.2], [0.4, 0.0]])
    np.testing.assert_allclose(dp.noised_mean(total), total / 4, atol=0.01)  # noise 1e-3: the mean is the sum's
    dp.noised_mean(np.array([0.5]))
    assert dp.released_sensitivity == pytest.approx(1.0 * (1 + 1 / 1000))  # one coordinate: step x sqrt(1)
    wide = DpFedAvg(_ledger(z=1.0), expected_clients=1, clip_norm=0.1, seed=1)
    draws = wide.noised_mean(np.zeros(20_000), sensitivity=0.4, grid_step=0.001)
    assert abs(draws.std() - 0.4) < 5 * 0.4 / math.sqrt(2 * 20_000)  # z x 0.4, not z x clip_norm 0.1
    replay = [DpFedAvg(_ledger(), expected_clients=4, clip_norm=1.0, seed=7).noised_mean(np.zeros(50)) for _ in "ab"]
    np.testing.assert_array_equal(*replay)
    with pytest.raises(InvalidInputError, match="^sensitivity 0.5 is below clip_norm") as refused:
        dp.noised_mean(np.zeros(3), sensitivity=0.5)
    assert refused.value.field == "sensitivity"
    adaptive = DpFedAvg(_ledger(), expected_clients=4, clip_norm=1.0, adaptive=AdaptiveClipping(), seed=0)
    for counts in ({"unclipped_count": 2}, {"contributors": 4}):
        with pytest.raises(InvalidInputError, match="^adaptive clipping needs the count") as refused:
            adaptive.noised_mean(np.zeros(3), **counts)
        assert refused.value.field == "unclipped_count"
    adaptive.noised_mean(np.zeros(3), unclipped_count=4, contributors=4)  # all within the bound is a count too


def test_the_noised_unclipped_fraction_has_the_count_noise_it_is_told_and_refuses_impossible_counts():
    """The count's noise is what `adaptive_noise_split` charged: stddev 2 x count_stddev on the doubled sum, so
    count_stddev on the count; a count below 0 or above the contributors is refused, naming it."""
    noise = SeededNoise(3)
    draws = np.array([noised_unclipped_fraction(5, 10, 10, 4.0, noise) for _ in range(20_000)])
    # (doubled sum + noise) / (2 x 10) + 0.5: the noise on the fraction has stddev 2 x 4 / 20
    assert abs(draws.std() - 0.4) < 5 * 0.4 / math.sqrt(2 * 20_000)
    assert abs(draws.mean() - 0.5) < 5 * 0.4 / math.sqrt(20_000)
    assert noised_unclipped_fraction(10, 10, 10, 1e-9, noise) == pytest.approx(1.0)  # all within: allowed
    for count in (-1, 11):
        with pytest.raises(InvalidInputError, match="^unclipped_count must lie in \\[0, 10\\]") as refused:
            noised_unclipped_fraction(count, 10, 10, 4.0, noise)
        assert refused.value.field == "unclipped_count"


def test_a_count_noise_of_exactly_half_the_multiplier_leaves_no_noise_for_the_deltas_and_is_refused():
    with pytest.raises(InvalidInputError, match="needs more than z / 2") as refused:
        adaptive_noise_split(1.0, 10, 0.5)  # 1 - (2 x 0.5)^-2 = 0 exactly
    assert refused.value.field == "clipped_count_stddev"


def test_no_noised_mean_past_the_budget():
    dp = DpFedAvg(_ledger(z=1.0, max_epsilon=2.0), expected_clients=10, clip_norm=1.0, seed=0)
    with pytest.raises(PrivacyBudgetExhausted):
        for _ in range(1000):
            dp.noised_mean(np.zeros(3))
    assert dp.ledger.epsilon_spent <= 2.0


@pytest.mark.parametrize("target_within_bound", [True, False])
def test_one_device_moves_the_noised_unclipped_fraction_by_half_a_count(target_within_bound):
    """The noise split gives the count sensitivity 1/2 (centred bits, b - 1/2): adding or removing one device, on
    the same noise draw, must move the released fraction by exactly 1 / (2 m), whatever its bit. A raw 0/1 count
    moves by 1 / m when the device was not clipped, spending up to twice the privacy the card states."""
    others_within, others = 7, 14
    without = noised_unclipped_fraction(others_within, others, 50, 3.0, SeededNoise(5))
    with_target = noised_unclipped_fraction(others_within + target_within_bound, others + 1, 50, 3.0, SeededNoise(5))
    assert abs(with_target - without) == pytest.approx(1 / (2 * 50))
    with pytest.raises(InvalidInputError, match="unclipped_count"):
        noised_unclipped_fraction(16, 15, 50, 3.0, SeededNoise(5))


def test_the_server_noise_is_secure_and_integer_on_the_grid_and_the_simulators_says_it_is_seeded():
    secure = DpFedAvg(_ledger(z=1.0), expected_clients=10, clip_norm=1.0)
    seeded = DpFedAvg(_ledger(z=1.0), expected_clients=10, clip_norm=1.0, seed=4)
    assert secure.noise.reproducible is False and seeded.noise.reproducible is True
    step = 1.0 / 127
    mean = secure.noised_mean(np.full(50, 3 * step), grid_step=step)
    steps = mean * 10 / step
    assert np.allclose(steps, np.rint(steps), atol=1e-6)  # the released sum lies on the grid: integer noise
    again = DpFedAvg(_ledger(z=1.0), expected_clients=10, clip_norm=1.0)
    assert not np.array_equal(again.noised_mean(np.full(50, 3 * step), grid_step=step), mean)


def test_the_secure_noise_has_standard_deviation_z_s_in_model_units():
    """The discrete noise is drawn in grid steps, sigma = z S / step, so on the model's scale it is z S, whatever the
    grid: here a clear sum on the default grid (S = C + step sqrt(d)), 20,000 draws."""
    dp = DpFedAvg(_ledger(z=1.3), expected_clients=1, clip_norm=0.4)
    draws = dp.noised_mean(np.zeros(20_000))
    expected = 1.3 * dp.released_sensitivity
    assert dp.released_sensitivity == pytest.approx(0.4 * 1.001)
    assert abs(draws.std() - expected) < 5 * expected / math.sqrt(2 * 20_000)
    assert abs(draws.mean()) < 5 * expected / math.sqrt(20_000)


def test_the_unclipped_count_under_secagg_must_be_a_whole_number_of_bits_in_zero_to_survivors():
    from fedzoo.aggregation.private import check_secure_sum, split_unclipped_count, with_unclipped_bit

    clip_range, survivors = 0.1, 3
    vectors = [with_unclipped_bit(np.array([0.05, -0.1]), within, clip_range) for within in (True, False, True)]
    total = np.sum(vectors, axis=0)
    check_secure_sum(total, 3.0, survivors, clip_range, equal=True, unclipped_bit=True)
    assert split_unclipped_count(total, clip_range)[1] == 2
    np.testing.assert_allclose(split_unclipped_count(total, clip_range)[0], [0.15, -0.3])
    # the third device sending a bit of 3, of -2 or of one half: the count leaves [0, 3] or is not whole
    for lie in (3.0, -2.0, 0.5):
        lying = total + np.array([0.0, 0.0, (lie - 1) * clip_range])
        with pytest.raises(InvalidInputError, match="bit other than 0 or 1") as error:
            check_secure_sum(lying, 3.0, survivors, clip_range, equal=True, unclipped_bit=True)
        assert error.value.field == "unclipped_bit"
    # the bit's coordinate is the count, not a clipped coordinate: 3 devices within give 3 x clip_range there
    check_secure_sum(total + np.array([0.0, 0.0, clip_range]), 3.0, survivors, clip_range, equal=True,
                     unclipped_bit=True)


def test_the_secure_sum_check_refuses_every_coordinate_and_weight_a_liar_can_move():
    """A device that lies about its weight or one coordinate (the last delta coordinate too, beside the bit) is
    caught from the sum alone, with the field to blame; an honest round where no device was within the bound
    (count 0), one survivor, or fractional example weights passes."""
    from fedzoo.aggregation.private import check_secure_sum, with_unclipped_bit

    clip_range = 0.1
    honest = np.sum([with_unclipped_bit(np.array([0.1, -0.1, 0.1]), False, clip_range) for _ in range(3)], axis=0)
    check_secure_sum(honest, 3.0, 3, clip_range, equal=True, unclipped_bit=True)  # count 0: nobody within
    check_secure_sum(np.array([0.1, 0.0]), 1.0, 1, clip_range, equal=True)  # one survivor; no bit by default
    check_secure_sum(np.array([0.04]), 0.5, 2, clip_range, equal=False)  # two example weights of 1/4
    check_secure_sum(np.array([clip_range]), 1.0, 1, clip_range, equal=True, unclipped_bit=True)  # a bit alone
    # devices that noised their inputs: the envelope widens by the noise's slack, and by no more
    check_secure_sum(np.array([0.35]), 3.0, 3, clip_range, equal=True, noise_slack=0.1)
    with pytest.raises(InvalidInputError, match="outside the clipping range"):
        check_secure_sum(np.array([0.41]), 3.0, 3, clip_range, equal=True, noise_slack=0.1)
    for coordinate in range(3):  # each delta coordinate, up to the one just before the bit
        lying = honest.copy()
        lying[coordinate] += 0.01 * np.sign(lying[coordinate])  # 0.31 or -0.31: past 3 x 0.1
        with pytest.raises(InvalidInputError, match="outside the clipping range") as refused:
            check_secure_sum(lying, 3.0, 3, clip_range, equal=True, unclipped_bit=True)
        assert refused.value.field == "clip_range"
    for total_weight, survivors, equal, message in ((4.0, 3, True, "must weigh the same"),
                                                    (3.5, 3, False, "some device sent a weight above 1"),
                                                    (0.0, 2, False, "outside \\(0, 2\\]")):
        with pytest.raises(InvalidInputError, match=message) as refused:
            check_secure_sum(np.zeros(2), total_weight, survivors, clip_range, equal=equal)
        assert refused.value.field == "weight"


def test_the_server_sums_every_delta_it_clips():
    from fedzoo.aggregation.private import clipped_sum

    deltas = [{"w": np.array([3.0, 4.0])}, {"w": np.array([0.1, 0.0])}, {"w": np.array([0.0, -0.2])}]
    total, unclipped, count = clipped_sum(deltas, 1.0, 2)
    np.testing.assert_allclose(total, [0.6 + 0.1, 0.8 - 0.2], rtol=1e-6)  # the first clipped to norm 1
    assert (unclipped, count) == (2, 3)


def test_a_delta_its_device_clipped_arrives_at_the_bound_and_counts_as_clipped():
    from fedzoo.aggregation.private import clipped_sum

    rng = np.random.default_rng(0)
    deltas = [{"w": rng.normal(size=500).astype(np.float32)} for _ in range(40)]
    device_clipped = [clip_delta(delta, 1.0)[0] for delta in deltas]  # every one longer than 1: clipped
    assert sum(l2_norm(delta) <= 1.0 for delta in device_clipped) > 0  # float32 rounding lands some at or below
    assert clipped_sum(device_clipped, 1.0, 500)[1:] == (0, 40)
    within = [{"w": delta["w"] * np.float32(0.9)} for delta in device_clipped]
    assert clipped_sum(within, 1.0, 500)[1:] == (40, 40)


def test_the_secure_sum_under_adaptive_clipping_moves_the_bound_from_its_last_coordinate():
    from fedzoo.aggregation.private import DifferentialPrivacy, with_unclipped_bit
    from fedzoo.aggregation.strategies import make_strategy

    # count noise sigma 0.06 (z = 0.1 allows it): a whole number never moves, so the noised fraction is exact
    adaptive = AdaptiveClipping(0.5, 0.5, 0.06)
    private = DifferentialPrivacy(make_strategy({"name": "fedavg"}),
                                  DpFedAvg(_ledger(z=0.1), expected_clients=4, clip_norm=0.2, adaptive=adaptive, seed=0))
    vectors = [with_unclipped_bit(np.full(3, 0.01), within, 0.2) for within in (True, False, False, False)]
    parameters = private.apply_noised_secure_sum({"w": np.zeros(3)}, np.sum(vectors, axis=0), 4, 0.2, 127)
    assert parameters["w"].shape == (3,)  # the count's coordinate is not a parameter
    # one of four unclipped: centred doubled sum 2 - 4 = -2 over 2 x 4, plus 0.5
    assert private.mechanism.released_unclipped_fraction == pytest.approx(0.25, abs=1e-12)
    assert private.clip_norm == pytest.approx(0.2 * math.exp(-0.5 * (0.25 - 0.5)))
    assert private.mechanism.released_sensitivity == pytest.approx(quantised_sensitivity(0.2, 0.2 / 127, 3))



def test_the_plain_engines_dp_step_clips_each_delta_to_the_bound_before_noising():
    """`DifferentialPrivacy.aggregate_fit` on deltas of norm 10 with a bound of 0.2 takes the step a twin (same seed,
    so the same noise) takes from the sum of those deltas clipped to 0.2, and not the one from the unclipped sum."""
    from fedzoo.aggregation.private import DifferentialPrivacy
    from fedzoo.aggregation.strategies import ClientUpdate, make_strategy

    def twin():
        return DifferentialPrivacy(make_strategy({"name": "fedavg"}),
                                   DpFedAvg(_ledger(), expected_clients=3, clip_norm=0.2, seed=7))

    start = {"w": np.zeros(4)}
    deltas = [{"w": np.array([6.0, -8.0, 0.0, 0.0]) * sign} for sign in (1.0, 1.0, -0.5)]
    updates = [ClientUpdate(f"device-{i}", 1.0, lambda delta=delta: delta, l2_norm(delta)) for i, delta in enumerate(deltas)]
    stepped = twin().aggregate_fit(start, updates)
    clipped_total = sum(clip_delta(delta, 0.2)[0]["w"] for delta in deltas)
    expected = twin().apply_noised_sum(start, clipped_total, 0, 3)
    np.testing.assert_allclose(stepped["w"], expected["w"], rtol=0, atol=1e-12)
    unclipped = twin().apply_noised_sum(start, sum(delta["w"] for delta in deltas), 0, 3)
    assert np.abs(unclipped["w"] - stepped["w"]).max() > 1.0
