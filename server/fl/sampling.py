"""Random check-ins (Balle et al. 2020, "Privacy amplification via random check-ins"): a DP plan with
`privacy.dp.sampling_probability` q < 1 seats each device that checks in for a round with probability q, so the
accountant amplifies by q as DP-FedAvg's analysis assumes (McMahan et al. 2018, Poisson sampling).

The coin is drawn once per device and round, at its first check-in, from `secrets` (os.urandom): heads seats it,
tails is stored as a refusal of kind `not_sampled`, so checking in again cannot re-roll. The number seated is
random, so a sampled round never stops seating at a count (a cap would change the mechanism): selection stays open
for `selection_window_s` (or until every registered device drew), then the round collects and aggregates once every
seated device uploaded (or declined), or at its deadline with at least `min_clients`. `target_clients` stays
DP-FedAvg's denominator: the expected cohort. What this rests on, and what leaks: docs/privacy.md, "Sampling on the
server"."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedzoo.errors import InvalidInputError
from fedzoo.server.fl.eligibility import DECLINED
from fedzoo.server.fl.round_context import as_utc, count_rows
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.tables import FLParticipant, FLQuarantine, FLRefusedUpload, FLRound, FLUpdate
from fedzoo.server.tables import DeviceRecord

NOT_SAMPLED = "not_sampled"
COIN_BITS = 53  # a double's mantissa: q is compared exactly at this resolution


def sampling_probability(config: RoundConfig) -> float:
    """The plan's q: 1 (seat whoever checks in) unless a DP plan samples."""
    dp = config.privacy.dp
    return dp.sampling_probability if dp is not None else 1.0


def is_sampled(config: RoundConfig) -> bool:
    return sampling_probability(config) < 1.0


def check_sampling(config: RoundConfig) -> None:
    """422 naming the field for a sampled plan the server cannot run: with SecAgg+ (its cohorts are fixed from the
    seats at a count), or a selection window that does not end before the deadline."""
    if not is_sampled(config):
        return
    if config.privacy.secure_aggregation is not None:
        raise InvalidInputError("sampling_probability below 1 (random check-ins) does not run with secure "
                                "aggregation, whose cohort is fixed when a count of devices is seated: use "
                                "sampling_probability 1 or drop privacy.secure_aggregation",
                                field="privacy.dp.sampling_probability")
    if config.selection_window_s is not None and config.selection_window_s >= config.deadline_s:
        raise InvalidInputError(f"selection_window_s ({config.selection_window_s:g}) must end before the deadline "
                                f"(deadline_s {config.deadline_s:g}): seated devices need time to train",
                                field="selection_window_s")


def selection_closes_at(round_row: FLRound, config: RoundConfig) -> datetime:
    """When a sampled round stops drawing coins: its selection window after it opened (default half its deadline)."""
    window_s = config.selection_window_s if config.selection_window_s is not None else config.deadline_s / 2
    return as_utc(round_row.created_at) + timedelta(seconds=window_s)


def heads(probability: float) -> bool:
    """One coin with P(heads) = `probability`, from the operating system's secure source: a device, or anyone who
    downloads the model, cannot predict or replay it."""
    return secrets.randbelow(2 ** COIN_BITS) < round(probability * 2 ** COIN_BITS)


def drew_tails(session: Session, round_id: int, device_id: str) -> bool:
    return session.scalar(select(func.count()).select_from(FLRefusedUpload).where(
        FLRefusedUpload.round_id == round_id, FLRefusedUpload.device_id == device_id,
        FLRefusedUpload.kind == NOT_SAMPLED)) > 0


def record_tails(session: Session, round_row: FLRound, device_id: str, now: datetime) -> None:
    """Store the device's tails, in the transaction that holds the round's row lock, so its next check-in finds it."""
    session.add(FLRefusedUpload(round_id=round_row.id, device_id=device_id, kind=NOT_SAMPLED,
                                reason=f"not sampled for round {round_row.id} (random check-ins)", upload_bytes=0,
                                received_at=now))


def everyone_drew(session: Session, round_id: int) -> bool:
    """Whether every device that can be seated (registered, unrevoked, not quarantined) has its coin for the round
    (seated or tails): no one is left to sample, so selection may close before its window ends (when it closes
    does not depend on any coin)."""
    drawn = count_rows(session, FLParticipant, round_id) + session.scalar(
        select(func.count()).select_from(FLRefusedUpload).where(FLRefusedUpload.round_id == round_id,
                                                                FLRefusedUpload.kind == NOT_SAMPLED))
    quarantined = select(FLQuarantine.device_id).where(FLQuarantine.released_at.is_(None))
    fleet = session.scalar(select(func.count()).select_from(DeviceRecord).where(
        DeviceRecord.revoked_at.is_(None), DeviceRecord.id.not_in(quarantined)))
    return drawn >= fleet


def cohort_complete(session: Session, round_row: FLRound, min_clients: int) -> bool:
    """A sampled round's aggregation trigger: selection closed and every seated device uploaded or declined, at
    least `min_clients` of them uploading (fewer wait for the deadline, which fails the round as in any other)."""
    if round_row.state != "collecting":
        return False
    seated, uploaded = count_rows(session, FLParticipant, round_row.id), count_rows(session, FLUpdate, round_row.id)
    declined = session.scalar(select(func.count()).select_from(FLRefusedUpload).where(
        FLRefusedUpload.round_id == round_row.id, FLRefusedUpload.kind == DECLINED))
    return uploaded >= min_clients and uploaded + declined >= seated
