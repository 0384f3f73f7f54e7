"""A device's pinned card-signing keys and the newest version it accepted per model line.

With keys pinned, the SDK checks a card before its model is downloaded or loaded: a trusted key signed
exactly this card, the signature has not expired, and the version is not below the newest one this device
already accepted for the card's line (no rollback). Lines, not families: one family holds many lines (every
subnet of a NAS zoo, every compressed child), each with its own versions. The versions persist in the device's
state file (key `accepted_line_versions`, as the Java SDK's `StateStore`), which lives in a durable state
directory, not the cache, so neither restarting the app nor clearing its cache can roll the device back; they
are raised by a compare-and-swap under the state file's lock, so two processes cannot both pass the check and
then write an older version over a newer one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedzoo.cards import ModelCard
from fedzoo.clients.device_state import change_state, load_state
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.signing import TrustedKeys, verify_card

ACCEPTED_VERSIONS_KEY = "accepted_line_versions"


class CardVerifier:
    """Verifies cards against pinned keys and remembers the versions accepted (the Java SDK's CardVerifier
    plus the part of its StateStore that keeps `accepted_line_versions`)."""

    def __init__(self, trusted_keys: TrustedKeys, state_path: Path) -> None:
        self.trusted_keys = trusted_keys
        self.state_path = Path(state_path)

    def accepted_version(self, line_id: str) -> int | None:
        """The newest version of model line `line_id` this device accepted, or None."""
        version = _versions(self._state(), self.state_path).get(line_id)
        return version if isinstance(version, int) else None

    def verify(self, card: ModelCard) -> None:
        """Raise `CardSignatureError` (with its `reason`) unless the card may be used on this device."""
        verify_card(card, self.trusted_keys, last_accepted_version=self.accepted_version(card.line_id))

    def accept(self, card: ModelCard) -> None:
        """Record that this card's version was accepted: a compare-and-swap that never lowers the recorded
        version, and raises `CardSignatureError` (rollback) when another process accepted a newer one since
        `verify`."""
        def raised(state: dict[str, Any]) -> dict[str, Any]:
            versions = dict(_versions(state, self.state_path))
            recorded = versions.get(card.line_id, 0)
            if card.version < recorded:
                raise CardSignatureError(
                    f"card {card.id!r}: version {card.version} of line {card.line_id!r} is older than version "
                    f"{recorded}, accepted meanwhile (rollback refused)", reason="rollback")
            versions[card.line_id] = card.version
            return {ACCEPTED_VERSIONS_KEY: versions}

        change_state(self.state_path, raised)

    def _state(self) -> dict[str, Any]:
        return load_state(self.state_path)  # an unreadable file raises: refuse to guess which versions were accepted


def _versions(state: Any, path: Path) -> dict[str, Any]:
    if not isinstance(state, dict) or not isinstance(state.get(ACCEPTED_VERSIONS_KEY, {}), dict):
        raise InvalidInputError(f"client state {path} is not a JSON object with {ACCEPTED_VERSIONS_KEY}",
                                field="state")
    return state.get(ACCEPTED_VERSIONS_KEY, {})
