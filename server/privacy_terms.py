"""The operator's signed privacy terms (`fedzoo.privacy_terms`), stored and served.

As with the revocation list (`fedzoo.server.revocations`), the server signs nothing: it checks that an operator
key signed the terms (`FEDZOO_TRUSTED_KEYS`; never its own key, which would let it relax what the operator
requires; a server given no operator keys only checks their shape, and devices check the signature), keeps every
version uploaded, refuses one that is not newer than the newest it holds (so nothing stored is replaced), and
serves the newest. Devices enforce the terms; the server only relays them.
"""

from __future__ import annotations

import json

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedzoo.privacy_terms import PrivacyTerms, verify_privacy_terms
from fedzoo.errors import CardSignatureError
from fedzoo.server.errors import Conflict, ValidationFailed
from fedzoo.server.tables import PrivacyTermsRecord
from fedzoo.signing import TrustedKeys


def newest(session: Session) -> PrivacyTermsRecord | None:
    """The newest terms uploaded, or None."""
    return session.scalars(select(PrivacyTermsRecord).order_by(PrivacyTermsRecord.version.desc()).limit(1)).first()


def store(session: Session, document: dict[str, str], operator_keys: TrustedKeys | None) -> PrivacyTerms:
    """Verify and keep uploaded terms: 422 `privacy_terms_not_trusted` (field `signature`, with the reason) when no
    operator key signed them or their payload is malformed, 409 `stale_privacy_terms` unless their version is
    newer than every stored one."""
    try:
        terms = verify_privacy_terms(document, operator_keys)
    except CardSignatureError as error:
        hint = (" (FEDZOO_TRUSTED_KEYS lists the operator keys this server trusts; the server's own key never "
                "signs privacy terms)" if error.reason == "unknown_key" else "")
        raise ValidationFailed(f"{error}{hint}", field="signature", code="privacy_terms_not_trusted",
                               reason=error.reason) from None
    held = session.scalar(select(func.max(PrivacyTermsRecord.version)))
    if held is not None and terms.version <= held:
        raise Conflict(f"privacy terms version {terms.version} are not newer than version {held}, already held; "
                       f"sign them again as version {held + 1}", field="version", code="stale_privacy_terms")
    session.add(PrivacyTermsRecord(version=terms.version, key_id=document["key_id"],
                                   document_json=json.dumps(terms.document)))
    session.flush()
    return terms
