package dev.fedzoo.client;

/**
 * What one device-confirmed lookup may spend, as {@code fedzoo.clients.confirmation.ConfirmationPolicy}: models
 * timed (the shortlist's length), bytes downloaded, seconds, the runs of each timing, lookups.
 */
public final class ConfirmationPolicy {
    /** The Python SDK's defaults: 4 models, 64 MiB, 2 s, 3 warm-up and 15 timed runs, 3 lookups, 1 thread. */
    public static final ConfirmationPolicy DEFAULT = new ConfirmationPolicy(4, 64L * 1024 * 1024, 2.0, 3, 15, 3, 1);

    public final int maxModels;
    public final long maxDownloadBytes;
    public final double maxSeconds;
    public final int warmupRuns;
    public final int timedRuns;
    public final int maxLookups;
    public final int threads;

    public ConfirmationPolicy(int maxModels, long maxDownloadBytes, double maxSeconds, int warmupRuns, int timedRuns,
                              int maxLookups, int threads) {
        this.maxModels = maxModels;
        this.maxDownloadBytes = maxDownloadBytes;
        this.maxSeconds = maxSeconds;
        this.warmupRuns = warmupRuns;
        this.timedRuns = timedRuns;
        this.maxLookups = maxLookups;
        this.threads = threads;
    }
}
