"""Architecture search under constraints: an evolutionary search (NSGA-II selection over validation
loss and latency, `Candidate.point`) and random search, its baseline, behind one small interface. Both spend the same
evaluation budget through `run_search`, which checkpoints after every generation."""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedzoo.errors import InvalidInputError
from fedzoo.nas.evaluation import Candidate
from fedzoo.nas.pareto import crowding_distances, non_dominated_fronts
from fedzoo.nas.space import Arch, SearchSpace, arch_key

_MAX_SAMPLING_TRIES = 2000


@dataclass(frozen=True)
class Constraints:
    """Limits every zoo model must meet; `None` means no limit."""

    latency_budget_ms: float | None = None
    max_params: int | None = None

    def fits(self, candidate: Candidate) -> bool:
        """True when the evaluated candidate meets every limit."""
        latency_ok = self.latency_budget_ms is None or candidate.latency_ms <= self.latency_budget_ms
        return latency_ok and (self.max_params is None or candidate.params <= self.max_params)


class SearchStrategy(ABC):
    """Chooses which architectures to evaluate next, given everything evaluated so far."""

    name: str

    @abstractmethod
    def propose(
        self,
        space: SearchSpace,
        evaluated: list[Candidate],
        count: int,
        rng: np.random.Generator,
        admissible: Callable[[Arch], bool],
        constraints: Constraints,
    ) -> list[Arch]:
        """Up to `count` distinct admissible archs, none of them already in `evaluated`."""


def _distinct_samples(
    make: Callable[[], Arch], count: int, seen: set[str], admissible: Callable[[Arch], bool]
) -> list[Arch]:
    """Call `make` until `count` new admissible archs are found (or the tries run out)."""
    chosen: list[Arch] = []
    for _ in range(_MAX_SAMPLING_TRIES):
        if len(chosen) == count:
            break
        arch = make()
        key = arch_key(arch)
        if key not in seen and admissible(arch):
            seen.add(key)
            chosen.append(arch)
    return chosen


class RandomSearch(SearchStrategy):
    """Uniform samples from the space: the baseline every search should beat at equal budget."""

    name = "random"

    def propose(self, space, evaluated, count, rng, admissible, constraints):
        seen = {arch_key(candidate.arch) for candidate in evaluated}
        return _distinct_samples(lambda: space.sample_arch(rng), count, seen, admissible)


def rank_candidates(candidates: list[Candidate]) -> list[Candidate]:
    """Candidates best first by NSGA-II order: Pareto rank, then crowding distance (most isolated first)."""
    points = [candidate.point for candidate in candidates]
    ordered: list[Candidate] = []
    for front in non_dominated_fronts(points):
        distances = crowding_distances(points, front)
        ordered += [candidates[i] for i in sorted(front, key=lambda i: -distances[i])]
    return ordered


@dataclass
class EvolutionarySearch(SearchStrategy):
    """NSGA-II-style evolution: parents are the best feasible candidates by Pareto rank and crowding;
    children come from crossover and mutation. The first generation is the smallest and the largest
    subnet plus random ones."""

    population_size: int = 16
    mutation_probability: float = 0.2
    crossover_fraction: float = 0.5
    name: str = field(default="evolution", init=False)

    def propose(self, space, evaluated, count, rng, admissible, constraints):
        seen = {arch_key(candidate.arch) for candidate in evaluated}
        feasible = [candidate for candidate in evaluated if constraints.fits(candidate)]
        if len(feasible) < 2:
            # the first generation: both ends of the trade-off, then random archs
            extremes = iter([space.min_arch(), space.max_arch()])
            return _distinct_samples(lambda: next(extremes, None) or space.sample_arch(rng), count, seen, admissible)
        parents = rank_candidates(feasible)[: self.population_size]

        def tournament() -> Arch:
            # indices into `parents`, which is sorted best first: the lower index wins
            first, second = rng.integers(len(parents), size=2)
            return parents[min(first, second)].arch

        def child() -> Arch:
            if rng.random() < self.crossover_fraction:
                return space.mutate(space.crossover(tournament(), tournament(), rng), rng, self.mutation_probability)
            return space.mutate(tournament(), rng, self.mutation_probability)

        return _distinct_samples(child, count, seen, admissible)


# strategy name -> factory taking the population (generation) size
SEARCH_STRATEGIES: dict[str, Callable[[int], SearchStrategy]] = {
    "evolution": lambda population_size: EvolutionarySearch(population_size=population_size),
    "random": lambda population_size: RandomSearch(),
}


@dataclass
class SearchState:
    """Every candidate evaluated so far and how many generations ran: what a checkpoint stores."""

    evaluated: list[Candidate] = field(default_factory=list)
    generation: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"evaluated": [candidate.to_dict() for candidate in self.evaluated], "generation": self.generation}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchState:
        return cls([Candidate.from_dict(item) for item in data["evaluated"]], int(data["generation"]))


def run_search(
    strategy: SearchStrategy,
    space: SearchSpace,
    evaluate_batch: Callable[[list[Arch]], list[Candidate]],
    evaluations: int,
    batch_size: int,
    constraints: Constraints,
    seed: int,
    admissible: Callable[[Arch], bool] = lambda arch: True,
    state: SearchState | None = None,
    on_generation: Callable[[SearchState], None] | None = None,
) -> SearchState:
    """Evaluate `evaluations` distinct archs in generations of `batch_size`, resuming from `state`."""
    if evaluations < 1 or batch_size < 1:
        raise InvalidInputError(f"evaluations and batch_size must be positive, got {evaluations} and {batch_size}", field="evaluations")
    state = state or SearchState()
    strategy_code = zlib.crc32(strategy.name.encode())
    while len(state.evaluated) < evaluations:
        rng = np.random.default_rng([seed, strategy_code, state.generation])
        count = min(batch_size, evaluations - len(state.evaluated))
        archs = strategy.propose(space, state.evaluated, count, rng, admissible, constraints)
        if not archs:
            break  # the admissible part of the space is exhausted
        state = SearchState(state.evaluated + evaluate_batch(archs), state.generation + 1)
        if on_generation is not None:
            on_generation(state)
    return state


def select_zoo(candidates: list[Candidate], constraints: Constraints, min_size: int = 8, max_size: int = 16) -> list[Candidate]:
    """The zoo: the feasible Pareto front of `Candidate.point` (topped up from the next fronts if it has fewer than
    `min_size` members, thinned evenly along latency if more than `max_size`), fastest first."""
    feasible = [candidate for candidate in candidates if constraints.fits(candidate)]
    if not feasible:
        return []
    points = [candidate.point for candidate in feasible]
    chosen: list[int] = []
    for front in non_dominated_fronts(points):
        if len(chosen) >= min_size:
            break
        chosen += front
    chosen.sort(key=lambda i: points[i][1])
    if len(chosen) > max_size:
        positions = np.linspace(0, len(chosen) - 1, max_size).round().astype(int)
        chosen = [chosen[p] for p in sorted(set(positions.tolist()))]
    return [feasible[i] for i in chosen]


def select_zoo_for_budgets(candidates: list[Candidate], constraints: Constraints,
                           budgets_macs: tuple[int, ...]) -> list[Candidate]:
    """A zoo for a fleet whose budgets are known: for each MACs budget, the feasible candidate within it with the
    best score (`Candidate.point`), each once, fastest first. A Pareto front spread along latency can leave a
    budget with nothing near it; this holds the best the search found under every budget, and a joint fine-tune
    over it trains only what the fleet will run."""
    feasible = [candidate for candidate in candidates if constraints.fits(candidate)]
    chosen: dict[str, Candidate] = {}
    for budget in budgets_macs:
        fitting = [candidate for candidate in feasible if candidate.macs <= budget]
        if not fitting:
            smallest = min((candidate.macs for candidate in feasible), default=None)
            raise InvalidInputError(f"no evaluated subnet within the budget of {budget} MACs (the smallest feasible "
                                    f"has {smallest})", field="zoo_budgets_macs")
        best = max(fitting, key=lambda candidate: candidate.point[0])
        chosen[arch_key(best.arch)] = best
    return sorted(chosen.values(), key=lambda candidate: candidate.point[1])
