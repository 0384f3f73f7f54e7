"""Aggregation: the round's strategy over the screened deltas streamed from the blob store (or, in a
private round, over the unmasked sum, `fedzoo.server.fl.secure_rounds`), then the BatchNorm running
statistics (`fedzoo.aggregation.running_statistics`). A strategy's state (FedAdam's moments) carries from
round to round of a plan as a blob."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import numpy as np

from fedzoo.aggregation.running_statistics import aggregate_statistics
from fedzoo.aggregation.strategies import ClientUpdate, Parameters, Strategy, make_strategy
from fedzoo.errors import InvalidInputError
from fedzoo.server.fl.base_models import RoundBase
from fedzoo.server.fl.outcome import RoundOutcome
from fedzoo.server.fl.root_trust import RootUpdate, check_aggregate
from fedzoo.server.fl.tables import FLUpdate
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import is_private


@dataclass(frozen=True)
class Aggregate:
    """The new trainable parameters and running statistics (empty when the statistics stay the parent's)."""

    parameters: Parameters
    statistics: Parameters


class Aggregation:
    """Runs a round's strategy over its screened updates."""

    def __init__(self, context: RoundContext, spill_dir: Path | None = None) -> None:
        self.context, self.spill_dir = context, spill_dir
        if spill_dir is not None:
            spill_dir.mkdir(parents=True, exist_ok=True)

    def strategy(self, config: RoundConfig, previous_state_sha256: str | None) -> Strategy:
        """The round's strategy, holding the state the plan's previous round left."""
        strategy = make_strategy(config.strategy, self.spill_dir)
        if previous_state_sha256 is not None:
            strategy.load_state(self.context.load_npz(previous_state_sha256))
        return strategy

    def aggregate(self, round_id: int, config: RoundConfig, base: RoundBase, rows: list[FLUpdate],
                  kept: list[ClientUpdate], strategy: Strategy, outcome: RoundOutcome,
                  root: RootUpdate | None = None) -> Aggregate:
        """The aggregate of the kept updates (or of the private sum, checked against the `root` update when
        there is one: the sum is all the server sees); fills in the round's outcome. Raises a `FedzooError` for a
        bad result (non-finite weights, an aborted SecAgg+, a private aggregate pointing away from the root)."""
        if is_private(config):
            parameters = self.context.private.aggregate(
                round_id, config, base.parameters, strategy, [self.context.delta_loader(row.blob_sha256) for row in rows],
                outcome)
        else:
            parameters = strategy.aggregate_fit(base.parameters, kept)
        if not all(np.all(np.isfinite(value)) for value in parameters.values()):
            raise InvalidInputError(f"the {strategy.name} aggregate holds NaN or infinite weights")
        if root is not None and is_private(config):
            parameters, outcome.root_trust = check_aggregate(base.parameters, parameters, root, config.root_trust)
        statistics: Parameters = {}
        if base.statistics and not is_private(config):  # under SecAgg+/DP the statistics stay the parent's
            blobs = {row.device_id: row.blob_sha256 for row in rows}
            statistics, outcome.running_statistics = aggregate_statistics(
                base.statistics, kept,
                lambda update: self.context.delta_loader(blobs[update.device_id], statistics=True)(),
                config.norm_bound, base.variances)
        return Aggregate(parameters, statistics)
