"""The server's side of device certificates: it lists the keys awaiting one, stores what the operator uploads, and
relays it; it never holds the operator's private key, so it cannot make one (docs/privacy.md, "Who vouches").

An upload is checked so that a mistake is caught here and not by every neighbour in a round: the certificate
must name this device and its registered key, and when the server knows the operator keys (`FEDZOO_TRUSTED_KEYS`)
it must verify against them (without them the signature is left to the devices, which check it anyway).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedzoo.device_certificates import DeviceCertificate, DeviceCertificateError, key_fingerprint, read_certificate
from fedzoo.errors import NotFoundError
from fedzoo.server import revocations
from fedzoo.server.errors import Conflict, ValidationFailed
from fedzoo.server.tables import DeviceCertificateRecord, DeviceRecord, as_utc, utc_now
from fedzoo.signing import TrustedKeys


def signing_keys_page(session: Session, uncertified: bool, limit: int, offset: int) -> dict[str, Any]:
    """Devices with a registered signing key (those without a certificate only, with `uncertified`), oldest first."""
    query = (select(DeviceRecord.id, DeviceRecord.signing_public_key, DeviceRecord.registered_at,
                    DeviceCertificateRecord.key_id, DeviceCertificateRecord.expires_at)
             .outerjoin(DeviceCertificateRecord, DeviceCertificateRecord.device_id == DeviceRecord.id)
             .where(DeviceRecord.signing_public_key.is_not(None), DeviceRecord.revoked_at.is_(None)))
    if uncertified:
        query = query.where(DeviceCertificateRecord.device_id.is_(None))
    total = session.scalar(select(func.count()).select_from(query.subquery()))
    rows = session.execute(query.order_by(DeviceRecord.registered_at, DeviceRecord.id).limit(limit).offset(offset))
    devices = [{"device_id": device_id, "signing_public_key": base64.b64encode(key).decode("ascii"),
                "fingerprint": key_fingerprint(key), "registered_at": as_utc(registered_at),
                "certificate_key_id": key_id, "certificate_expires_at": as_utc(expires) if expires else None}
               for device_id, key, registered_at, key_id, expires in rows]
    return {"devices": devices, "total": total}


def store_certificate(session: Session, device_id: str, certificate: dict[str, Any],
                      operator_keys: TrustedKeys | None) -> DeviceCertificate:
    """Keep the operator's certificate of `device_id`'s key (replacing an older one); 404 for an unknown device,
    422 (`certificate`) for one that does not name this device and its key or, with operator keys, does not verify."""
    record = session.get(DeviceRecord, device_id)
    if record is None:
        raise NotFoundError(f"no device {device_id!r} is registered")
    if record.signing_public_key is None:
        raise Conflict(f"device {device_id!r} registered no signing key: there is nothing to certify",
                       field="device_id", code="no_signing_key")
    try:
        read = read_certificate(certificate, operator_keys)
    except DeviceCertificateError as error:
        raise ValidationFailed(f"{error} (certify with `fedzoo devices certify --signing-key <operator key>`)",
                               field="certificate", code="certificate_not_trusted", reason=error.reason) from None
    if read.device_id != device_id or read.signing_public_key != record.signing_public_key:
        raise ValidationFailed(f"the certificate is for device {read.device_id!r} and another key, not device "
                               f"{device_id!r}'s registered signing key", field="certificate",
                               code="certificate_not_trusted", reason="wrong_device")
    session.merge(DeviceCertificateRecord(device_id=device_id, certificate_json=json.dumps(certificate),
                                          key_id=read.key_id, expires_at=read.expires_at, uploaded_at=utc_now()))
    session.flush()
    return read


def certificates_of(session: Session, device_ids: list[str]) -> dict[str, dict[str, Any]]:
    """device id -> its certificate document, for the devices that have one."""
    rows = session.execute(select(DeviceCertificateRecord.device_id, DeviceCertificateRecord.certificate_json)
                           .where(DeviceCertificateRecord.device_id.in_(device_ids)))
    return {device_id: json.loads(text) for device_id, text in rows}


def seat_refusal(session: Session, device_id: str, signing_public_key: bytes, now: datetime) -> str | None:
    """Why an honest server does not seat this device in a SecAgg+ round (its neighbours would refuse it), or None:
    no certificate, an expired one, or a key on the newest revocation list."""
    record = session.get(DeviceCertificateRecord, device_id)
    if record is None:
        return ("certificate_required: this round runs secure aggregation, whose devices accept only neighbours the "
                "operator certified; the operator runs `fedzoo devices certify` (docs/privacy.md)")
    if as_utc(record.expires_at) <= now:
        return "certificate_expired: the operator's certificate of this device's key expired; run `fedzoo devices certify`"
    revoked = revocations.newest_list(session)
    if revoked is not None and key_fingerprint(signing_public_key) in revoked.device_key_fingerprints:
        return "key_revoked: the operator revoked this device's signing key (fedzoo devices revoke-keys)"
    return None
