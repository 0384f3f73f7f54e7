package dev.fedzoo.client;

import org.json.JSONObject;

import dev.fedzoo.secagg.DeviceCertificateException;
import dev.fedzoo.secagg.DeviceCertificates;
import dev.fedzoo.secagg.DeviceRevocations;
import dev.fedzoo.secagg.ProtocolViolation;

/**
 * A device's pinned operator key set for SecAgg+ neighbours and the newest device revocation list it verified, as
 * {@code fedzoo.clients.neighbour_trust}: before each SecAgg+ round the device reads the operator's signed list
 * ({@code GET /v1/device-revocations}) and keeps the newest in its {@link StateStore} (key {@code device_revocations});
 * an older list is refused, and a server that withholds a newer one still faces every key of the list kept.
 */
public final class NeighbourTrust {
    private final DeviceCertificates operatorKeys;
    private final StateStore state;

    NeighbourTrust(DeviceCertificates operatorKeys, StateStore state) {
        this.operatorKeys = operatorKeys;
        this.state = state;
    }

    /** The list this device kept (version 0 when none). */
    public DeviceRevocations keptRevocations() {
        return state.keptRevocations();
    }

    /**
     * The certificate policy for a round, after keeping {@code servedRevocations} (may be null) if it is newer;
     * {@link ProtocolViolation} {@code bad_revocations} for a list the operator did not sign or one older than kept.
     */
    public DeviceCertificates policy(JSONObject servedRevocations) {
        DeviceRevocations kept = state.keptRevocations();
        if (servedRevocations != null) {
            try {
                kept = state.keepRevocations(DeviceRevocations.verify(servedRevocations, operatorKeys, kept));
            } catch (DeviceCertificateException refused) {
                throw new ProtocolViolation("the server's device revocation list is refused (" + refused.reason() + "): "
                        + refused.getMessage(), "bad_revocations");
            }
        }
        return operatorKeys.withRevoked(kept.revokedKeys);
    }
}
