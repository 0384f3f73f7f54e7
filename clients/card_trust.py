"""A device's pinned card-signing keys and the newest version it accepted per model family.

With keys pinned, the SDK checks a card before its model is downloaded or loaded: a trusted key signed
exactly this card, the signature has not expired, and the version is not below the newest one this device
already accepted for the family (no rollback). The versions persist in a small JSON state file (key
`accepted_versions`, as the Java SDK's `StateStore`), so restarting the app cannot roll the device back.
"""

from __future__ import annotations

from pathlib import Path

from fedzoo.cards import ModelCard
from fedzoo.clients.device_state import load_state, update_state
from fedzoo.errors import InvalidInputError
from fedzoo.signing import TrustedKeys, verify_card


class CardVerifier:
    """Verifies cards against pinned keys and remembers the versions accepted (the Java SDK's CardVerifier
    plus the part of its StateStore that keeps `accepted_versions`)."""

    def __init__(self, trusted_keys: TrustedKeys, state_path: Path) -> None:
        self.trusted_keys = trusted_keys
        self.state_path = Path(state_path)

    def accepted_version(self, family: str) -> int | None:
        """The newest version of `family` this device accepted, or None."""
        version = self._state().get("accepted_versions", {}).get(family)
        return version if isinstance(version, int) else None

    def verify(self, card: ModelCard) -> None:
        """Raise `CardSignatureError` (with its `reason`) unless the card may be used on this device."""
        verify_card(card, self.trusted_keys, last_accepted_version=self.accepted_version(card.family))

    def accept(self, card: ModelCard) -> None:
        """Record that this card's version was accepted (never lowers the recorded version)."""
        versions = dict(self._state().get("accepted_versions", {}))
        versions[card.family] = max(card.version, versions.get(card.family, 0))
        update_state(self.state_path, {"accepted_versions": versions})

    def _state(self) -> dict:
        state = load_state(self.state_path)  # an unreadable file raises: refuse to guess which versions were accepted
        if not isinstance(state, dict):
            raise InvalidInputError(f"client state {self.state_path} is not a JSON object", field="state")
        return state
