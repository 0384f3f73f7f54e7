"""Round kinds: what differs between a round of one model and a zoo-wide round, behind one small protocol.

The round service (`fedzoo.server.fl.rounds`) and its stages (selection, collection, the SecAgg+ stages, the
lifecycle, deadlines) are written once; a kind says only what is its own (docs/federated-rounds.md, "Round
kinds"):

- `open_plan`: what it refuses, and the card its first round starts from;
- `terms_lines`: the model lines its rounds touch, which the operator's privacy terms are checked for
  (`fedzoo.server.fl.terms_gate`);
- `seat` and `seat_group`: whether a checked-in device can take a seat (a zoo-wide round needs a subnet within the
  device's budget) and which SecAgg+ cohort it joins (one for the round, or one per subnet);
- `close`: screen, aggregate and publish the round's updates, or fail it, under the aggregation lease.

Privacy (`fedzoo.server.fl.secure_rounds`: SecAgg+ cohorts, DP's noise and ledgers) and robustness (the screening
stage, `fedzoo.aggregation`) are layers every kind calls, not kinds of their own: `SingleModelRounds`
(`fedzoo.server.fl.single_model_rounds`) and `ZooRounds` (`fedzoo.server.fl.zoo_rounds`) both run under them.
"""

from __future__ import annotations

import io
import math
from typing import Protocol

import numpy as np
from sqlalchemy.orm import Session

from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import Strategy
from fedzoo.cards import ModelCard
from fedzoo.errors import InvalidInputError
from fedzoo.server.blobstore import BlobStore
from fedzoo.server.fl.lifecycle import RoundLifecycle
from fedzoo.server.fl.outcome import RoundOutcome
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import SeatGroup
from fedzoo.server.fl.stages.screening import record_screening
from fedzoo.server.fl.tables import FLRound, FLUpdate


class RoundKind(Protocol):
    """One kind of federated round, as the round service drives it."""

    closes_in_background: bool  # aggregation runs as a background job of the claiming worker (no request waits)

    def open_plan(self, session: Session, config: RoundConfig, strategy: Strategy) -> tuple[RoundConfig, ModelCard]:
        """The plan's config as its rounds run it (caps recorded, DP's noise calibrated) and the card its first
        round starts from; 422 (InvalidInputError naming the field) for what this kind cannot run."""
        ...

    def terms_lines(self, session: Session, config: RoundConfig, card: ModelCard) -> list[str]:
        """The model lines a round of the plan on `card` touches: those its devices check the operator's privacy
        terms for (the line of the card each trains), and the ledger lines it charges and publishes on."""
        ...

    def seat(self, session: Session, round_row: FLRound, config: RoundConfig, device_id: str) -> bool:
        """Whether the device can take a seat in the round, recording what it will train; False: not this round."""
        ...

    def seat_group(self, session: Session, round_row: FLRound, device_id: str) -> SeatGroup:
        """The SecAgg+ cohort a seated device joins when selection closes."""
        ...

    def close(self, round_id: int, config: RoundConfig, rows: list[FLUpdate], revoked: frozenset[str],
              strategy: Strategy) -> None:
        """Screen, aggregate and publish the round's updates (or fail the round, saying why); called once, by the
        worker holding the aggregation lease."""
        ...


class RoundEnd:
    """How every kind fails a round it cannot publish: its outcome recorded, then the plan goes on."""

    def __init__(self, context: RoundContext, lifecycle: RoundLifecycle) -> None:
        self.context, self.lifecycle = context, lifecycle

    def refuse(self, round_id: int, rows: list[FLUpdate], screened: list[Screened], outcome: RoundOutcome,
               reason: str) -> None:
        """Fail the round with its outcome recorded (a bad result, not a crash): a noised aggregate made before the
        failure is still charged to the ledger, and screening decisions still count towards quarantine."""
        with self.context.database.session() as session:
            round_row = self.lifecycle.finish_if_owner(session, round_id, "failed")
            if round_row is not None:
                self.context.private.record_release(session, round_id, outcome)
                record_screening(session, rows, screened,
                                 RoundConfig.model_validate_json(round_row.config_json).quarantine,
                                 self.context.clock())
                self.lifecycle.fail(session, round_row, reason, outcome)


def with_example_cap(config: RoundConfig, context: RoundContext) -> RoundConfig:
    """The config with the cap on a device's example count that is in force recorded, so the round says it."""
    if config.max_examples_per_update is not None:
        return config
    return config.model_copy(update={"max_examples_per_update": context.max_examples_per_update})


def check_secure_cohort(config: RoundConfig) -> None:
    """SecAgg+ needs a cohort of at least 3 (2 could each subtract the other's input from the sum)."""
    goal = math.ceil(config.target_clients * (1 + config.over_selection))
    if config.privacy.secure_aggregation is not None and goal < 3:
        raise InvalidInputError(f"secure aggregation needs at least 3 selected devices; target_clients x "
                                f"(1 + over_selection) is {goal}", field="privacy.secure_aggregation")


def check_evaluation_set(store: BlobStore, sha256: str, card: ModelCard, field: str = "evaluation_sha256") -> None:
    """The evaluation (or root) blob must be an `.npz` of images `x` shaped like the model's input and labels `y`."""
    if not store.exists(sha256):
        raise InvalidInputError(f"{field} names blob {sha256}, which is not uploaded", field=field)
    try:
        with store.open(sha256) as stream, np.load(io.BytesIO(stream.read()), allow_pickle=False) as archive:
            x_shape, y_shape = archive["x"].shape, archive["y"].shape
    except (KeyError, ValueError, OSError) as error:
        raise InvalidInputError(f"the {field} blob is not an .npz with arrays 'x' and 'y': {error}",
                                field=field) from None
    expected = tuple(dim for dim in card.input.shape[1:])
    if len(x_shape) != len(card.input.shape) or x_shape[1:] != expected or y_shape != x_shape[:1] or not y_shape[0]:
        raise InvalidInputError(
            f"the {field} set has x {x_shape} and y {y_shape}; the model needs x "
            f"(N, {', '.join(map(str, expected))}) and y (N,) with N >= 1", field=field)
