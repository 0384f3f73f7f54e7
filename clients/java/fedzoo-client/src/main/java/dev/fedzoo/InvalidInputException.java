package dev.fedzoo;

/** A value given to the SDK is wrong; {@link #field()} names it (mirrors Python's {@code InvalidInputError}). */
public class InvalidInputException extends FedzooException {
    private static final long serialVersionUID = 1L;
    private final String field;

    public InvalidInputException(String message) {
        this(message, null);
    }

    public InvalidInputException(String message, String field) {
        super(message);
        this.field = field;
    }

    /** The offending field or parameter name, or null when the whole value is wrong. */
    public String field() {
        return field;
    }
}
