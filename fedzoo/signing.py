"""Ed25519 signatures on model cards, so that a device trusts a model by its fleet's keys, not by TLS alone.

Contract 2 signs the whole card: the payload is `{"contract": 2, "card": <every field but signature and
unsigned>, "expires_at", "key_id"}`. Whatever a device acts on (normalisation, labels, precision, lineage,
the privacy claim in `details`, blob digests) is therefore signed, and a field the signer did not sign makes
the card fail (`field_mismatch`); the only fields outside are `unsigned`, the server's measurements that change
after publication, which no device acts on. The card carries the signed bytes themselves (base64, as DSSE
envelopes do): a verifier checks the signature over exactly those bytes, then parses them and requires every
field of the card to equal the signed one. No canonical re-encoding has to agree between the signer and a
verifier in another language; the Java SDK reads the same test vectors (`tests/vectors/card_signatures.json`).

A verifier pins a set of public keys by key id (the first 16 hex digits of the sha256 of the raw 32-byte
public key), so keys can be rotated by adding a new id before retiring the old one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from pydantic import ValidationError

from fedzoo.cards import CardSignature, ModelCard
from fedzoo.errors import CardSignatureError, InvalidInputError

SIGNATURE_CONTRACT = 2
SIGNATURE_DOMAIN = b"fedzoo-card-v2\n"
"""Prefixed to the payload before signing, so a card signature can never be replayed as another message, nor
a signature of contract 1 (which covered only identity and blob digests) pass for one of contract 2."""

DEFAULT_CARD_LIFETIME = timedelta(days=365)
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def key_id_of(public_key_raw: bytes) -> str:
    """The id a key set files a public key under: 16 hex digits of the sha256 of its 32 raw bytes."""
    return hashlib.sha256(public_key_raw).hexdigest()[:16]


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True)
class CardSigningKey:
    """A publisher's private key; kept by the operator (`fedzoo keys`) or the server, never sent anywhere."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> CardSigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> CardSigningKey:
        """The key whose 32-byte private seed is `seed` (test vectors use fixed seeds)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public_key_raw(self) -> bytes:
        return _raw_public(self.private_key.public_key())

    @property
    def key_id(self) -> str:
        return key_id_of(self.public_key_raw)

    def save(self, path: Path) -> None:
        """Write the key as PKCS#8 PEM readable by its owner only (mode 0600, set at creation: never readable
        by others, not even for a moment). An existing file is replaced."""
        pem = self.private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)

    @classmethod
    def load(cls, path: Path) -> CardSigningKey:
        """Read a PKCS#8 PEM ed25519 private key (what `save` and `openssl genpkey -algorithm ed25519` write)."""
        try:
            private_key = load_pem_private_key(Path(path).read_bytes(), password=None)
        except OSError as error:
            raise InvalidInputError(f"cannot read the signing key {path}: {error.strerror}", field="signing_key") from None
        except (TypeError, ValueError):
            raise InvalidInputError(f"{path} is not an unencrypted PEM private key", field="signing_key") from None
        if not isinstance(private_key, Ed25519PrivateKey):
            raise InvalidInputError(f"{path} holds a {type(private_key).__name__}; card keys are ed25519",
                                    field="signing_key")
        return cls(private_key)


class TrustedKeys:
    """The public keys a device or server accepts card signatures from, by key id."""

    def __init__(self, public_keys_raw: list[bytes]) -> None:
        self._keys = {key_id_of(raw): Ed25519PublicKey.from_public_bytes(raw) for raw in public_keys_raw}

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def get(self, key_id: str) -> Ed25519PublicKey | None:
        return self._keys.get(key_id)

    def public_keys_raw(self) -> list[bytes]:
        """The 32-byte public keys in key-id order, e.g. to merge two key sets."""
        return [_raw_public(self._keys[key_id]) for key_id in self.key_ids]

    def to_json(self) -> dict[str, Any]:
        """`{"keys": [{"key_id", "algorithm", "public_key"}]}`, the form SDKs pin and servers publish."""
        return {
            "keys": [
                {"key_id": key_id, "algorithm": "ed25519", "public_key": _b64(_raw_public(self._keys[key_id]))}
                for key_id in self.key_ids
            ]
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrustedKeys:
        """Parse a key set; a listed key id must match its key, so a typo cannot pin the wrong key."""
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise InvalidInputError('a key set is {"keys": [...]}', field="keys")
        raws = []
        for index, entry in enumerate(data["keys"]):
            raw = _unb64(entry.get("public_key") if isinstance(entry, dict) else None, f"keys[{index}].public_key")
            if len(raw) != 32:
                raise InvalidInputError(f"keys[{index}]: an ed25519 public key has 32 bytes, got {len(raw)}",
                                        field=f"keys[{index}].public_key")
            if entry.get("key_id") not in (None, key_id_of(raw)):
                raise InvalidInputError(f"keys[{index}]: key_id {entry.get('key_id')!r} is not this key's "
                                        f"({key_id_of(raw)})", field=f"keys[{index}].key_id")
            raws.append(raw)
        return cls(raws)

    @classmethod
    def load(cls, path: Path) -> TrustedKeys:
        return cls.from_json(_read_json(path))


UNSIGNED_FIELDS = ("signature", "unsigned")
"""The only parts of a card outside its signature: the signature itself, and the server's measurements that
change after publication (`ModelCard.unsigned`), which no device acts on."""


def signed_card_fields(card: ModelCard) -> dict[str, Any]:
    """The card as the signature covers it: every field but `UNSIGNED_FIELDS`, as JSON values."""
    return card.model_dump(mode="json", exclude=set(UNSIGNED_FIELDS))


def sign_card(
    card: ModelCard, key: CardSigningKey, lifetime: timedelta = DEFAULT_CARD_LIFETIME, now: datetime | None = None
) -> ModelCard:
    """A copy of `card` signed whole by `key`, valid for `lifetime` from `now`."""
    now = now or datetime.now(timezone.utc)
    fields = {"contract": SIGNATURE_CONTRACT, "card": signed_card_fields(card),
              "expires_at": _timestamp(now + lifetime), "key_id": key.key_id}
    payload = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    signature = key.private_key.sign(SIGNATURE_DOMAIN + payload)
    block = CardSignature(key_id=key.key_id, payload=_b64(payload), signature=_b64(signature))
    return card.model_copy(update={"signature": block})


def verify_card(
    card: ModelCard,
    trusted: TrustedKeys,
    now: datetime | None = None,
    last_accepted_version: int | None = None,
    last_accepted_card_id: str | None = None,
) -> None:
    """Raise `CardSignatureError` unless a trusted key signed this very card (every field but
    `UNSIGNED_FIELDS`), it has not expired, its version is not below `last_accepted_version`, the newest
    this device accepted for the card's line (no rollback), and at that very version it is the card accepted
    then, `last_accepted_card_id` (one card per line and version)."""
    block = card.signature
    if block is None:
        raise CardSignatureError(f"card {card.id!r} is not signed", reason="unsigned")
    public_key = trusted.get(block.key_id)
    if public_key is None:
        raise CardSignatureError(
            f"card {card.id!r} is signed by key {block.key_id}, which is not among the trusted keys "
            f"{trusted.key_ids}", reason="unknown_key")
    try:
        payload = base64.b64decode(block.payload, validate=True)
        public_key.verify(base64.b64decode(block.signature, validate=True), SIGNATURE_DOMAIN + payload)
        fields = json.loads(payload)
    except (InvalidSignature, ValueError):
        raise CardSignatureError(
            f"card {card.id!r}: the signature does not verify (a card signed under an older contract than "
            f"{SIGNATURE_DOMAIN!r} needs `fedzoo zoo sign` again)", reason="bad_signature") from None
    if (not isinstance(fields, dict) or fields.get("contract") != SIGNATURE_CONTRACT
            or not isinstance(fields.get("expires_at"), str) or not isinstance(fields.get("card"), dict)
            or fields.get("key_id") != block.key_id):
        raise CardSignatureError(f"card {card.id!r}: the signed payload is not a contract-{SIGNATURE_CONTRACT} "
                                 "card payload", reason="field_mismatch")
    expires_at = _parse_timestamp(fields["expires_at"])
    differing = _differing_fields(fields["card"], card)
    if differing:
        raise CardSignatureError(f"card {card.id!r}: fields differ from the signed card: {differing}",
                                 reason="field_mismatch")
    now = now or datetime.now(timezone.utc)
    if now >= expires_at:
        raise CardSignatureError(f"card {card.id!r}: the signature expired at {fields['expires_at']}",
                                 reason="expired")
    if last_accepted_version is not None and card.version < last_accepted_version:
        raise CardSignatureError(
            f"card {card.id!r}: version {card.version} of line {card.line_id!r} is older than version "
            f"{last_accepted_version}, already accepted (rollback refused)", reason="rollback")
    if (last_accepted_version is not None and last_accepted_card_id is not None
            and card.version == last_accepted_version and card.id != last_accepted_card_id):
        raise CardSignatureError(
            f"card {card.id!r}: version {card.version} of line {card.line_id!r} was already accepted as card "
            f"{last_accepted_card_id!r}; a second card for one line and version is refused", reason="version_reused")


def _differing_fields(signed: dict[str, Any], card: ModelCard) -> list[str]:
    """The card's fields whose value is not the signed one; a field the signer did not sign counts too.
    Both sides are compared as validated cards, so a timestamp's spelling cannot make a difference."""
    if set(UNSIGNED_FIELDS) & set(signed):
        return sorted(set(UNSIGNED_FIELDS) & set(signed))
    try:
        signed_card = ModelCard.model_validate(signed)
    except ValidationError as error:
        return sorted({str(problem["loc"][0]) for problem in error.errors() if problem["loc"]} or {"card"})
    unsigned_by_signer = set(card.model_fields_set) - set(signed) - set(UNSIGNED_FIELDS)
    differing = {name for name in ModelCard.model_fields if name not in UNSIGNED_FIELDS
                 and getattr(signed_card, name) != getattr(card, name)}
    return sorted(differing | unsigned_by_signer)


def _timestamp(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime(TIMESTAMP_FORMAT)


def _parse_timestamp(text: str) -> datetime:
    try:
        return datetime.strptime(text, TIMESTAMP_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        raise CardSignatureError(f"signed timestamp {text!r} is not {TIMESTAMP_FORMAT}", reason="field_mismatch")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{field} must be base64, got {text!r}", field=field) from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise InvalidInputError(f"cannot read {path}: {error}") from None
