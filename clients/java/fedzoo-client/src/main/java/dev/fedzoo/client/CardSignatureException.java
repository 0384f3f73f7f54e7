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

    public CardSignatureException(String message, String reason) {
        super(message);
        this.reason = reason;
    }

    public String reason() {
        return reason;
    }
}
