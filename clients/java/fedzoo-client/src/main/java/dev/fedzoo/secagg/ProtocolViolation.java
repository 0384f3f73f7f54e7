package dev.fedzoo.secagg;

import dev.fedzoo.FedzooException;

/**
 * The server broke the SecAgg+ protocol, so this device refuses to go on (as {@code fedzoo.secagg.errors}):
 * {@link #reason()} is one stable word both SDKs report the same way ({@code malformed}, {@code wrong_stage},
 * {@code bad_signature}, {@code too_few_signatures}, {@code inconsistent_survivors}, {@code config_out_of_bounds},
 * {@code not_a_survivor}, {@code too_few_survivors}, {@code too_few_neighbours}, {@code round_replayed},
 * {@code uncertified_key}, {@code revoked_key}, {@code bad_revocations}).
 */
public final class ProtocolViolation extends FedzooException {
    private static final long serialVersionUID = 1L;
    private final String reason;

    public ProtocolViolation(String message, String reason) {
        super(message);
        this.reason = reason;
    }

    /** The refusal's reason word. */
    public String reason() {
        return reason;
    }
}
