"""The ledger's epsilon against dp-accounting and the Gaussian mechanism's closed form; budgets stop plans."""

import math

import dp_accounting
import pytest
from scipy.stats import norm

from fedzoo.dp.accountant import (
    MIN_NOISE_MULTIPLIER,
    PrivacyBudgetExhausted,
    PrivacyLedger,
    epsilon_after,
    epsilon_of_events,
    noise_multiplier_for,
    round_event,
)
from fedzoo.dp.noise import adaptive_noise_split
from fedzoo.errors import InvalidInputError


def _gaussian_epsilon(noise_multiplier, rounds, delta):
    """Balle & Wang 2018: T Gaussian rounds of multiplier z are one of multiplier z / sqrt(T); solve delta(eps)."""
    mu = math.sqrt(rounds) / noise_multiplier

    def delta_of(epsilon):
        return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)

    low, high = 0.0, 100.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


@pytest.mark.parametrize("noise_multiplier, rounds", [(1.0, 10), (2.0, 30), (4.0, 100)])
def test_without_sampling_pld_matches_the_gaussian_closed_form(noise_multiplier, rounds):
    exact = _gaussian_epsilon(noise_multiplier, rounds, 1e-5)
    assert epsilon_after(rounds, noise_multiplier, 1.0, 1e-5, "pld") == pytest.approx(exact, rel=2e-3)
    assert exact <= epsilon_after(rounds, noise_multiplier, 1.0, 1e-5, "rdp") <= 1.3 * exact  # RDP is an upper bound


def test_sampled_rounds_match_dp_accounting_composed_round_by_round():
    ledger = PrivacyLedger(noise_multiplier=1.1, sampling_probability=0.05, delta=1e-5, max_epsilon=100, mechanism="pld")
    accountant = dp_accounting.pld.PLDAccountant()
    for _ in range(5):
        ledger.record_round()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1)))
    assert ledger.epsilon_spent == pytest.approx(accountant.get_epsilon(1e-5), abs=1e-6)


def test_research_figures_for_sampled_rounds():
    # security.md section 2.2, measured with dp-accounting 0.6.0: z = 1, N = 100, m = 20, T = 50 -> 11.3 / 10.1
    assert epsilon_after(50, 1.0, 0.2, 1e-5, "rdp") == pytest.approx(11.3, abs=0.1)
    assert epsilon_after(50, 1.0, 0.2, 1e-5, "pld") == pytest.approx(10.1, abs=0.1)


def test_calibrated_noise_spends_the_budget_and_no_less_noise_would_do():
    z = noise_multiplier_for(8.0, 1e-5, 30, 0.1)
    assert epsilon_after(30, z, 0.1, 1e-5) <= 8.0
    assert epsilon_after(30, z * 0.99, 0.1, 1e-5) > 8.0


def test_calibration_refuses_an_epsilon_that_is_not_a_positive_number_and_takes_one_below_1():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidInputError, match=f"^epsilon must be a positive number, got {bad}$") as refused:
            noise_multiplier_for(bad, 1e-5, 10, 1.0)
        assert refused.value.field == "epsilon"
    z = noise_multiplier_for(0.5, 1e-5, 10, 1.0)  # a strict budget: much noise, and still within it
    assert epsilon_after(10, z, 1.0, 1e-5) <= 0.5 < epsilon_after(10, z * 0.99, 1.0, 1e-5)


def test_calibration_refuses_an_epsilon_so_large_that_no_meaningful_noise_spends_it():
    """dp_accounting finds no bracket below z = 0.05 and raised its own error (a 500 behind a plan's max_epsilon)."""
    assert epsilon_after(1, MIN_NOISE_MULTIPLIER, 1.0, 1e-5) < 1e6
    with pytest.raises(InvalidInputError, match="^epsilon 1e[+]06 over 1 round[(]s[)] at delta 1e-05 needs a noise "
                                                "multiplier below 0.05") as refused:
        noise_multiplier_for(1e6, 1e-5, 1, 1.0)
    assert refused.value.field == "epsilon"


def test_a_plan_stops_before_its_budget_is_exceeded():
    ledger = PrivacyLedger(noise_multiplier=1.0, sampling_probability=0.1, delta=1e-5, max_epsilon=3.0)
    with pytest.raises(PrivacyBudgetExhausted, match="over the plan's max_epsilon=3.0"):
        for _ in range(1000):
            ledger.require_budget_for_next_round()
            ledger.record_round()
    assert ledger.epsilon_spent <= 3.0
    assert epsilon_after(ledger.rounds_done + 1, 1.0, 0.1, 1e-5) > 3.0
    restored = PrivacyLedger.from_dict(ledger.to_dict())
    assert restored.epsilon_spent == ledger.epsilon_spent
    with pytest.raises(PrivacyBudgetExhausted):
        restored.require_budget_for_next_round()


@pytest.mark.parametrize("changes, field", [
    ({"noise_multiplier": 0.0}, "noise_multiplier"),
    ({"sampling_probability": 1.5}, "sampling_probability"),
    ({"delta": 0.0}, "delta"),
    ({"max_epsilon": -1.0}, "max_epsilon"),
    ({"mechanism": "moments"}, "mechanism"),
])
def test_bad_parameters_name_themselves(changes, field):
    with pytest.raises(InvalidInputError) as error:
        PrivacyLedger(**{"noise_multiplier": 1.0, "sampling_probability": 0.1, "delta": 1e-5, "max_epsilon": 8.0,
                         **changes})
    assert error.value.field == field


def test_a_plan_on_a_line_composes_after_the_lines_earlier_rounds():
    """Two plans' rounds compose in dp-accounting as one sequence: the line's epsilon, not the plan's."""
    ledger = PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=8.0, line="digits-v1", line_events=[[1.5, 1.0, 2]],
                           line_max_epsilon=20.0)
    ledger.record_round()
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(1.5), 2)
    accountant.compose(dp_accounting.GaussianDpEvent(1.0), 1)
    assert ledger.epsilon_spent == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert ledger.plan_epsilon_spent == pytest.approx(epsilon_after(1, 1.0, 1.0, 1e-5))
    assert ledger.events() == [[1.5, 1.0, 2], [1.0, 1.0, 1]]
    assert epsilon_of_events(ledger.events(), 1e-5) == ledger.epsilon_spent
    assert PrivacyLedger.from_dict(ledger.to_dict()) == ledger


def test_the_line_budget_stops_a_plan_its_own_budget_would_let_run():
    ledger = PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=50.0, line="digits-v1", line_events=[[1.0, 1.0, 3]],
                           line_max_epsilon=epsilon_after(4, 1.0, 1.0, 1e-5) + 1e-6)
    ledger.require_budget_for_next_round()  # the fourth round of the line fits
    ledger.record_round()
    with pytest.raises(PrivacyBudgetExhausted, match="lifetime budget"):
        ledger.require_budget_for_next_round()


def test_the_rounds_a_plans_budget_allows_are_the_most_whose_epsilon_fits():
    ledger = PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=(epsilon_after(2, 1.0, 1.0, 1e-5)
                                                         + epsilon_after(3, 1.0, 1.0, 1e-5)) / 2)
    assert ledger.rounds_within_plan_budget(10) == 2
    assert ledger.rounds_within_plan_budget(1) == 1
    assert ledger.rounds_within_plan_budget(0) == 0


@pytest.mark.parametrize("noise_multiplier,rounds,sampling_probability", [
    (0.8, 5, 1.0), (1.5, 40, 1.0), (3.0, 200, 1.0), (1.0, 100, 0.1), (2.0, 500, 0.01)])
def test_an_adaptive_round_spends_what_its_ledger_says(noise_multiplier, rounds, sampling_probability):
    """The released pair (noised sum of deltas, noised centred count) of one round is one Gaussian mechanism: the
    deltas' sensitivity over their noise and the count's (1/2) over its noise add in quadrature. dp-accounting,
    fed those two noises directly, must find the epsilon the ledger (at the plan's z) states."""
    clip_norm, expected_clients = 0.3, 100
    count_stddev, delta_multiplier = adaptive_noise_split(noise_multiplier, expected_clients, None)
    delta_stddev = delta_multiplier * clip_norm
    effective = ((clip_norm / delta_stddev) ** 2 + (0.5 / count_stddev) ** 2) ** -0.5
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(round_event(effective, sampling_probability), rounds)
    direct = accountant.get_epsilon(1e-5)
    if sampling_probability == 1.0:  # unsampled, the two releases compose as two separate Gaussians
        separate = dp_accounting.rdp.RdpAccountant()
        separate.compose(dp_accounting.GaussianDpEvent(delta_multiplier), rounds)
        separate.compose(dp_accounting.GaussianDpEvent(2 * count_stddev), rounds)
        assert separate.get_epsilon(1e-5) == pytest.approx(direct, rel=1e-6)
    assert epsilon_after(rounds, noise_multiplier, sampling_probability, 1e-5) == pytest.approx(direct, rel=1e-6)


@pytest.mark.parametrize("changes, field", [
    ({"noise_multiplier": math.nan}, "noise_multiplier"), ({"noise_multiplier": math.inf}, "noise_multiplier"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"), ({"sampling_probability": 0.0}, "sampling_probability"),
    ({"delta": 1.0}, "delta"), ({"max_epsilon": 0.0}, "max_epsilon"), ({"max_epsilon": math.nan}, "max_epsilon"),
    ({"max_epsilon": math.inf}, "max_epsilon"), ({"line_max_epsilon": 0.0}, "line_max_epsilon"),
    ({"line_max_epsilon": math.inf}, "line_max_epsilon")])
def test_a_ledger_that_would_not_bound_epsilon_is_refused_naming_the_field(changes, field):
    """Each refusal an operator's plan (or a ledger read back) can reach, at its edge: no noise, no sampling, a
    certain failure (delta 1), a budget of 0 or without bound."""
    with pytest.raises(InvalidInputError, match=f"^{field} must") as error:
        PrivacyLedger(**{"noise_multiplier": 1.0, "sampling_probability": 0.1, "delta": 1e-5, "max_epsilon": 8.0,
                         **changes})
    assert error.value.field == field
    PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=0.5, line_max_epsilon=0.5)  # all sampled, budgets below 1: allowed


def test_round_counts_that_are_not_whole_and_non_negative_are_refused():
    with pytest.raises(InvalidInputError, match="^rounds must be non-negative") as error:
        epsilon_after(-1, 1.0, 1.0, 1e-5)
    assert error.value.field == "rounds"
    assert epsilon_after(0, 1.0, 1.0, 1e-5) == 0.0
    for rounds in (-1, 1.5):
        with pytest.raises(InvalidInputError, match="^a ledger's round count must be a whole number") as error:
            epsilon_of_events([[1.0, 1.0, 2], [1.0, 1.0, rounds]], 1e-5)
        assert error.value.field == "rounds"
    assert epsilon_of_events([[1.0, 1.0, 0]], 1e-5) == 0.0
    assert epsilon_of_events([[1.0, 1.0, 0], [1.0, 1.0, 2]], 1e-5) == pytest.approx(epsilon_after(2, 1.0, 1.0, 1e-5))


def test_a_budget_is_spent_up_to_and_including_its_last_round():
    """A round that lands exactly on the plan's or the line's budget runs; the next one is refused."""
    exactly_two = epsilon_after(2, 1.0, 1.0, 1e-5)
    ledger = PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=exactly_two)
    assert ledger.rounds_within_plan_budget(5) == 2
    for _ in range(2):
        assert ledger.require_budget_for_next_round() == pytest.approx(
            epsilon_after(ledger.rounds_done + 1, 1.0, 1.0, 1e-5))
        ledger.record_round()
    with pytest.raises(PrivacyBudgetExhausted, match="^round 3 would bring epsilon"):
        ledger.require_budget_for_next_round()
    line = PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=50.0, line="digits-v1", line_events=[[1.0, 1.0, 1]],
                         line_max_epsilon=exactly_two)
    assert line.require_budget_for_next_round() == pytest.approx(exactly_two)
    line.record_round()
    with pytest.raises(PrivacyBudgetExhausted, match="^1 more round\\(s\\) would bring model line 'digits-v1'"):
        line.require_budget_for_next_round()
    assert line.events() == [[1.0, 1.0, 1], [1.0, 1.0, 1]] and line.events(2) == [[1.0, 1.0, 1], [1.0, 1.0, 3]]
    assert PrivacyLedger(1.0, 1.0, 1e-5, 8.0, line_events=[[2.0, 1.0, 4]]).events() == [[2.0, 1.0, 4]]


def test_a_pld_ledger_checks_its_budgets_with_its_own_accountant():
    """The plan's accountant, not the default one, decides every budget check (RDP's epsilon is larger here)."""
    exactly_two = epsilon_after(2, 1.0, 1.0, 1e-5, "pld")
    assert exactly_two < epsilon_after(2, 1.0, 1.0, 1e-5, "rdp")
    ledger = PrivacyLedger(1.0, 1.0, 1e-5, max_epsilon=exactly_two, mechanism="pld", line="digits-v1",
                           line_max_epsilon=exactly_two)
    assert ledger.rounds_within_plan_budget(5) == 2
    assert ledger.require_budget_for_next_round() == pytest.approx(epsilon_after(1, 1.0, 1.0, 1e-5, "pld"))
    assert ledger.require_line_budget(2) == pytest.approx(exactly_two)
