"""A device's pinned operator key set for SecAgg+ neighbours, checked against the one revocation list it holds.

The operator's key set (`fedzoo keys export-public`, NOT the fleet set `GET /v1/keys`, which holds the server's own
key) is what neighbours' certificates and the revocation list must verify against. Before each SecAgg+ round the
device reads the operator's signed revocation list (`GET /v1/revocations`, one request) and keeps it when it is
newer than the one it holds (`fedzoo.clients.held_revocations`: the same list, state key and version counter as
the card checks; Java `StateStore`). An older list, another list under the held version, or one no operator key
signed is refused; a server that withholds a newer list still faces every key of the list the device holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedzoo.clients import held_revocations
from fedzoo.device_certificates import CertificatePolicy
from fedzoo.errors import CardSignatureError
from fedzoo.revocation import RevocationList
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.signing import TrustedKeys


class NeighbourTrust:
    """The operator keys a device checks neighbours' certificates against, and the revocation list it holds."""

    def __init__(self, operator_keys: TrustedKeys, state_path: Path) -> None:
        self.operator_keys = operator_keys
        self.state_path = Path(state_path)

    def held_revocations(self) -> RevocationList | None:
        """The newest revocation list this device verified, or None."""
        return held_revocations.held(self.state_path)

    def policy(self, served_revocations: dict[str, Any] | None) -> CertificatePolicy:
        """The policy for this round, after keeping the served list if it is newer (None: the server has none);
        `ProtocolViolation` (`bad_revocations`) for a list no operator key signed, an older one than held, or
        another list under the held version."""
        held = self.held_revocations()
        if served_revocations is not None:
            try:
                held = held_revocations.hold(self.state_path, served_revocations, self.operator_keys)
            except CardSignatureError as error:
                raise ProtocolViolation(f"the server's revocation list is refused ({error.reason}): {error}",
                                        reason="bad_revocations") from None
        return CertificatePolicy(self.operator_keys,
                                 held.device_key_fingerprints if held is not None else frozenset())
