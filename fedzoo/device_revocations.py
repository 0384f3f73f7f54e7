"""The operator's signed list of revoked device signing keys, and the newest version a device keeps.

A certificate lives a year; a stolen or retired device must stop counting as a neighbour before that. The
operator signs, offline with the same key as certificates, `{"purpose": "device_revocations", "version",
"revoked_keys": [key fingerprints], "issued_at", "key_id"}` under `"fedzoo-device-revocations-v1\\n"` (so neither a
card nor a certificate passes for a list); the server only stores and serves it (`GET /v1/device-revocations`).
A device keeps the newest list it verified (version and fingerprints, in its state file or Java `StateStore`):
a list older than the one kept is refused (`rollback`), so a server cannot un-revoke a key by serving an old list.
It can withhold a newer one; a device then still refuses every key of the list it kept.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fedzoo.device_certificates import DeviceCertificateError, open_sealed, seal, sealed_fields
from fedzoo.signing import TIMESTAMP_FORMAT, CardSigningKey, TrustedKeys

REVOCATIONS_DOMAIN = b"fedzoo-device-revocations-v1\n"
REVOCATIONS_PURPOSE = "device_revocations"


@dataclass(frozen=True)
class DeviceRevocations:
    """A verified list: its version and the fingerprints (`key_fingerprint`) of the revoked keys."""

    version: int
    revoked_keys: frozenset[str]

    def to_state(self) -> dict[str, Any]:
        return {"version": self.version, "revoked_keys": sorted(self.revoked_keys)}

    @classmethod
    def from_state(cls, state: Any) -> DeviceRevocations:
        """The list a device kept (none kept: version 0, nothing revoked)."""
        if not isinstance(state, dict):
            return cls(0, frozenset())
        return cls(int(state.get("version", 0)), frozenset(state.get("revoked_keys", [])))


def sign_revocations(version: int, revoked_keys: list[str], key: CardSigningKey,
                     now: datetime | None = None) -> dict[str, str]:
    """The operator's list number `version` (each new list names every key still revoked)."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    fields = {"purpose": REVOCATIONS_PURPOSE, "version": version, "revoked_keys": sorted(set(revoked_keys)),
              "issued_at": now.strftime(TIMESTAMP_FORMAT), "key_id": key.key_id}
    return seal(REVOCATIONS_DOMAIN, fields, key)


def verify_revocations(document: Any, operator_keys: TrustedKeys | None, kept: DeviceRevocations
                       ) -> DeviceRevocations:
    """The list, once an operator key signed it and its version is not below `kept`'s (the newest this device
    accepted); raises `DeviceCertificateError` (`rollback` for an older list). `operator_keys` None reads it
    unchecked: only for a server that was not given the operator keys."""
    fields = (sealed_fields(document, REVOCATIONS_PURPOSE) if operator_keys is None
              else open_sealed(document, REVOCATIONS_DOMAIN, REVOCATIONS_PURPOSE, operator_keys))
    version, revoked = fields.get("version"), fields.get("revoked_keys")
    if (type(version) is not int or version < 1 or not isinstance(revoked, list)
            or not all(isinstance(item, str) and len(item) == 2 * hashlib.sha256().digest_size for item in revoked)):
        raise DeviceCertificateError("the revocation list's signed fields are incomplete or malformed",
                                     reason="malformed")
    if version < kept.version:
        raise DeviceCertificateError(f"revocation list version {version} is older than version {kept.version}, "
                                     "already accepted (rollback refused)", reason="rollback")
    return DeviceRevocations(version, frozenset(revoked))
