"""A device's pinned card-signing keys and the newest version it accepted per model family.

With keys pinned, the SDK checks a card before its model is downloaded or loaded: a trusted key signed
exactly this card, the signature has not expired, and the version is not below the newest one this device
already accepted for the family (no rollback). The versions persist in a small JSON state file (key
`accepted_versions`, as the Java SDK's `StateStore`), so restarting the app cannot roll the device back.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from fedzoo.cards import ModelCard
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
        state = self._state()
        versions = state.setdefault("accepted_versions", {})
        versions[card.family] = max(card.version, versions.get(card.family, 0))
        write_private_json(self.state_path, state)

    def _state(self) -> dict:
        if not self.state_path.is_file():
            return {}
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as error:
            raise InvalidInputError(f"client state {self.state_path} is unreadable ({error}); refusing to guess "
                                    "which versions were accepted", field="state") from None
        if not isinstance(state, dict):
            raise InvalidInputError(f"client state {self.state_path} is not a JSON object", field="state")
        return state


def write_private_json(path: Path, data: dict) -> None:
    """Replace `path` atomically with `data`, readable by the owner only (it may hold the device token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as stream:
            stream.write(json.dumps(data, indent=2))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
