"""The server's card-signing keys: its own key, which signs the versions federated rounds publish, and the
operator keys it trusts for cards published by an admin or imported from a zoo (docs/signed-models.md).

The server's key comes from `FEDZOO_SERVER_SIGNING_KEY` (a PEM path) or is generated once in the data
directory. Every gunicorn worker loads it at start; the first to find none creates it, the others read
that one (`os.link` refuses to replace a file, so two workers can never end up with different keys).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedzoo.cards import ModelCard
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.server.config import ServerConfig
from fedzoo.server.errors import ValidationFailed
from fedzoo.signing import CardSigningKey, TrustedKeys, verify_card

SERVER_KEY_FILE = "server-signing-key.pem"


@dataclass(frozen=True)
class FleetKeys:
    """What this server signs with, and which signatures it accepts (`trusted`: the set `GET /v1/keys` publishes;
    `operator_keys`: the operator's own, `FEDZOO_TRUSTED_KEYS`, the only keys for certificates and revocation
    lists; None when not given)."""

    server_key: CardSigningKey
    trusted: TrustedKeys
    require_signed_cards: bool
    operator_keys: TrustedKeys | None

    @classmethod
    def from_config(cls, config: ServerConfig) -> FleetKeys:
        server_key = (CardSigningKey.load(config.signing_key_path) if config.signing_key_path is not None
                      else load_or_create_key(config.data_dir / SERVER_KEY_FILE))
        operator_keys = TrustedKeys.load(config.trusted_keys_path) if config.trusted_keys_path else None
        operator_raw = operator_keys.public_keys_raw() if operator_keys is not None else []
        return cls(server_key, TrustedKeys([server_key.public_key_raw, *operator_raw]), config.require_signed_cards,
                   operator_keys)

    def check_publishable(self, card: ModelCard) -> None:
        """Refuse (422, field `signature`) a signed card no trusted key verifies, and an unsigned one when
        signatures are required. A refused card is never stored."""
        if card.signature is None and not self.require_signed_cards:
            return
        try:
            verify_card(card, self.trusted)
        except CardSignatureError as error:
            hint = (" (FEDZOO_REQUIRE_SIGNED_CARDS is on: sign it with `fedzoo zoo sign`)" if error.reason == "unsigned"
                    else " (FEDZOO_TRUSTED_KEYS lists the operator keys this server trusts)"
                    if error.reason == "unknown_key" else "")
            raise ValidationFailed(f"{error}{hint}", field="signature", code="card_not_trusted",
                                   reason=error.reason) from None


def load_or_create_key(path: Path) -> CardSigningKey:
    """The key stored at `path`, created there (mode 0600) if there is none yet, race-free across processes."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(descriptor)
        try:
            CardSigningKey.generate().save(Path(temporary))
            os.link(temporary, path)  # fails if another process linked its key first: then that key is the one
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
    try:
        return CardSigningKey.load(path)
    except InvalidInputError as error:
        raise InvalidInputError(f"the server's signing key: {error}", field="FEDZOO_SERVER_SIGNING_KEY") from None
