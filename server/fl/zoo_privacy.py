"""DP-FedAvg in zoo-wide rounds (docs/privacy.md, "DP in zoo-wide rounds" and "Distributed DP in zoo-wide rounds"):
noise on every subnet's cohort sum, and per-element combining with public denominators only.

Each device clips its subnet delta to `clip_norm` and belongs to exactly one cohort (its subnet's), so one device
moves one subnet's sum. The server releases, for every subnet of the zoo (a public list: the zoo models' archs),
that subnet's noised sum: its cohort's sum on the SecAgg+ grid, or zeros where no cohort formed, plus integer
discrete Gaussian noise. The cohort floor makes one device able to move a sum by more than C: a device that brings
its subnet's group to 3 makes a cohort exist, whose sum holds 3 devices. The released vector's L2 sensitivity is
therefore `MIN_COHORT` x the per-device bound, and the noise is z times that: with central noise the server adds it
to every sum (`CentralNoise`, from `os.urandom`); with distributed noise each cohort's devices add it in the ring
before masking (asked for z x `MIN_COHORT` against their own bound: `distributed_dp.noise_request`), and the server
adds to a subnet without a cohort the shares an honest cohort of `MIN_COHORT` would have (`AbsentCohortNoise`).
Everything after it is post-processing with public numbers: each subnet weighs `target_clients / subnets` (a fixed
denominator as DP-FedAvg's `target_clients`), an element's denominator is that weight times the subnets covering
it, and the coverage-scaled step counts subnets, not devices.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session

from fedzoo.aggregation.per_element import CoverageSum, is_statistic
from fedzoo.cards import ModelCard
from fedzoo.dp.accountant import LineEvents, PrivacyLedger, epsilon_of_events
from fedzoo.errors import InvalidInputError
from fedzoo.dp.discrete_gaussian import SecureRandom
from fedzoo.dp.distributed import MECHANISM, DistributedNoise, device_sigma_squared, noise_shares, norm_bound_squared
from fedzoo.dp.noise import NoiseSource, quantised_sensitivity
from fedzoo.nas.space import Arch, SearchSpace
from fedzoo.nas.subnet_mapping import Weights, extract_weights, map_back
from fedzoo.server.db import Database
from fedzoo.server.fl.distributed_dp import is_distributed, noise_request, require_calibrated_survivors
from fedzoo.server.fl.outcome import RoundOutcome
from fedzoo.server.fl.privacy_lineage import lineage_claim
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import (MIN_COHORT, CohortSum, card_privacy, inherited_ledger, ledger_line,
                                            refuse_busy_lines, secagg_config)
from fedzoo.server.fl.tables import FLPrivateRound, PrivacyLine


class CohortNoise(Protocol):
    """DP in a zoo-wide round: the integer noise (steps of the SecAgg+ grid) the server adds to each public subnet's
    sum."""

    grid_step: float

    def steps(self, formed: bool, dimension: int) -> np.ndarray:
        """The noise on one subnet's sum of `dimension` coordinates (`formed`: whether a cohort summed it)."""


@dataclass(frozen=True)
class CentralNoise:
    """Central DP: discrete Gaussian noise of `stddev` (model units) on every subnet's sum, from `source`."""

    grid_step: float
    stddev: float
    source: NoiseSource

    def steps(self, formed: bool, dimension: int) -> np.ndarray:
        return self.source.integer_noise(self.stddev / self.grid_step, dimension)


@dataclass(frozen=True)
class AbsentCohortNoise:
    """Distributed DP: a cohort's devices noised its sum, so the server adds nothing to it; a subnet without a cohort
    gets what an honest cohort of `MIN_COHORT` devices training it would have added (`request`: what such a cohort
    is asked, at `levels`), so whether the cohort exists does not change the noise's distribution."""

    grid_step: float
    levels: int
    request: DistributedNoise

    def steps(self, formed: bool, dimension: int) -> np.ndarray:
        if formed:
            return np.zeros(dimension, np.int64)
        return noise_shares(device_sigma_squared(self.request, self.levels, dimension), dimension, SecureRandom(),
                            MIN_COHORT)


@dataclass(frozen=True)
class PublicSubnet:
    """One subnet of the zoo, public before the round: its arch (a zoo model's) and its key (`arch_key`)."""

    key: str
    arch: Arch


def trainable_shapes(space: SearchSpace, arch: Arch, weights: Weights) -> dict[str, tuple[int, ...]]:
    """The shapes of a subnet's trainable tensors (what its devices' updates hold under privacy)."""
    return {name: value.shape for name, value in extract_weights(space, arch, weights).items()
            if not is_statistic(name)}


def longest_subnet(space: SearchSpace, weights: Weights, archs: list[Arch]) -> int:
    """The most trainable parameters any of the zoo's subnets has (the longest update vector a cohort masks)."""
    return max(sum(math.prod(shape) for shape in trainable_shapes(space, arch, weights).values()) for arch in archs)


def cohort_sensitivity(clip_norm: float, grid_step: float, longest_vector: int) -> float:
    """The L2 sensitivity of the vector of all subnets' sums: `MIN_COHORT` devices' quantised clipped deltas (one
    device can make a cohort of 3 exist or not), on the longest subnet vector."""
    return MIN_COHORT * quantised_sensitivity(clip_norm, grid_step, longest_vector)


def noised_coverage_sum(space: SearchSpace, weights: Weights, subnets: list[PublicSubnet],
                        sums: dict[str, dict[str, np.ndarray]], target_clients: int, noise: CohortNoise) -> CoverageSum:
    """Every public subnet's sum (`sums` by subnet key; zeros where no cohort formed) on the grid, plus `noise`'s
    integer noise, mapped onto the supernet with the public weight `target_clients / len(subnets)` and one "device"
    per subnet (coverage counts subnets)."""
    total = CoverageSum({name: value.shape for name, value in weights.items()})
    weight = target_clients / len(subnets)
    for subnet in subnets:
        shapes = trainable_shapes(space, subnet.arch, weights)
        cohort = sums.get(subnet.key, {})
        if cohort and set(cohort) != set(shapes):
            raise InvalidInputError(f"subnet {subnet.key}'s cohort sum and its arch differ in tensors "
                                    f"{sorted(set(cohort) ^ set(shapes))}")
        added = noise.steps(bool(cohort), sum(math.prod(shape) for shape in shapes.values()))
        noised, start = {}, 0
        for name, shape in shapes.items():
            size = math.prod(shape)
            steps = np.rint(np.asarray(cohort.get(name, np.zeros(shape)), np.float64) / noise.grid_step)
            steps = steps.astype(np.int64) + added[start:start + size].reshape(shape)
            noised[name], start = (steps * noise.grid_step).astype(np.float32), start + size
        total.add_sum(map_back(space, subnet.arch, weights, noised), weight, 1, subnet.key)
    return total


def charged_line(events: LineEvents, noise_multiplier: float, sampling_probability: float) -> LineEvents:
    """A model line's events with one more released round of this mechanism (merged into its last event when
    that is the same mechanism)."""
    if events and events[-1][:2] == [noise_multiplier, sampling_probability]:
        return [*events[:-1], [noise_multiplier, sampling_probability, events[-1][2] + 1]]
    return [*events, [noise_multiplier, sampling_probability, 1]]


def zoo_noise(database: Database, round_id: int, config: RoundConfig, space: SearchSpace, weights: Weights,
              archs: list[Arch], sums: list[CohortSum], outcome: RoundOutcome) -> CohortNoise | None:
    """The noise a DP zoo-wide round adds to the subnets' sums (None without DP): central, z x `cohort_sensitivity`
    on the longest of the zoo's subnet vectors, on every sum; distributed, none on the cohorts' sums (their devices
    noised them for z x `MIN_COHORT` x their own bound; each must hold the survivors that noise is calibrated under)
    and an absent cohort's shares on every other subnet. The plan's ledger records the round at z either way and the
    outcome states the privacy (`card_privacy`). Raises PrivacyBudgetExhausted over the budget."""
    dp = config.privacy.dp
    if dp is None:
        return None
    with database.session() as session:
        ledger = PrivacyLedger.from_dict(json.loads(session.get(FLPrivateRound, round_id).ledger_json))
    ledger.require_budget_for_next_round()
    grid_step = sums[0].protocol.clip_range / sums[0].protocol.levels  # every cohort's grid: clip_norm / levels
    longest = longest_subnet(space, weights, archs)
    noise: CohortNoise
    if is_distributed(config):
        for cohort in sums:
            require_calibrated_survivors(cohort.count, cohort.protocol.minimum_survivors)
        levels = sums[0].protocol.levels
        # the request a cohort of MIN_COHORT gets (its honest survivors do not depend on the vector's length)
        least = secagg_config(config.privacy.secure_aggregation, round_id, MIN_COHORT, longest, dp.clip_norm,
                              MIN_COHORT, 0)
        noise = AbsentCohortNoise(grid_step, levels, noise_request(config, least))
        mechanism = {
            "mechanism": MECHANISM, "noise": f"{MECHANISM}: each cohort's devices add N_Z(0, sigma^2) in the SecAgg+ "
            f"ring, calibrated at its honest survivor floor; the server adds {MIN_COHORT} devices' shares to every "
            "subnet without a cohort", "device_noise_multiplier": noise.request.noise_multiplier,
            "sensitivity": MIN_COHORT * math.sqrt(norm_bound_squared(levels, longest)) * grid_step,
            "grid_step": grid_step}
    else:
        sensitivity = cohort_sensitivity(dp.clip_norm, grid_step, longest)
        noise = CentralNoise(grid_step, ledger.noise_multiplier * sensitivity, NoiseSource())
        mechanism = {"mechanism": "central-discrete-gaussian",
                     "noise": "discrete Gaussian from os.urandom, on every subnet's sum", "sensitivity": sensitivity}
    ledger.record_round()
    outcome.privacy = card_privacy(config, ledger, None, {**mechanism, "cohort_floor": MIN_COHORT,
                                                         "subnets": len(archs)})
    outcome.privacy_ledger = ledger.to_dict()
    return noise


def charge_zoo_lines(session: Session, cards: list[ModelCard], outcome: RoundOutcome, clock: Callable[[], datetime]
                     ) -> dict[str, dict[str, Any]]:
    """A DP zoo-wide round released a noised supernet: every zoo model's line (`cards`: the zoo models and their
    INT8 variants, whether republished this round or not: whatever the plan publishes of them later derives from
    this release) is charged it once (`ledger_line`: the DP line its weights carry, else the card's own; a line new
    to the server starts from the signed claim its weights carry). Returns, by card id, the privacy claim a new
    version of that card states, with its line's epsilon ({} without DP)."""
    claim = (outcome.privacy or {}).get("dp")
    if not claim:
        return {}
    charged: dict[str, dict[str, Any]] = {}  # by line: two cards of one line are charged once
    claims = {}
    for card in cards:
        line_id = ledger_line(session, card)
        if line_id not in charged:
            charged[line_id] = _charge_line(session, card, line_id, claim, clock)
        claims[card.id] = {**(outcome.privacy or {}), "dp": {**claim, **charged[line_id]}}
    return claims


def check_zoo_lines(session: Session, cards: list[ModelCard], config: RoundConfig, line_max_epsilon: float | None
                    ) -> None:
    """Before a DP zoo plan opens: raises Conflict (`line_busy`) while a DP plan runs on any zoo model's line (`cards`,
    as `charge_zoo_lines` charges them), and PrivacyBudgetExhausted when the rounds its own budget lets it run would
    take any of those lines past the operator's lifetime budget."""
    dp = config.privacy.dp
    lines: dict[str, ModelCard] = {}
    for card in cards:
        lines.setdefault(ledger_line(session, card), card)
    refuse_busy_lines(session, list(lines))
    for line_id, card in lines.items():
        _, events, delta, mechanism = _line_state(session, card, line_id, dp.delta, dp.mechanism)
        ledger = PrivacyLedger(dp.noise_multiplier, dp.sampling_probability, delta, dp.max_epsilon, mechanism,
                               line=line_id, line_events=events, line_max_epsilon=line_max_epsilon)
        ledger.require_line_budget(ledger.rounds_within_plan_budget(config.num_rounds))


def _line_state(session: Session, card: ModelCard, line_id: str, delta: float, mechanism: str
                ) -> tuple[PrivacyLine | None, LineEvents, float, str]:
    """A line's row (None when new to the server), events, delta and accountant; a new line's from the signed claim
    its weights carry (`inherited_ledger`), at the plan's delta and accountant otherwise."""
    line = session.get(PrivacyLine, line_id)
    if line is not None:
        return line, json.loads(line.events_json), line.delta, line.mechanism
    inherited = lineage_claim(session, card)
    events, delta, mechanism = inherited_ledger(inherited.claim if inherited else {}, delta, mechanism)
    return None, events, delta, mechanism


def _charge_line(session: Session, card: ModelCard, line_id: str, claim: dict[str, Any],
                 clock: Callable[[], datetime]) -> dict[str, Any]:
    line, events, delta, mechanism = _line_state(session, card, line_id, claim["delta"], claim["accountant"])
    if line is None:
        line = PrivacyLine(line_id=line_id, delta=delta, mechanism=mechanism, events_json="[]", epsilon=0.0,
                           revision=0, updated_at=clock())
        session.add(line)
    events = charged_line(events, claim["noise_multiplier"], claim["sampling_probability"])
    line.events_json, line.updated_at = json.dumps(events), clock()
    line.epsilon = epsilon_of_events(events, line.delta, line.mechanism)  # type: ignore[arg-type]
    session.flush()
    return {"epsilon": line.epsilon, "delta": line.delta, "accountant": line.mechanism, "line": line_id,
            "line_events": events}
