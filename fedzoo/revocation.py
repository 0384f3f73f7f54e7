"""The operator's one signed revocation list: cards (by id or model sha256) no device may load any more, and
device signing keys (by fingerprint) no device may accept as a SecAgg+ neighbour any more.

A signed card or a device certificate stays valid until it expires; one found bad before then is revoked by
listing it here. The operator signs the list offline with the key that signs cards and certificates (`fedzoo keys
revoke`, or `fedzoo devices revoke-keys` to add devices' keys to the served list); the server only checks, stores
and serves it (`POST`/`GET /v1/revocations`), and devices verify it against the operator keys they pin
(`operator_keys`; a device that pins only card keys verifies it against those):

    {"key_id": "<16 hex>", "algorithm": "ed25519", "payload": "<base64>", "signature": "<base64>"}

As with cards, the signed bytes travel inside the document (no canonical re-encoding has to agree between
languages) and the signature covers `REVOCATION_DOMAIN + payload`, a purpose label no card signature shares, so
neither can pass for the other. The payload is JSON:

    {"purpose": "revocation_list", "contract": 1, "version": N, "issued_at": "...Z", "key_id": "...",
     "revoked_cards": {"ids": [...], "sha256s": [...]}, "revoked_device_keys": [<hex sha256 of a raw key>, ...]}

`version` only grows, one counter for both sections: a device keeps the newest list it verified (its state file,
key `revocation_list`; Java: `StateStore`), refuses an older one (a server cannot roll a revocation back by
serving a stale list) and a different list under the version it holds. A server can withhold a newer list; the
device then still refuses everything the list it holds revokes (docs/privacy.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fedzoo.cards import IDENTIFIER_PATTERN, SHA256_PATTERN, ModelCard
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.signed_documents import envelope, open_document, read_held, refuse_older, sign_document
from fedzoo.signing import TIMESTAMP_FORMAT, CardSigningKey, TrustedKeys

REVOCATION_DOMAIN = b"fedzoo-revocation-list-v1\n"
"""Prefixed to the payload before signing: the purpose label that keeps a revocation list's signature from ever
passing for a card's (`fedzoo.signing.SIGNATURE_DOMAIN`), or a card's for a list's."""
PURPOSE = "revocation_list"
WHAT = "revocation list"
CONTRACT = 1
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class RevocationList:
    """A verified list: its version, and what it revokes."""

    version: int
    issued_at: str
    card_ids: frozenset[str]
    card_sha256s: frozenset[str]
    device_key_fingerprints: frozenset[str]  # `fedzoo.device_certificates.key_fingerprint` of each revoked key
    document: dict[str, Any]  # the signed document, as stored and served

    @classmethod
    def nothing_revoked(cls) -> RevocationList:
        """Where no list was published yet: version 0, nothing revoked (the next list is version 1)."""
        return cls(0, "", frozenset(), frozenset(), frozenset(), {})

    def refuse_revoked(self, card: ModelCard) -> None:
        """Raise `CardSignatureError` (reason `revoked`) when this list revokes the card or its model bytes."""
        if card.id in self.card_ids or card.sha256 in self.card_sha256s:
            which = "id" if card.id in self.card_ids else f"model sha256 {card.sha256}"
            raise CardSignatureError(f"card {card.id!r} is revoked by the operator's revocation list version "
                                     f"{self.version} (by its {which})", reason="revoked")


def sign_revocation_list(key: CardSigningKey, version: int, card_ids: list[str] = (), card_sha256s: list[str] = (),
                         device_key_fingerprints: list[str] = (), now: datetime | None = None) -> dict[str, Any]:
    """The signed document of a revocation list (what `fedzoo keys revoke` writes); each list names everything
    still revoked, since it replaces the one before."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInputError(f"a revocation list's version is a whole number from 1, got {version!r}",
                                field="version")
    issued_at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(TIMESTAMP_FORMAT)
    payload = {"purpose": PURPOSE, "contract": CONTRACT, "version": version, "issued_at": issued_at,
               "key_id": key.key_id,
               "revoked_cards": {"ids": sorted(set(card_ids)), "sha256s": sorted(set(card_sha256s))},
               "revoked_device_keys": sorted(set(device_key_fingerprints))}
    _check_payload(payload)
    return sign_document(key, REVOCATION_DOMAIN, payload)


def verify_revocation_list(document: Any, trusted: TrustedKeys | None, held: RevocationList | None = None
                           ) -> RevocationList:
    """The list in `document` once a key of `trusted` (the operator keys) is seen to have signed it;
    `CardSignatureError` with a reason (`unknown_key`, `bad_signature`, `field_mismatch`, `rollback`: older than
    the `held` list, or `version_reused`: another list under the held version) otherwise. `trusted` None reads
    the list without checking its signature: only for a server that was not given the operator keys."""
    listed = _listed(document, open_document(document, trusted, REVOCATION_DOMAIN, WHAT))
    refuse_older(listed.version, listed.document, held.version if held is not None else None,
                 held.document if held is not None else None, WHAT)
    return listed


def held_revocation_list(document: dict[str, Any]) -> RevocationList:
    """The list a device stored after verifying it (its state file, as trusted as the versions it accepted),
    read without checking the signature again: a pinned key retired since must not make the device forget it."""
    return _listed(document, read_held(document))


def _listed(document: dict[str, Any], payload: Any) -> RevocationList:
    try:
        _check_payload(payload)
    except InvalidInputError as error:
        raise CardSignatureError(f"the signed revocation list is malformed: {error}", reason="field_mismatch") from None
    if payload["key_id"] != document["key_id"]:
        raise CardSignatureError("the revocation list's key_id is not the signed one", reason="field_mismatch")
    return RevocationList(payload["version"], payload["issued_at"], frozenset(payload["revoked_cards"]["ids"]),
                          frozenset(payload["revoked_cards"]["sha256s"]), frozenset(payload["revoked_device_keys"]),
                          envelope(document))


def _check_payload(payload: Any) -> None:
    """The payload's shape; InvalidInputError naming the first bad field."""
    if not isinstance(payload, dict) or payload.get("purpose") != PURPOSE or type(payload.get("contract")) is not int \
            or payload["contract"] != CONTRACT:
        raise InvalidInputError(f"the payload is not a contract-{CONTRACT} {PURPOSE}", field="purpose")
    version = payload.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInputError(f"version must be a whole number from 1, got {version!r}", field="version")
    if not isinstance(payload.get("issued_at"), str) or not isinstance(payload.get("key_id"), str):
        raise InvalidInputError("issued_at and key_id must be strings", field="issued_at")
    cards = payload.get("revoked_cards")
    if not isinstance(cards, dict) or set(cards) != {"ids", "sha256s"}:
        raise InvalidInputError('revoked_cards must be {"ids": [...], "sha256s": [...]}', field="revoked_cards")
    for field, values, pattern in (("revoked_cards.ids", cards["ids"], IDENTIFIER_PATTERN),
                                   ("revoked_cards.sha256s", cards["sha256s"], SHA256_PATTERN),
                                   ("revoked_device_keys", payload.get("revoked_device_keys"), SHA256_PATTERN)):
        if not isinstance(values, list) or len(values) > MAX_ENTRIES:
            raise InvalidInputError(f"{field} must be a list of at most {MAX_ENTRIES}", field=field)
        for value in values:
            if not isinstance(value, str) or not re.fullmatch(pattern, value):
                raise InvalidInputError(f"{field}: {str(value)[:80]!r} does not match {pattern}", field=field)
