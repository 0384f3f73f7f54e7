package dev.fedzoo;

/**
 * Base of every error the fedzoo SDK raises. Unchecked, like the Python SDK's exceptions: a device app
 * catches the few it can act on (a refused token, an unreachable server) and lets the rest surface.
 */
public class FedzooException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public FedzooException(String message) {
        super(message);
    }

    public FedzooException(String message, Throwable cause) {
        super(message, cause);
    }
}
