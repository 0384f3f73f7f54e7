"""The operator's privacy terms a device holds (`fedzoo.privacy_terms`): the newest version it verified, in
its state file (key `privacy_terms`, the signed document; Java: `StateStore`), kept only through `hold`, a
compare-and-swap under the state file's lock, so no older terms replace newer ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedzoo.clients.device_state import change_state, load_state
from fedzoo.privacy_terms import PrivacyTerms, held_privacy_terms, verify_privacy_terms
from fedzoo.signing import TrustedKeys

PRIVACY_TERMS_KEY = "privacy_terms"


def held(state_path: Path) -> PrivacyTerms | None:
    """The newest terms this device verified, or None."""
    document = load_state(state_path).get(PRIVACY_TERMS_KEY)
    return None if document is None else held_privacy_terms(document)


def hold(state_path: Path, document: Any, operator_keys: TrustedKeys) -> PrivacyTerms:
    """Verify served (or app-bundled) terms against `operator_keys` and keep them when newer than the held ones;
    `CardSignatureError` for terms none of those keys signed (`unknown_key`, `bad_signature`), older ones
    (`rollback`) or different ones under the held version (`version_reused`)."""
    verified: list[PrivacyTerms] = []

    def newer(state: dict[str, Any]) -> dict[str, Any]:
        document_held = state.get(PRIVACY_TERMS_KEY)
        verified.append(verify_privacy_terms(
            document, operator_keys, held=None if document_held is None else held_privacy_terms(document_held)))
        return {PRIVACY_TERMS_KEY: verified[-1].document}

    change_state(state_path, newer)
    return verified[-1]
