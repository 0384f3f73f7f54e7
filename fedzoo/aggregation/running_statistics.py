"""BatchNorm running statistics in federated rounds: averaged as state, never stepped by a strategy.

A training graph built with `batch_norm="training"` takes the running means and variances as inputs and
returns their updated values (`running.<name>`); devices upload `trained - global` of each statistic next
to their parameter deltas (`fedzoo.update_codec`). The statistics are not parameters: a server
optimizer (FedAdam's moments, FedAvgM's momentum, a robust median) has no business stepping them, and
their changes are on another scale than the weights' (a variance moves by whole units where a weight
moves by thousandths), so they must not enter the weights' norm screening either. Here they are:

- **screened like deltas, on their own**: an update the parameter screening rejected brings no statistics
  (the server does not trust half of a suspect update); of the rest, a statistics delta whose L2 norm
  exceeds the round's `median_multiple` x the median statistics norm is clipped or rejected, as the round's
  `norm_bound.action` says (`max_norm` is in the weights' units and does not apply);
- **averaged, weighted by the server's example count** (`counted_examples`, capped by the server, not the
  device's word), and added to the base statistics: the plain FedAvg of the devices' statistics;
- **kept valid**: a variance never goes below zero (int8 rounding of a near-zero variance could).

An update without statistics (an SDK that does not send them) contributes none; with no statistics at all,
the published model keeps the base model's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from fedzoo.aggregation.screening import screen_updates
from fedzoo.aggregation.settings import NormBound
from fedzoo.aggregation.strategies import ClientUpdate, Parameters
from fedzoo.errors import InvalidInputError
from fedzoo.update_codec import RUNNING_PREFIX


def validate_statistics(statistics: Parameters, base: Parameters) -> None:
    """Check an update's statistics deltas: none, or exactly the model's, each float32, shaped and finite."""
    if not statistics:
        return
    missing, unexpected = sorted(set(base) - set(statistics)), sorted(set(statistics) - set(base))
    if missing or unexpected:
        raise InvalidInputError(
            f"an update carries all of the model's running statistics or none; missing {missing}, unexpected {unexpected}",
            field=RUNNING_PREFIX + (missing or unexpected)[0],
        )
    for name, value in statistics.items():
        field = RUNNING_PREFIX + name
        if value.shape != base[name].shape or value.dtype != np.float32:
            raise InvalidInputError(f"statistic delta {field!r} is {value.dtype} {value.shape}, the statistic float32 "
                                    f"{base[name].shape}", field=field)
        if not np.all(np.isfinite(value)):
            raise InvalidInputError(f"statistic delta {field!r} holds NaN or infinite values", field=field)


def aggregate_statistics(
    base: Parameters, kept: list[ClientUpdate], load_statistics: Callable[[ClientUpdate], Parameters],
    bound: NormBound, variances: set[str],
) -> tuple[Parameters, dict[str, int]]:
    """The published statistics: base + the example-weighted mean of the screened statistics deltas.

    `kept` are the updates the parameter screening kept, `load_statistics` loads one's statistics deltas;
    returns the new statistics and how many statistics deltas were counted, clipped and rejected."""
    candidates = []
    for update in kept:
        statistics = load_statistics(update)
        if statistics:
            norm = math.sqrt(sum(float(np.vdot(value, value)) for value in statistics.values()))
            candidates.append(dataclasses.replace(update, load_delta=lambda loaded=statistics: loaded, norm=norm))
    decisions, _limit = screen_updates(candidates, bound.model_copy(update={"max_norm": None}))
    outcomes = {outcome: sum(d.outcome == outcome for d in decisions) for outcome in ("counted", "clipped", "rejected")}
    counted = [decision.update for decision in decisions if decision.update is not None]
    total_examples = sum(update.num_examples for update in counted)
    if not total_examples:
        return dict(base), outcomes
    mean_delta = {name: np.zeros(value.shape, np.float64) for name, value in base.items()}
    for update in counted:
        for name, value in update.load_delta().items():
            mean_delta[name] += value * (update.num_examples / total_examples)
    statistics = {name: (base[name] + mean_delta[name]).astype(np.float32) for name in base}
    for name in variances & set(statistics):
        np.maximum(statistics[name], 0.0, out=statistics[name])
    return statistics, outcomes
