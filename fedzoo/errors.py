"""The exception hierarchy every area raises from; the CLI turns these into one-line messages."""


class FedzooError(Exception):
    """Base of every error fedzoo raises on purpose; the message says what was wrong and with what value."""


class InvalidInputError(FedzooError, ValueError):
    """Input data, a file or a request field is not what it must be."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotFoundError(FedzooError, LookupError):
    """A model, blob, device or round that was asked for does not exist."""


class CardSignatureError(FedzooError):
    """A model card's signature is missing, invalid, expired, or would roll the family back; or a card or a
    revocation list is refused otherwise.

    `reason` is one stable word (`unsigned`, `unknown_key`, `bad_signature`, `field_mismatch`, `expired`,
    `rollback`, `version_reused`: a second card for a line and version, `revoked`: on the operator's revocation
    list) that both SDKs report the same way, from the same test vectors.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
