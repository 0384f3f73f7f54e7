package dev.fedzoo.android;

import android.app.job.JobInfo;
import android.app.job.JobScheduler;
import android.content.ComponentName;
import android.content.Context;
import android.os.PersistableBundle;

/**
 * Schedules background participation with Android's JobScheduler (framework API 21+, no Google Maven needed),
 * by default only while the device is charging, on an unmetered network and idle: training must not cost the
 * user battery, mobile data or a sluggish phone. Compiled against API 24; never run on a device.
 */
public final class FedzooScheduler {
    /** The job id this SDK uses; pass another to {@link #schedule} if the app already uses it. */
    public static final int DEFAULT_JOB_ID = 0x0fed200;
    static final String EXTRA_TASK = "fedzoo.task";
    static final String EXTRA_ENCODING = "fedzoo.encoding";
    static final String EXTRA_FAMILY = "fedzoo.family";
    private static final long BACKOFF_MS = 60_000;

    private FedzooScheduler() {
    }

    /** When a participation may run. The defaults are the strict ones; relax them only for testing. */
    public static final class Constraints {
        public boolean requiresCharging = true;
        public boolean requiresUnmeteredNetwork = true;
        public boolean requiresDeviceIdle = true;
    }

    /**
     * Schedules one participation of {@code service} for {@code task} after at least {@code delayMs}; the service
     * schedules the next one itself with the server's pacing. {@code family} may be null; {@code encoding} is
     * {@code fp32} or {@code int8}. The job survives reboots (the app needs {@code RECEIVE_BOOT_COMPLETED}).
     */
    public static int schedule(Context context, Class<? extends FedzooJobService> service, int jobId, String task,
                               String encoding, String family, long delayMs, Constraints constraints) {
        PersistableBundle extras = new PersistableBundle();
        extras.putString(EXTRA_TASK, task);
        extras.putString(EXTRA_ENCODING, encoding);
        if (family != null) {
            extras.putString(EXTRA_FAMILY, family);
        }
        JobInfo.Builder job = new JobInfo.Builder(jobId, new ComponentName(context, service))
                .setExtras(extras)
                .setMinimumLatency(Math.max(0, delayMs))
                .setRequiresCharging(constraints.requiresCharging)
                .setRequiredNetworkType(constraints.requiresUnmeteredNetwork ? JobInfo.NETWORK_TYPE_UNMETERED
                        : JobInfo.NETWORK_TYPE_ANY)
                .setRequiresDeviceIdle(constraints.requiresDeviceIdle)
                .setPersisted(true);
        if (!constraints.requiresDeviceIdle) {
            // JobScheduler refuses a backoff policy on idle-mode jobs: they rerun at the next idle window anyway
            job.setBackoffCriteria(BACKOFF_MS, JobInfo.BACKOFF_POLICY_EXPONENTIAL);
        }
        JobScheduler scheduler = (JobScheduler) context.getSystemService(Context.JOB_SCHEDULER_SERVICE);
        return scheduler.schedule(job.build());
    }

    /** Stops scheduling participations (a running one is asked to stop through its stop signal). */
    public static void cancel(Context context, int jobId) {
        ((JobScheduler) context.getSystemService(Context.JOB_SCHEDULER_SERVICE)).cancel(jobId);
    }
}
