package dev.fedzoo.client;

/**
 * A request to stop, set from any thread (an Android {@code JobService.onStopJob}, a UI button) and checked by
 * the SDK between training batches and between requests. Waits through {@link #sleep} end as soon as it is set,
 * as MindSpore's {@code stopFLJob} wakes its client.
 */
public final class StopSignal implements FedzooHttp.Sleeper {
    private volatile boolean stopped;

    /** Asks the work in progress to stop at its next check; wakes any wait. */
    public synchronized void stop() {
        stopped = true;
        notifyAll();
    }

    /** Whether {@link #stop()} was called. */
    public boolean isStopped() {
        return stopped;
    }

    /** Waits up to {@code millis}, or less if {@link #stop()} is called meanwhile. */
    @Override
    public synchronized void sleep(long millis) throws InterruptedException {
        long end = System.currentTimeMillis() + millis;
        for (long left = millis; !stopped && left > 0; left = end - System.currentTimeMillis()) {
            wait(left);
        }
    }
}
