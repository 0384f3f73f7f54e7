package dev.fedzoo.client;

import dev.fedzoo.FedzooException;

/** The server could not be reached, or kept failing, after every retry the request allowed. */
public class ServerUnavailableException extends FedzooException {
    private static final long serialVersionUID = 1L;

    /** Unavailability described by {@code message}. */
    public ServerUnavailableException(String message) {
        super(message);
    }

    /** Unavailability described by {@code message}, caused by {@code cause}. */
    public ServerUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
