package dev.fedzoo.fl;

import java.util.Collections;
import java.util.Map;
import java.util.Random;

/** What one check-in came to, as Python's {@code ParticipationResult}. */
public final class ParticipationResult {
    /** The round worked on, or null when there was no task. */
    public final Long roundId;
    /**
     * {@code accepted} (the server has the update, possibly from an earlier attempt), {@code refused: <code>},
     * {@code diverged} (nothing sent), {@code expired} (a kept update missed its deadline), {@code stopped} or
     * {@code no task}.
     */
    public final String outcome;
    public final long uploadBytes;
    public final int numExamples;
    public final Map<String, Double> metrics;
    /** The server's pacing when there was no task: ask again after this many seconds (null otherwise). */
    public final Double retryAfterS;

    /** A result; see the fields. */
    public ParticipationResult(Long roundId, String outcome, long uploadBytes, int numExamples, Map<String, Double> metrics,
                               Double retryAfterS) {
        this.roundId = roundId;
        this.outcome = outcome;
        this.uploadBytes = uploadBytes;
        this.numExamples = numExamples;
        this.metrics = Collections.unmodifiableMap(metrics);
        this.retryAfterS = retryAfterS;
    }

    /**
     * When to check in next, in milliseconds: the server's {@code retry_after_s} (1 s without one) with ±20%
     * jitter, so a fleet does not come back in lockstep.
     */
    public long nextCheckInMs(Random random) {
        double seconds = retryAfterS != null ? retryAfterS : 1.0;
        return Math.round(seconds * (0.8 + 0.4 * random.nextDouble()) * 1000);
    }

    @Override
    public String toString() {
        return "ParticipationResult(round " + roundId + ", " + outcome + ", " + uploadBytes + " bytes, metrics " + metrics
                + (retryAfterS != null ? ", retry after " + retryAfterS + " s" : "") + ")";
    }
}
