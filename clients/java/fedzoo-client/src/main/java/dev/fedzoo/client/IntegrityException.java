package dev.fedzoo.client;

import dev.fedzoo.FedzooException;

/** Downloaded bytes do not hash to the sha256 the server promised (they were discarded). */
public class IntegrityException extends FedzooException {
    private static final long serialVersionUID = 1L;

    /** An integrity failure described by {@code message}. */
    public IntegrityException(String message) {
        super(message);
    }
}
