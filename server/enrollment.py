"""Enrollment tokens: admin-issued credentials a device presents once, to register.

A token is shown once, when created; only its sha256 is stored (as device tokens, `fedzoo.server.auth`).
It lets at most `max_uses` devices register until `expires_at`, optionally only devices of one
`device_class`. A use is taken by one conditional UPDATE (`uses < max_uses`, not expired, not revoked), in
the registration's own transaction: concurrent registrations on any number of workers, on SQLite or
PostgreSQL, never take more uses than there are, and a registration that fails gives its use back.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from fedzoo.errors import NotFoundError
from fedzoo.server.auth import hash_token, new_device_token
from fedzoo.server.errors import Forbidden, Unauthorized
from fedzoo.server.tables import EnrollmentToken, as_utc


@dataclass(frozen=True)
class IssuedEnrollmentToken:
    record: EnrollmentToken
    token: str  # shown once


def create(session: Session, expires_in_s: int, max_uses: int, label: str | None = None,
           device_class: str | None = None) -> IssuedEnrollmentToken:
    """Store a new enrollment token; the token itself is returned once and never again."""
    token = new_device_token()
    record = EnrollmentToken(
        id=f"enr_{secrets.token_hex(8)}", token_hash=hash_token(token), label=label, device_class=device_class,
        max_uses=max_uses, uses=0, expires_at=datetime.now(timezone.utc) + timedelta(seconds=expires_in_s),
        created_at=datetime.now(timezone.utc),
    )
    session.add(record)
    session.flush()
    return IssuedEnrollmentToken(record, token)


def list_page(session: Session, limit: int, offset: int) -> tuple[list[EnrollmentToken], int]:
    """One page of enrollment tokens, newest first, and how many there are."""
    total = session.scalar(select(func.count()).select_from(EnrollmentToken)) or 0
    records = list(session.scalars(select(EnrollmentToken).order_by(EnrollmentToken.created_at.desc(),
                                                                    EnrollmentToken.id).limit(limit).offset(offset)))
    return records, total


def revoke(session: Session, token_id: str) -> EnrollmentToken:
    """Stop a token from enrolling anyone else (devices it enrolled stay registered); idempotent."""
    record = session.get(EnrollmentToken, token_id)
    if record is None:
        raise NotFoundError(f"no enrollment token {token_id!r}")
    if record.revoked_at is None:
        record.revoked_at = datetime.now(timezone.utc)
        session.flush()
    return record


def state(record: EnrollmentToken) -> str:
    """revoked, used_up, expired or active: the first that applies, in that order."""
    if record.revoked_at is not None:
        return "revoked"
    if record.uses >= record.max_uses:
        return "used_up"
    if as_utc(record.expires_at) <= datetime.now(timezone.utc):
        return "expired"
    return "active"


def consume(session: Session, token: str, device_class: str | None) -> EnrollmentToken:
    """Take one use of `token` for a device of `device_class`; 401 (field Authorization) naming why not."""
    token_hash = hash_token(token)
    now = datetime.now(timezone.utc)
    taken = session.execute(
        update(EnrollmentToken)
        .where(EnrollmentToken.token_hash == token_hash, EnrollmentToken.revoked_at.is_(None),
               EnrollmentToken.expires_at > now, EnrollmentToken.uses < EnrollmentToken.max_uses)
        .values(uses=EnrollmentToken.uses + 1)
        .execution_options(synchronize_session=False)
    ).rowcount
    record = session.scalars(select(EnrollmentToken).where(EnrollmentToken.token_hash == token_hash)).first()
    if not taken:
        raise _refusal(record)
    if record.device_class is not None and record.device_class != device_class:
        raise Forbidden(f"this enrollment token enrolls only devices of class {record.device_class!r}, "
                        f"not {device_class!r}", field="device_class", code="enrollment_class_mismatch")
    return record


def _refusal(record: EnrollmentToken | None) -> Unauthorized:
    if record is None:
        return Unauthorized("the enrollment token is not valid; ask the fleet's operator for one",
                            field="Authorization", code="invalid_enrollment_token")
    if record.revoked_at is not None:
        return Unauthorized("the enrollment token was revoked", field="Authorization", code="enrollment_token_revoked")
    if record.uses >= record.max_uses:
        return Unauthorized(f"the enrollment token is used up ({record.max_uses} devices enrolled)",
                            field="Authorization", code="enrollment_token_used_up")
    return Unauthorized(f"the enrollment token expired at {as_utc(record.expires_at).isoformat()}",
                        field="Authorization", code="enrollment_token_expired")
