"""The one operator revocation list a device holds (`fedzoo.revocation`): cards it must not load and device keys
it must not accept as SecAgg+ neighbours, under one version counter.

The list lives in the device's state file (key `revocation_list`, the signed document as verified; Java:
`StateStore`). Both the card checks (`CardVerifier`) and the neighbour checks (`NeighbourTrust`) read it from
here, and a served list is kept only through `hold`, a compare-and-swap under the state file's lock: two
processes cannot write an older list over a newer one, and no list replaces the held one unless it verifies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedzoo.clients.device_state import change_state, load_state
from fedzoo.revocation import RevocationList, held_revocation_list, verify_revocation_list
from fedzoo.signing import TrustedKeys

REVOCATION_LIST_KEY = "revocation_list"


def held(state_path: Path) -> RevocationList | None:
    """The newest list this device verified, or None."""
    document = load_state(state_path).get(REVOCATION_LIST_KEY)
    return None if document is None else held_revocation_list(document)


def hold(state_path: Path, document: Any, operator_keys: TrustedKeys) -> RevocationList:
    """Verify a served list against `operator_keys` and keep it when it is newer than the held one;
    `CardSignatureError` for a list none of those keys signed (`unknown_key`, `bad_signature`), an older one
    (`rollback`) or a different one under the held version (`version_reused`)."""
    verified: list[RevocationList] = []

    def newer(state: dict[str, Any]) -> dict[str, Any]:
        document_held = state.get(REVOCATION_LIST_KEY)
        verified.append(verify_revocation_list(
            document, operator_keys, held=None if document_held is None else held_revocation_list(document_held)))
        return {REVOCATION_LIST_KEY: verified[-1].document}

    change_state(state_path, newer)
    return verified[-1]
