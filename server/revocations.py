"""The operator's signed revocation lists, stored and served (`fedzoo.revocation` for the format).

The server signs nothing here: it checks that a key it trusts signed the list (a list devices would refuse
is refused on upload, with the reason), keeps every version uploaded, refuses one that is not newer than the
newest it holds (so nothing stored is replaced), and serves the newest.
"""

from __future__ import annotations

import json

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedzoo.errors import CardSignatureError
from fedzoo.revocation import RevocationList, verify_revocation_list
from fedzoo.server.errors import Conflict, ValidationFailed
from fedzoo.server.tables import RevocationListRecord
from fedzoo.signing import TrustedKeys


def newest(session: Session) -> RevocationListRecord | None:
    """The newest list uploaded, or None."""
    return session.scalars(select(RevocationListRecord).order_by(RevocationListRecord.version.desc()).limit(1)).first()


def store(session: Session, document: dict[str, str], trusted: TrustedKeys) -> RevocationList:
    """Verify and keep an uploaded list: 422 (field `signature`, with the reason) when no trusted key signed it
    or its payload is malformed, 409 `stale_revocation_list` unless its version is newer than every stored one."""
    try:
        listed = verify_revocation_list(document, trusted)
    except CardSignatureError as error:
        hint = (" (FEDZOO_TRUSTED_KEYS lists the operator keys this server trusts)" if error.reason == "unknown_key"
                else "")
        raise ValidationFailed(f"{error}{hint}", field="signature", code="revocation_list_not_trusted",
                               reason=error.reason) from None
    held = session.scalar(select(func.max(RevocationListRecord.version)))
    if held is not None and listed.version <= held:
        raise Conflict(f"revocation list version {listed.version} is not newer than version {held}, already held; "
                       f"sign the list again as version {held + 1}", field="version", code="stale_revocation_list")
    session.add(RevocationListRecord(version=listed.version, key_id=document["key_id"],
                                     document_json=json.dumps(listed.document)))
    session.flush()
    return listed
