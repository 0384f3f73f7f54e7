"""The operator's one signed revocation list (`fedzoo.revocation`), stored and served, and what it revokes here.

The server signs nothing here: it checks that an operator key signed the list (`FEDZOO_TRUSTED_KEYS`; never
its own card-signing key, which would let it un-revoke what the operator revoked; a server given no operator
keys only checks the list's shape, and devices check the signature), keeps every version uploaded, refuses one
that is not newer than the newest it holds (so nothing stored is replaced), and serves the newest.

What the newest list revokes acts on the server too: lookup never chooses a revoked card, the registry marks it
(`models.revoked_by_list`, the list version, shown as `unsigned.revoked_by_list`; set for cards published later
as well), and SecAgg+ rounds do not seat a device whose signing key it names (`device_certificates.seat_refusal`).
"""

from __future__ import annotations

import json

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from fedzoo.errors import CardSignatureError
from fedzoo.revocation import RevocationList, verify_revocation_list
from fedzoo.server.errors import Conflict, ValidationFailed
from fedzoo.server.tables import ModelRecord, RevocationListRecord
from fedzoo.signing import TrustedKeys


def newest(session: Session) -> RevocationListRecord | None:
    """The newest list uploaded, or None."""
    return session.scalars(select(RevocationListRecord).order_by(RevocationListRecord.version.desc()).limit(1)).first()


def newest_list(session: Session) -> RevocationList | None:
    """What the newest list revokes (checked when it was stored), or None."""
    record = newest(session)
    return None if record is None else verify_revocation_list(json.loads(record.document_json), None)


def store(session: Session, document: dict[str, str], operator_keys: TrustedKeys | None) -> RevocationList:
    """Verify and keep an uploaded list, and mark the models it revokes: 422 (field `signature`, with the
    reason) when no operator key signed it or its payload is malformed, 409 `stale_revocation_list` unless its
    version is newer than every stored one."""
    try:
        listed = verify_revocation_list(document, operator_keys)
    except CardSignatureError as error:
        hint = (" (FEDZOO_TRUSTED_KEYS lists the operator keys this server trusts; the server's own key never "
                "signs a revocation list)" if error.reason == "unknown_key" else "")
        raise ValidationFailed(f"{error}{hint}", field="signature", code="revocation_list_not_trusted",
                               reason=error.reason) from None
    held = session.scalar(select(func.max(RevocationListRecord.version)))
    if held is not None and listed.version <= held:
        raise Conflict(f"revocation list version {listed.version} is not newer than version {held}, already held; "
                       f"sign the list again as version {held + 1}", field="version", code="stale_revocation_list")
    session.add(RevocationListRecord(version=listed.version, key_id=document["key_id"],
                                     document_json=json.dumps(listed.document)))
    session.execute(update(ModelRecord).values(revoked_by_list=None))  # a newer list may lift a revocation
    session.execute(update(ModelRecord).where(or_(ModelRecord.id.in_(listed.card_ids),
                                                  ModelRecord.sha256.in_(listed.card_sha256s)))
                    .values(revoked_by_list=listed.version))
    session.flush()
    return listed


def revoking_version(session: Session, card_id: str, sha256: str) -> int | None:
    """The version of the newest list when it revokes this card (by id or model sha256), else None."""
    listed = newest_list(session)
    revoked = listed is not None and (card_id in listed.card_ids or sha256 in listed.card_sha256s)
    return listed.version if revoked else None
