"""The envelope of a document the operator signs offline and devices verify against the operator keys they pin
(the revocation list, `fedzoo.revocation`; the privacy terms, `fedzoo.privacy_terms`):

    {"key_id": "<16 hex>", "algorithm": "ed25519", "payload": "<base64>", "signature": "<base64>"}

The signed bytes travel inside the document (no canonical re-encoding has to agree between languages) and the
signature covers `domain + payload`, a purpose label per kind of document, so no signature passes for another
kind's. Each kind's payload carries a `version` that only grows: a device keeps the newest it verified and
refuses an older one (`rollback`) or a different one under the held version (`version_reused`).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.exceptions import InvalidSignature

from fedzoo.errors import CardSignatureError
from fedzoo.signing import CardSigningKey, TrustedKeys

ENVELOPE = ("key_id", "algorithm", "payload", "signature")


def sign_document(key: CardSigningKey, domain: bytes, payload: dict[str, Any]) -> dict[str, Any]:
    """The signed document of `payload` (compact, sorted JSON) under the purpose label `domain`."""
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return {"key_id": key.key_id, "algorithm": "ed25519", "payload": base64.b64encode(raw).decode(),
            "signature": base64.b64encode(key.private_key.sign(domain + raw)).decode()}


def open_document(document: Any, trusted: TrustedKeys | None, domain: bytes, what: str) -> Any:
    """The decoded payload once a key of `trusted` is seen to have signed `domain + payload`; `CardSignatureError`
    (`field_mismatch`, `unknown_key`, `bad_signature`) otherwise. `trusted` None reads it without checking the
    signature: only for a server that was not given the operator keys."""
    if not isinstance(document, dict) or not all(isinstance(document.get(name), str)
                                                  for name in ("key_id", "payload", "signature")):
        raise CardSignatureError(f'a {what} is {{"key_id", "algorithm", "payload", "signature"}}',
                                 reason="field_mismatch")
    public_key = None if trusted is None else trusted.get(document["key_id"])
    if trusted is not None and public_key is None:
        raise CardSignatureError(f"the {what} is signed by key {document['key_id']}, which is not among the "
                                 f"operator keys {trusted.key_ids}", reason="unknown_key")
    try:
        raw = base64.b64decode(document["payload"], validate=True)
        if public_key is not None:
            public_key.verify(base64.b64decode(document["signature"], validate=True), domain + raw)
        return json.loads(raw)
    except (InvalidSignature, ValueError):
        raise CardSignatureError(f"the {what}'s signature does not verify", reason="bad_signature") from None


def read_held(document: dict[str, Any]) -> Any:
    """The payload of a document a device stored after verifying it, without checking the signature again: a
    pinned key retired since must not make the device forget it."""
    return json.loads(base64.b64decode(document["payload"]))


def envelope(document: dict[str, Any]) -> dict[str, Any]:
    """The document as stored and served: its envelope fields only."""
    return {name: document[name] for name in ENVELOPE if name in document}


def refuse_older(version: int, document: dict[str, Any], held_version: int | None,
                 held_document: dict[str, Any] | None, what: str) -> None:
    """`CardSignatureError` `rollback` for a version older than the held one, `version_reused` for a different
    document under the held version."""
    if held_version is None or held_document is None:
        return
    if version < held_version:
        raise CardSignatureError(f"{what} version {version} is older than version {held_version}, already held "
                                 "(rollback refused)", reason="rollback")
    if version == held_version and document["payload"] != held_document["payload"]:
        raise CardSignatureError(f"a different {what} under version {held_version}, already held",
                                 reason="version_reused")
