package dev.fedzoo.client;

import java.util.Collections;

import org.json.JSONObject;

import dev.fedzoo.secagg.DeviceCertificates;
import dev.fedzoo.secagg.ProtocolViolation;

/**
 * A device's pinned operator key set for SecAgg+ neighbours, checked against the one revocation list it holds, as
 * {@code fedzoo.clients.neighbour_trust}: before each SecAgg+ round the device reads the operator's signed list
 * ({@code GET /v1/revocations}) and keeps it in its {@link StateStore} when newer (key {@code revocation_list}: the
 * same list and version as the card checks); an older list, another list under the held version, or one no operator
 * key signed is refused, and a server that withholds a newer list still faces every key of the list held.
 */
public final class NeighbourTrust {
    private final DeviceCertificates operatorKeys;
    private final StateStore state;

    NeighbourTrust(DeviceCertificates operatorKeys, StateStore state) {
        this.operatorKeys = operatorKeys;
        this.state = state;
    }

    /** The pinned operator keys (nothing revoked). */
    public DeviceCertificates operatorKeys() {
        return operatorKeys;
    }

    /** The newest privacy terms this device verified, or null. */
    PrivacyTerms heldPrivacyTerms() {
        return state.privacyTerms();
    }

    /** The newest revocation list this device verified, or null. */
    public RevocationList heldRevocations() {
        return state.revocationList();
    }

    /**
     * The certificate policy for a round, after keeping {@code servedRevocations} (null: the server has none) if it
     * is newer; {@link ProtocolViolation} {@code bad_revocations} for a list no operator key signed, one older than
     * held, or another list under the held version.
     */
    public DeviceCertificates policy(JSONObject servedRevocations) {
        RevocationList held = state.revocationList();
        if (servedRevocations != null) {
            try {
                held = state.holdRevocationList(operatorKeys.operatorKeys(), servedRevocations);
            } catch (CardSignatureException refused) {
                throw new ProtocolViolation("the server's revocation list is refused (" + refused.reason() + "): "
                        + refused.getMessage(), "bad_revocations");
            }
        }
        return operatorKeys.withRevoked(held == null ? Collections.<String>emptySet() : held.deviceKeyFingerprints());
    }
}
