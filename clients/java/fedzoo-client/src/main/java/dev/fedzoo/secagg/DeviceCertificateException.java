package dev.fedzoo.secagg;

import dev.fedzoo.FedzooException;

/**
 * A device certificate or revocation list this device must not accept (as {@code fedzoo.device_certificates
 * .DeviceCertificateError}): {@link #reason()} is one stable word both SDKs give ({@code uncertified},
 * {@code malformed}, {@code unknown_key}, {@code bad_signature}, {@code wrong_device}, {@code wrong_key},
 * {@code expired}, {@code revoked}, {@code rollback}).
 */
public final class DeviceCertificateException extends FedzooException {
    private static final long serialVersionUID = 1L;
    private final String reason;

    public DeviceCertificateException(String message, String reason) {
        super(message);
        this.reason = reason;
    }

    /** The refusal's reason word. */
    public String reason() {
        return reason;
    }
}
