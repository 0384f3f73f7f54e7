"""A device's pinned operator key set for SecAgg+ neighbours, and the newest device revocation list it verified.

The operator's key set (`fedzoo keys export-public`, NOT the fleet set `GET /v1/keys`, which holds the server's own
key) is what neighbours' certificates must verify against. Before each SecAgg+ round the device reads the
operator's signed revocation list from the server (`GET /v1/device-revocations`, one request) and keeps the
newest it verified in its state file (key `device_revocations`, as the Java SDK's `StateStore`): an older list is
refused, and a server that withholds a newer one still faces every key of the list the device kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedzoo.clients.device_state import change_state, load_state
from fedzoo.device_certificates import CertificatePolicy, DeviceCertificateError
from fedzoo.device_revocations import DeviceRevocations, verify_revocations
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.signing import TrustedKeys

REVOCATIONS_STATE = "device_revocations"


class NeighbourTrust:
    """The operator keys a device checks neighbours' certificates against, and its kept revocation list."""

    def __init__(self, operator_keys: TrustedKeys, state_path: Path) -> None:
        self.operator_keys = operator_keys
        self.state_path = Path(state_path)

    def kept_revocations(self) -> DeviceRevocations:
        return DeviceRevocations.from_state(load_state(self.state_path).get(REVOCATIONS_STATE))

    def policy(self, served_revocations: dict[str, Any] | None) -> CertificatePolicy:
        """The policy for this round, after keeping the served list if it is newer; `ProtocolViolation`
        (`bad_revocations`) for a list the operator did not sign or older than the one kept."""
        kept = self.kept_revocations()
        if served_revocations is not None:
            try:
                served = verify_revocations(served_revocations, self.operator_keys, kept)
            except DeviceCertificateError as error:
                raise ProtocolViolation(f"the server's device revocation list is refused ({error.reason}): {error}",
                                        reason="bad_revocations") from None

            def newest(state: dict[str, Any]) -> dict[str, Any]:
                current = DeviceRevocations.from_state(state.get(REVOCATIONS_STATE))
                return {REVOCATIONS_STATE: (served if served.version > current.version else current).to_state()}

            kept = DeviceRevocations.from_state(change_state(self.state_path, newest)[REVOCATIONS_STATE])
        return CertificatePolicy(self.operator_keys, kept.revoked_keys)
