package dev.fedzoo.client;

import dev.fedzoo.FedzooException;

/**
 * A model card failed verification; {@link #reason()} is one of {@code unsigned}, {@code unknown_key},
 * {@code bad_signature}, {@code field_mismatch}, {@code expired}, {@code rollback} (Python's
 * {@code CardSignatureError.reason}). Nothing of the model was loaded.
 */
public class CardSignatureException extends FedzooException {
    private static final long serialVersionUID = 1L;
    private final String reason;

    /** A refusal naming its {@code reason} (see the class comment). */
    public CardSignatureException(String message, String reason) {
        super(message);
        this.reason = reason;
    }

    /**
     * Why the card (or revocation list) was refused: unsigned, unknown_key, bad_signature, field_mismatch, expired,
     * rollback, version_reused (a second card for a line and version, or list for a version) or revoked.
     */
    public String reason() {
        return reason;
    }
}
