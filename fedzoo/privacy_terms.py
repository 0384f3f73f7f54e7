"""The operator's signed privacy terms: which model lines a device trains on only under distributed DP, and the
least noise multiplier it accepts there, so that DP holds against a lying server on every device by default.

The server decides each round's DP mode and noise multiplier z; without terms, a server that left the noise
request out of a task (the devices then add none) or lowered z could still publish a card claiming the
accountant's epsilon, and only a device whose owner opted in to a `NoisePolicy` could tell. The terms move that
word to the operator, whose keys devices already pin: the operator signs them offline (`fedzoo keys
sign-privacy-terms`), the server only checks, stores and serves them (`POST`/`GET /v1/privacy-terms`), and each
device verifies them against its operator keys, keeps the newest version (`fedzoo.clients.held_privacy_terms`;
Java `StateStore`) and applies them as its `NoisePolicy` on every covered line
(`fedzoo.dp.distributed.policy_for`).

The document is the operator's signed envelope (`fedzoo.signed_documents`) under its own purpose label
(`TERMS_DOMAIN`); the payload is JSON:

    {"purpose": "privacy_terms", "contract": 1, "version": N, "issued_at": "...Z", "key_id": "...",
     "lines": {"<line id>" or "*": {"mode": "distributed", "minimum_noise_multiplier": z_min}}}

"*" covers every line the terms do not name. `version` only grows: an older version (a server replaying terms
that lacked a line) or a different document under the held version is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fedzoo.cards import IDENTIFIER_PATTERN
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.signed_documents import envelope, open_document, read_held, refuse_older, sign_document
from fedzoo.signing import TIMESTAMP_FORMAT, CardSigningKey, TrustedKeys

TERMS_DOMAIN = b"fedzoo-privacy-terms-v1\n"
"""Prefixed to the payload before signing: no card, certificate or revocation list signature passes for terms."""
PURPOSE = "privacy_terms"
WHAT = "privacy terms"
CONTRACT = 1
EVERY_LINE = "*"
MODES = ("distributed",)  # contract 1: the device adds its own share of the noise under SecAgg+
MAX_LINES = 10_000


@dataclass(frozen=True)
class LineTerms:
    """What the operator requires of a DP round on one line (or on every line: `EVERY_LINE`)."""

    mode: str
    minimum_noise_multiplier: float


@dataclass(frozen=True)
class PrivacyTerms:
    """Verified terms: their version, and the terms per line."""

    version: int
    issued_at: str
    lines: dict[str, LineTerms]
    document: dict[str, Any]  # the signed document, as stored and served

    def for_line(self, line_id: str) -> LineTerms | None:
        """The terms of `line_id`: its own, else the fleet's (`EVERY_LINE`), else None (the line is not covered)."""
        return self.lines.get(line_id, self.lines.get(EVERY_LINE))


def sign_privacy_terms(key: CardSigningKey, version: int, lines: dict[str, dict[str, Any]],
                       now: datetime | None = None) -> dict[str, Any]:
    """The signed document of the terms (what `fedzoo keys sign-privacy-terms` writes); each version names every
    line still covered, since it replaces the one before."""
    issued_at = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(TIMESTAMP_FORMAT)
    payload = {"purpose": PURPOSE, "contract": CONTRACT, "version": version, "issued_at": issued_at,
               "key_id": key.key_id, "lines": lines}
    _check_payload(payload)
    return sign_document(key, TERMS_DOMAIN, payload)


def verify_privacy_terms(document: Any, trusted: TrustedKeys | None, held: PrivacyTerms | None = None
                         ) -> PrivacyTerms:
    """The terms in `document` once a key of `trusted` (the operator keys) is seen to have signed them;
    `CardSignatureError` (`unknown_key`, `bad_signature`, `field_mismatch`, `rollback`: older than `held`,
    `version_reused`) otherwise. `trusted` None checks only the shape (a server given no operator keys)."""
    terms = _terms(document, open_document(document, trusted, TERMS_DOMAIN, WHAT))
    refuse_older(terms.version, terms.document, held.version if held is not None else None,
                 held.document if held is not None else None, WHAT)
    return terms


def held_privacy_terms(document: dict[str, Any]) -> PrivacyTerms:
    """Terms a device stored after verifying them, read without checking the signature again."""
    return _terms(document, read_held(document))


def _terms(document: dict[str, Any], payload: Any) -> PrivacyTerms:
    try:
        _check_payload(payload)
    except InvalidInputError as error:
        raise CardSignatureError(f"the signed privacy terms are malformed: {error}", reason="field_mismatch") from None
    if payload["key_id"] != document["key_id"]:
        raise CardSignatureError("the privacy terms' key_id is not the signed one", reason="field_mismatch")
    lines = {line: LineTerms(terms["mode"], float(terms["minimum_noise_multiplier"]))
             for line, terms in payload["lines"].items()}
    return PrivacyTerms(payload["version"], payload["issued_at"], lines, envelope(document))


def _check_payload(payload: Any) -> None:
    """The payload's shape; InvalidInputError naming the first bad field."""
    if not isinstance(payload, dict) or payload.get("purpose") != PURPOSE or type(payload.get("contract")) is not int \
            or payload["contract"] != CONTRACT:
        raise InvalidInputError(f"the payload is not contract-{CONTRACT} {PURPOSE}", field="purpose")
    version = payload.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInputError(f"version must be a whole number from 1, got {version!r}", field="version")
    if not isinstance(payload.get("issued_at"), str) or not isinstance(payload.get("key_id"), str):
        raise InvalidInputError("issued_at and key_id must be strings", field="issued_at")
    lines = payload.get("lines")
    if not isinstance(lines, dict) or not 1 <= len(lines) <= MAX_LINES:
        raise InvalidInputError(f"lines must be an object of 1 to {MAX_LINES} lines", field="lines")
    for line, terms in lines.items():
        if line != EVERY_LINE and not re.fullmatch(IDENTIFIER_PATTERN, line):
            raise InvalidInputError(f"lines: {line[:80]!r} is neither a line id nor {EVERY_LINE!r}", field="lines")
        if not isinstance(terms, dict) or set(terms) != {"mode", "minimum_noise_multiplier"}:
            raise InvalidInputError(f'lines.{line} must be {{"mode", "minimum_noise_multiplier"}}',
                                    field=f"lines.{line}")
        if terms["mode"] not in MODES:
            raise InvalidInputError(f"lines.{line}.mode must be one of {MODES}, got {terms['mode']!r}",
                                    field=f"lines.{line}.mode")
        floor = terms["minimum_noise_multiplier"]
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor) or floor <= 0:
            raise InvalidInputError(f"lines.{line}.minimum_noise_multiplier must be a positive number, got {floor!r}",
                                    field=f"lines.{line}.minimum_noise_multiplier")
