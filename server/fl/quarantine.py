"""Quarantine: a device whose updates keep being left out of aggregation stops being selected.

Robust aggregation bounds what one round's harmful update can do; an insider still costs every round it
takes part in a seat and the server's time, and keeps probing. The round's `quarantine` policy (on by default:
3 exclusions among a device's last 5 updates) flags such a device when a round records its decisions. A
quarantined device is not selected again, by any round, until an operator releases it, or revokes it for good
(`fedzoo fl quarantine`, `GET /v1/fl/quarantine`, the dashboard's Quarantine page). An exclusion is an update
screening left out (`rejected`): by the norm bound's `reject` action, by the direction screening (its update pointed
away from the round's median delta: `fedzoo.aggregation.direction` leaves out only at a cosine of -0.05 or below),
or by the root set's cosine test when it pointed away from the server's update (cosine at most
`max_root_cosine`, -0.05 by default). In SecAgg+ rounds, where the server never sees an update, a seat the device
declined or aborted (it missed a stage it was asked for, `FLRefusedUpload` kinds in `SEAT_FAILURES`) counts the
same way: an insider that claims the capability, takes seats and drops out costs every round a seat and its
neighbours' work (issue #44). Late in a plan honest
non-IID updates are about orthogonal to the server's (cosines within +-0.1 of 0, measured by bench/fl_robust.py):
they are left out of the round but do not count. Updates left out because the operator revoked the device do not
count, nor do those from before a release.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from fedzoo.aggregation.screening import REVOKED_REASON
from fedzoo.errors import NotFoundError
from fedzoo.server.fl.tables import SEAT_FAILURES, FLPrivateRound, FLQuarantine, FLRefusedUpload, FLUpdate
from fedzoo.server.fl.schemas import QuarantinePolicy

QUERY_CHUNK = 500  # devices per IN (...) list: well under any database's limit on bound parameters


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _counts(update, policy: QuarantinePolicy) -> bool:
    """Whether a recorded update is an exclusion towards quarantine (see the module's docstring)."""
    if update.screening != "rejected" or update.screening_reason == REVOKED_REASON:
        return False
    return update.root_cosine is None or update.root_cosine <= policy.max_root_cosine


def is_quarantined(session: Session, device_id: str) -> bool:
    row = session.get(FLQuarantine, device_id)
    return row is not None and row.released_at is None


def review(session: Session, round_id: int, device_ids: list[str], policy: QuarantinePolicy | None,
           now: datetime) -> list[str]:
    """Quarantine the devices of a round whose last `window_updates` recorded updates and SecAgg+ seat failures
    (since any release) hold `max_exclusions` exclusions; returns the ids newly quarantined."""
    if policy is None:
        return []
    flagged = []
    for chunk in (device_ids[start:start + QUERY_CHUNK] for start in range(0, len(device_ids), QUERY_CHUNK)):
        rows = {row.device_id: row for row in session.scalars(select(FLQuarantine).where(FLQuarantine.device_id.in_(chunk)))}
        candidates = [device_id for device_id in chunk if device_id not in rows or rows[device_id].released_at is not None]
        recent_by_device = _recent_updates(session, candidates, policy.window_updates)
        failures_by_device = _recent_seat_failures(session, candidates, policy.window_updates)
        for device_id in candidates:
            row = rows.get(device_id)
            # (when, counts towards quarantine, a SecAgg+ seat rather than an update), newest first
            recent = sorted([(_aware(update.received_at), _counts(update, policy), False)
                             for update in recent_by_device.get(device_id, [])]
                            + [(_aware(failure.received_at), True, True)
                               for failure in failures_by_device.get(device_id, [])],
                            key=lambda event: event[0], reverse=True)[:policy.window_updates]
            if row is not None:  # released: only what came after counts
                recent = [event for event in recent if event[0] > _aware(row.released_at)]
            exclusions = sum(counted for _, counted, _ in recent)
            if exclusions < policy.max_exclusions:
                continue
            seats = any(seat for _, _, seat in recent)
            reason = (f"{exclusions} of its last {len(recent)} "
                      + ("updates or SecAgg+ seats were left out of aggregation or abandoned" if seats
                         else "updates were left out of aggregation")
                      + f" (policy: {policy.max_exclusions} of {policy.window_updates}); round {round_id} decided it")
            if row is None:
                session.add(FLQuarantine(device_id=device_id, round_id=round_id, reason=reason, quarantined_at=now))
            else:
                row.round_id, row.reason, row.quarantined_at, row.released_at = round_id, reason, now, None
            flagged.append(device_id)
    session.flush()
    return flagged


def _recent_updates(session: Session, device_ids: list[str], window_updates: int) -> dict[str, list[Row]]:
    """Each device's last `window_updates` screened updates, newest first, in one query for all of them."""
    if not device_ids:
        return {}
    ranked = (select(FLUpdate.device_id, FLUpdate.screening, FLUpdate.screening_reason, FLUpdate.root_cosine,
                     FLUpdate.received_at,
                     func.row_number().over(partition_by=FLUpdate.device_id, order_by=FLUpdate.id.desc()).label("rank"))
              .where(FLUpdate.device_id.in_(device_ids), FLUpdate.screening.is_not(None)).subquery())
    recent: dict[str, list[Row]] = {}
    for update in session.execute(select(ranked).where(ranked.c.rank <= window_updates).order_by(ranked.c.rank)):
        recent.setdefault(update.device_id, []).append(update)
    return recent


def _recent_seat_failures(session: Session, device_ids: list[str], window_updates: int) -> dict[str, list[Row]]:
    """Each device's last `window_updates` declined or aborted SecAgg+ seats, newest first, in one query."""
    if not device_ids:
        return {}
    ranked = (select(FLRefusedUpload.device_id, FLRefusedUpload.received_at,
                     func.row_number().over(partition_by=FLRefusedUpload.device_id,
                                            order_by=FLRefusedUpload.id.desc()).label("rank"))
              .join(FLPrivateRound, FLPrivateRound.round_id == FLRefusedUpload.round_id)
              .where(FLRefusedUpload.device_id.in_(device_ids), FLRefusedUpload.kind.in_(SEAT_FAILURES),
                     FLPrivateRound.stage.is_not(None)).subquery())
    failures: dict[str, list[Row]] = {}
    for failure in session.execute(select(ranked).where(ranked.c.rank <= window_updates).order_by(ranked.c.rank)):
        failures.setdefault(failure.device_id, []).append(failure)
    return failures


def release(session: Session, device_id: str, now: datetime) -> FLQuarantine:
    """Lift a device's quarantine (it may be selected again); its earlier exclusions no longer count."""
    row = session.get(FLQuarantine, device_id)
    if row is None or row.released_at is not None:
        raise NotFoundError(f"device {device_id!r} is not quarantined")
    row.released_at = now
    session.flush()
    return row
