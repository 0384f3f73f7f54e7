package dev.fedzoo.secagg;

import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.Set;

import org.bouncycastle.util.encoders.Hex;

/**
 * A device signs under each round id once (as {@code fedzoo.secagg.signed_rounds.SignedRounds}): {@link #claim} is
 * called before stage 1 signs anything and refuses ({@code round_replayed}) a round id claimed before, so a server
 * that runs "preparation" runs under one round id has nothing to replay. This class remembers in memory; the SDK's
 * participation keeps the memory in its {@code StateStore} ({@code dev.fedzoo.client.StoredSignedRounds}).
 */
public class SignedRounds {
    private final Set<String> claimed = new HashSet<String>();

    /** A zoo-wide round's cohorts: {@code fl-round-<id>/subnet-<i>}. */
    public static final String COHORT_SEPARATOR = "/subnet-";

    /**
     * What is remembered of a round id: 16 bytes of its SHA-256, hex. The cohorts of one round share it: a device
     * takes part in one cohort of a round, so a lying server cannot put it into two and difference their sums.
     */
    public static String roundKey(String roundId) {
        int cohort = roundId.indexOf(COHORT_SEPARATOR);
        String round = cohort >= 0 ? roundId.substring(0, cohort) : roundId;
        return Hex.toHexString(Crypto.sha256(round.getBytes(StandardCharsets.UTF_8))).substring(0, 32);
    }

    /** The refusal of a round id this device took part in before. */
    public static ProtocolViolation replayed(String roundId) {
        return new ProtocolViolation("this device already took part in round '" + roundId + "'; it signs under a round "
                + "id once", "round_replayed");
    }

    /** Remembers {@code roundId}, or refuses it if it was claimed before. */
    public void claim(String roundId) {
        if (!claimed.add(roundKey(roundId))) {
            throw replayed(roundId);
        }
    }
}
