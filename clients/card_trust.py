"""A device's pinned card-signing keys, the card it accepted per model line, and the revocation list it holds.

With keys pinned, the SDK checks a card before its model is downloaded or loaded: a trusted key signed
exactly this card, the signature has not expired, the version is not below the newest one this device
already accepted for the card's line (no rollback), at that same version it is the very card accepted then
(one card per line and version: two cards both calling themselves "version 2" of a line are not both
accepted), and the operator's revocation list the device holds (`fedzoo.clients.held_revocations`) does not
revoke it. Lines, not families: one family holds many lines (every subnet of a NAS zoo, every compressed child),
each with its own versions.

All of it persists in the device's state file (keys `accepted_line_versions`, `accepted_line_cards` and
`revocation_list`, as the Java SDK's `StateStore`), which lives in a durable state directory, not the cache,
so neither restarting the app nor clearing its cache can roll the device back; every change is a
compare-and-swap under the state file's lock, so two processes cannot both pass the check and then write an
older version (or an older revocation list) over a newer one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedzoo.cards import ModelCard
from fedzoo.clients import held_revocations
from fedzoo.clients.device_state import change_state, load_state
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.signing import TrustedKeys, verify_card

ACCEPTED_VERSIONS_KEY = "accepted_line_versions"
ACCEPTED_CARDS_KEY = "accepted_line_cards"  # line -> the id of the card accepted at its recorded version


class CardVerifier:
    """Verifies cards against pinned keys and remembers what was accepted (the Java SDK's CardVerifier plus
    the part of its StateStore that keeps `accepted_line_versions` and `accepted_line_cards`)."""

    def __init__(self, trusted_keys: TrustedKeys, state_path: Path) -> None:
        self.trusted_keys = trusted_keys
        self.state_path = Path(state_path)

    def accepted_version(self, line_id: str) -> int | None:
        """The newest version of model line `line_id` this device accepted, or None."""
        return _recorded_version(_section(self._state(), ACCEPTED_VERSIONS_KEY, self.state_path), line_id,
                                 self.state_path)

    def verify(self, card: ModelCard) -> None:
        """Raise `CardSignatureError` (with its `reason`) unless the card may be used on this device."""
        state = self._state()
        verify_card(card, self.trusted_keys, last_accepted_version=self.accepted_version(card.line_id),
                    last_accepted_card_id=_section(state, ACCEPTED_CARDS_KEY, self.state_path).get(card.line_id))
        revocations = held_revocations.held(self.state_path)
        if revocations is not None:
            revocations.refuse_revoked(card)

    def accept(self, card: ModelCard) -> None:
        """Record that this card was accepted at its version: a compare-and-swap that never lowers the recorded
        version and never takes a second card at one version; `CardSignatureError` (rollback, version_reused)
        when another process accepted a newer version, or another card at this one, since `verify`."""
        def raised(state: dict[str, Any]) -> dict[str, Any]:
            versions = dict(_section(state, ACCEPTED_VERSIONS_KEY, self.state_path))
            cards = dict(_section(state, ACCEPTED_CARDS_KEY, self.state_path))
            recorded = _recorded_version(versions, card.line_id, self.state_path) or 0  # None: nothing accepted
            _refuse_out_of_order(card, recorded, cards.get(card.line_id) if recorded == card.version else None)
            versions[card.line_id], cards[card.line_id] = card.version, card.id
            return {ACCEPTED_VERSIONS_KEY: versions, ACCEPTED_CARDS_KEY: cards}

        change_state(self.state_path, raised)

    def _state(self) -> dict[str, Any]:
        state = load_state(self.state_path)  # an unreadable file raises: refuse to guess what was accepted
        if not isinstance(state, dict):
            raise InvalidInputError(f"client state {self.state_path} is not a JSON object", field="state")
        return state


def _refuse_out_of_order(card: ModelCard, recorded_version: int, recorded_card_id: str | None) -> None:
    """Refuse a card below the recorded version of its line (rollback), or another card than the recorded one
    at that version (version_reused)."""
    if card.version < recorded_version:
        raise CardSignatureError(
            f"card {card.id!r}: version {card.version} of line {card.line_id!r} is older than version "
            f"{recorded_version}, accepted meanwhile (rollback refused)", reason="rollback")
    if recorded_card_id is not None and recorded_card_id != card.id:
        raise CardSignatureError(
            f"card {card.id!r}: version {card.version} of line {card.line_id!r} was accepted meanwhile as card "
            f"{recorded_card_id!r}", reason="version_reused")


def _section(state: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    section = state.get(key, {})
    if not isinstance(section, dict):
        raise InvalidInputError(f"client state {path}: {key} is not a JSON object", field="state")
    return section


def _recorded_version(versions: dict[str, Any], line_id: str, path: Path) -> int | None:
    """The version recorded for `line_id`, or None when none is; a recorded value that is not a whole number of at
    least 1 (text, null, a fraction, true) is refused: read as "nothing accepted" it would turn the rollback check
    off for that line."""
    if line_id not in versions:
        return None
    version = versions[line_id]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInputError(f"client state {path}: the version accepted for line {line_id!r} is {version!r}, "
                                "not a whole number of at least 1", field="state")
    return version
