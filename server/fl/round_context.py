"""What every stage of a round shares: the database, the blob store, the clock, the base models, the
private-round state, and the small queries on a round's rows they all ask."""

from __future__ import annotations

import io
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from fedzoo.aggregation.strategies import Parameters
from fedzoo.errors import NotFoundError
from fedzoo.server.blobstore import BlobStore
from fedzoo.server.db import Database
from fedzoo.server.fl.base_models import BaseModels
from fedzoo.server.fl.tables import FLRound, FLSubnetAssignment, FLUpdate
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import PrivateRounds
from fedzoo.update_codec import decode_update, split_statistics

MAX_ROUND_ID = 2**63 - 1  # SQL BIGINT


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; they were stored as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def find_round(session: Session, round_id: int) -> FLRound:
    """The round with this id, or 404; ids past the database's 64-bit integers name no round (not a 500)."""
    round_row = session.get(FLRound, round_id) if 1 <= round_id <= MAX_ROUND_ID else None
    if round_row is None:
        raise NotFoundError(f"no federated round {round_id}")
    return round_row


def count_rows(session: Session, table: type, round_id: int) -> int:
    """How many rows of `table` (participants, updates) the round has."""
    return session.scalar(select(func.count()).select_from(table).where(table.round_id == round_id)) or 0


def lock_round_before_deadline(session: Session, round_id: int, states: Collection[str], now: datetime) -> bool:
    """Whether the round is in one of `states` and before its deadline, asked with a conditional UPDATE that
    changes no value: the write takes the round row's lock (SQLite's write lock; PostgreSQL's row lock, the
    condition re-read once it is free) until the transaction ends, so writers that ask first serialise on it."""
    return session.execute(
        update(FLRound).where(FLRound.id == round_id, FLRound.state.in_(states), FLRound.deadline_at > now)
        .values(state=FLRound.state).execution_options(synchronize_session=False)
    ).rowcount > 0


def has_update(session: Session, round_id: int, device_id: str) -> bool:
    return session.scalar(
        select(func.count()).select_from(FLUpdate).where(FLUpdate.round_id == round_id, FLUpdate.device_id == device_id)
    ) > 0


@dataclass
class RoundContext:
    """The collaborators the stages of a round share; all round state lives in the database and blob store."""

    database: Database
    store: BlobStore
    clock: Callable[[], datetime]
    bases: BaseModels
    private: PrivateRounds
    max_examples_per_update: int

    def device_model_id(self, session: Session, round_row: FLRound, config: RoundConfig, device_id: str) -> str:
        """The model a selected device trains: the round's, or in a zoo-wide round the subnet assigned to it."""
        if config.zoo is None:
            return round_row.base_model_id
        assignment = session.get(FLSubnetAssignment, (round_row.id, device_id))
        return assignment.training_model_id if assignment is not None else round_row.base_model_id

    def delta_loader(self, blob_sha256: str, statistics: bool = False) -> Callable[[], Parameters]:
        """A loader of an update's parameter deltas, or of its running-statistic deltas."""
        def load() -> Parameters:
            with self.store.open(blob_sha256) as stream:
                return split_statistics(decode_update(stream.read())[0])[1 if statistics else 0]

        return load

    def load_npz(self, sha256: str) -> Parameters:
        with self.store.open(sha256) as stream, np.load(io.BytesIO(stream.read()), allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}

    def save_npz(self, arrays: Parameters) -> str:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return self.store.put(buffer.getvalue())
