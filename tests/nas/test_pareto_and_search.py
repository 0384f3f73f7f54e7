"""Pareto fronts, hypervolume, and the search strategies on a synthetic, deterministic objective."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.nas.evaluation import Candidate
from fedzoo.nas.pareto import crowding_distances, dominates, hypervolume, non_dominated_fronts, pareto_front
from fedzoo.nas.search import (
    Constraints,
    EvolutionarySearch,
    RandomSearch,
    SearchState,
    rank_candidates,
    run_search,
    select_zoo,
    select_zoo_for_budgets,
)
from fedzoo.nas.space import arch_key, tiny_space

points_strategy = st.lists(
    st.tuples(st.floats(0, 1, allow_nan=False), st.floats(0.01, 10, allow_nan=False)), min_size=1, max_size=30
)


def test_dominance_and_fronts_on_a_small_example():
    points = [(0.9, 1.0), (0.8, 0.5), (0.85, 2.0), (0.95, 3.0), (0.7, 0.6)]
    assert dominates((0.9, 1.0), (0.85, 2.0))
    assert not dominates((0.9, 1.0), (0.9, 1.0))
    fronts = non_dominated_fronts(points)
    assert sorted(fronts[0]) == [0, 1, 3]
    assert sorted(fronts[1]) == [2, 4]
    assert pareto_front(points) == [1, 0, 3]  # fastest first


def test_hypervolume_of_known_shapes():
    assert hypervolume([(0.5, 1.0)], reference=(0.0, 3.0)) == pytest.approx(0.5 * 2.0)
    # two steps: (0.5 acc at 1 ms) and (0.8 acc at 2 ms) under reference (0, 3)
    assert hypervolume([(0.5, 1.0), (0.8, 2.0)], reference=(0.0, 3.0)) == pytest.approx(0.5 * 2.0 + 0.3 * 1.0)
    assert hypervolume([(0.5, 4.0)], reference=(0.0, 3.0)) == 0.0


@settings(max_examples=60, deadline=None)
@given(points=points_strategy, extra=points_strategy)
def test_hypervolume_properties(points, extra):
    reference = (0.0, 11.0)
    front = [points[i] for i in pareto_front(points)]
    assert hypervolume(front, reference) == pytest.approx(hypervolume(points, reference))
    assert hypervolume(points + extra, reference) >= hypervolume(points, reference) - 1e-12
    for i in pareto_front(points):
        assert not any(dominates(other, points[i]) for other in points)


def test_crowding_marks_the_extremes_infinite():
    points = [(0.1, 1.0), (0.5, 2.0), (0.6, 2.5), (0.9, 4.0)]
    distances = crowding_distances(points, [0, 1, 2, 3])
    assert distances[0] == distances[3] == float("inf")
    assert distances[1] == pytest.approx((0.6 - 0.1) / 0.8 + (2.5 - 1.0) / 3.0)
    assert distances[2] == pytest.approx((0.9 - 0.5) / 0.8 + (4.0 - 2.0) / 3.0)


SPACE = tiny_space(8)


def synthetic_evaluate(archs):
    """Accuracy rises with expand ratio and kernel size with diminishing returns; latency with work done."""
    results = []
    for arch in archs:
        work = sum(k * k * e for stage in arch["stages"] for k, e in zip(stage["kernels"], stage["expand_ratios"]))
        depth = sum(len(stage["kernels"]) for stage in arch["stages"])
        accuracy = 1.0 - 0.5 * np.exp(-work / 150.0) - 0.02 * (depth % 2)
        results.append(Candidate(arch, float(accuracy), float(-np.log(accuracy)), 0.01 * work + 0.05 * depth, work, 100 * work))
    return results


@pytest.mark.parametrize("strategy", [EvolutionarySearch(population_size=6), RandomSearch()])
def test_search_spends_exactly_its_budget_on_distinct_admissible_archs(strategy):
    state = run_search(
        strategy, SPACE, synthetic_evaluate, evaluations=20, batch_size=6, constraints=Constraints(), seed=0,
        admissible=lambda arch: arch["stages"][0]["kernels"][0] == 3,
    )
    keys = [arch_key(candidate.arch) for candidate in state.evaluated]
    assert len(keys) == 20 and len(set(keys)) == 20
    assert all(candidate.arch["stages"][0]["kernels"][0] == 3 for candidate in state.evaluated)
    assert state.generation == 4  # 6 + 6 + 6 + 2


def test_search_resumed_from_a_generation_repeats_the_uninterrupted_run():
    full = run_search(EvolutionarySearch(population_size=5), SPACE, synthetic_evaluate, 20, 5, Constraints(), seed=3)
    stopped = []

    def stop_after_two(state):
        if state.generation == 2:
            stopped.append(SearchState.from_dict(state.to_dict()))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_search(EvolutionarySearch(population_size=5), SPACE, synthetic_evaluate, 20, 5, Constraints(), seed=3, on_generation=stop_after_two)
    resumed = run_search(EvolutionarySearch(population_size=5), SPACE, synthetic_evaluate, 20, 5, Constraints(), seed=3, state=stopped[0])
    assert [arch_key(c.arch) for c in resumed.evaluated] == [arch_key(c.arch) for c in full.evaluated]


def test_evolution_children_come_from_feasible_parents_only():
    budget = Constraints(latency_budget_ms=0.6)
    state = run_search(EvolutionarySearch(population_size=8), SPACE, synthetic_evaluate, 40, 8, budget, seed=1)
    first_generation, later = state.evaluated[:8], state.evaluated[8:]
    feasible_share_later = np.mean([budget.fits(c) for c in later])
    assert feasible_share_later >= np.mean([budget.fits(c) for c in first_generation])


def test_select_zoo_keeps_only_feasible_candidates_fastest_first():
    state = run_search(RandomSearch(), SPACE, synthetic_evaluate, 60, 20, Constraints(), seed=0)
    budget = Constraints(latency_budget_ms=2.5)
    zoo = select_zoo(state.evaluated, budget, min_size=8, max_size=10)
    assert 8 <= len(zoo) <= 10
    assert all(budget.fits(candidate) for candidate in zoo)
    latencies = [candidate.latency_ms for candidate in zoo]
    assert latencies == sorted(latencies)
    feasible = [c for c in state.evaluated if budget.fits(c)]
    front = [feasible[i] for i in pareto_front([c.point for c in feasible])]
    assert select_zoo(state.evaluated, budget, min_size=1, max_size=100) == sorted(front, key=lambda c: c.latency_ms)
    assert select_zoo(state.evaluated, Constraints(latency_budget_ms=1e-9)) == []


def test_rank_candidates_puts_the_front_first():
    candidates = synthetic_evaluate([SPACE.sample_arch(np.random.default_rng(i)) for i in range(12)])
    ranked = rank_candidates(candidates)
    front = {arch_key(candidates[i].arch) for i in pareto_front([c.point for c in candidates])}
    assert {arch_key(c.arch) for c in ranked[: len(front)]} == front


def test_run_search_rejects_a_non_positive_budget():
    with pytest.raises(InvalidInputError, match="evaluations"):
        run_search(RandomSearch(), SPACE, synthetic_evaluate, 0, 4, Constraints(), seed=0)


def test_evolution_starts_from_both_ends_of_the_tradeoff():
    state = run_search(EvolutionarySearch(population_size=4), SPACE, synthetic_evaluate, 4, 4, Constraints(), seed=0)
    keys = [arch_key(candidate.arch) for candidate in state.evaluated]
    assert keys[:2] == [arch_key(SPACE.min_arch()), arch_key(SPACE.max_arch())]


def test_zoo_front_is_drawn_on_validation_loss_not_on_tied_accuracy():
    arch = SPACE.min_arch()
    # two subnets tie on accuracy (the same count of validation images right); the slower one is more confident
    fast = Candidate(arch, accuracy=0.99, loss=0.05, latency_ms=1.0, macs=1, params=1)
    slow = Candidate(SPACE.max_arch(), accuracy=0.99, loss=0.03, latency_ms=2.0, macs=2, params=2)
    assert select_zoo([slow, fast], Constraints(), min_size=1) == [fast, slow]


def test_a_zoo_for_budgets_holds_the_best_candidate_within_each_budget_once_fastest_first():
    state = run_search(RandomSearch(), SPACE, synthetic_evaluate, 60, 20, Constraints(), seed=0)
    by_macs = sorted(state.evaluated, key=lambda candidate: candidate.macs)
    budgets = (by_macs[5].macs, by_macs[30].macs, by_macs[-1].macs)
    zoo = select_zoo_for_budgets(state.evaluated, Constraints(), budgets)
    for budget in budgets:
        fitting = [candidate for candidate in state.evaluated if candidate.macs <= budget]
        best = max(candidate.point[0] for candidate in fitting)
        assert any(candidate.macs <= budget and candidate.point[0] == best for candidate in zoo)
    assert len(zoo) <= len(budgets) and len({arch_key(candidate.arch) for candidate in zoo}) == len(zoo)
    assert [candidate.latency_ms for candidate in zoo] == sorted(candidate.latency_ms for candidate in zoo)
    with pytest.raises(InvalidInputError, match="no evaluated subnet within the budget of 0 MACs"):
        select_zoo_for_budgets(state.evaluated, Constraints(), (0,))
