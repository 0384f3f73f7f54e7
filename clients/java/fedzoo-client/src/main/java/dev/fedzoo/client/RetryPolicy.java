package dev.fedzoo.client;

import java.util.Random;

/**
 * How often and how patiently to retry a transient failure, as {@code fedzoo.clients.http.RetryPolicy}:
 * exponential backoff with full jitter (a delay drawn from [0, min(max, base * 2^attempt)]), or the server's
 * {@code Retry-After} when it sent one (capped at the maximum).
 */
public final class RetryPolicy {
    public final int maxAttempts;
    public final double baseDelayS;
    public final double maxDelayS;

    /** 5 attempts, 0.2 s base delay, 10 s at most: the Python SDK's defaults. */
    public RetryPolicy() {
        this(5, 0.2, 10.0);
    }

    /** At most {@code maxAttempts} attempts, backoff from {@code baseDelayS} up to {@code maxDelayS} seconds. */
    public RetryPolicy(int maxAttempts, double baseDelayS, double maxDelayS) {
        if (maxAttempts < 1) {
            throw new IllegalArgumentException("maxAttempts must be >= 1, got " + maxAttempts);
        }
        this.maxAttempts = maxAttempts;
        this.baseDelayS = baseDelayS;
        this.maxDelayS = maxDelayS;
    }

    /** Seconds to wait before attempt {@code attempt + 1} (attempt counts from 0); {@code retryAfterS} may be null. */
    public double delayS(int attempt, Double retryAfterS, Random random) {
        if (retryAfterS != null) {
            return Math.min(maxDelayS, Math.max(0.0, retryAfterS));
        }
        double ceiling = Math.min(maxDelayS, baseDelayS * Math.pow(2, attempt));
        return random.nextDouble() * ceiling;
    }
}
