package dev.fedzoo.android;

import android.app.job.JobInfo;
import android.app.job.JobScheduler;
import android.content.ComponentName;
import android.content.Context;
import android.os.PersistableBundle;

/**
 * Schedules background participation with Android's JobScheduler (framework API 21+, no Google Maven needed),
 * by default only while the device is charging, on an unmetered network and idle: training must not cost the
 * user battery, mobile data or a sluggish phone. The constraints travel in the job's extras, so each run
 * schedules the next with the same ones, and checks them itself before it trains.
 */
public final class FedzooScheduler {
    /** The job id this SDK uses; pass another to {@link #schedule} if the app already uses it. */
    public static final int DEFAULT_JOB_ID = 0x0fed200;
    /** The first wait after a failed participation; doubled with each failure in a row, up to {@link #MAX_BACKOFF_MS}. */
    public static final long BACKOFF_MS = 60_000;
    public static final long MAX_BACKOFF_MS = 6 * 3600_000L;
    static final String EXTRA_TASK = "fedzoo.task";
    static final String EXTRA_ENCODING = "fedzoo.encoding";
    static final String EXTRA_FAMILY = "fedzoo.family";
    static final String EXTRA_FAILURES = "fedzoo.failures";
    static final String EXTRA_CHARGING = "fedzoo.requires_charging";
    static final String EXTRA_UNMETERED = "fedzoo.requires_unmetered";
    static final String EXTRA_IDLE = "fedzoo.requires_idle";

    private FedzooScheduler() {
    }

    /** When a participation may run. The defaults are the strict ones; relax them only for testing. */
    public static final class Constraints {
        public boolean requiresCharging = true;
        public boolean requiresUnmeteredNetwork = true;
        public boolean requiresDeviceIdle = true;

        static Constraints of(PersistableBundle extras) {
            Constraints constraints = new Constraints();
            constraints.requiresCharging = extras.getBoolean(EXTRA_CHARGING, true);
            constraints.requiresUnmeteredNetwork = extras.getBoolean(EXTRA_UNMETERED, true);
            constraints.requiresDeviceIdle = extras.getBoolean(EXTRA_IDLE, true);
            return constraints;
        }
    }

    /**
     * Schedules one participation of {@code service} for {@code task} after at least {@code delayMs}; the service
     * schedules the next one itself with the server's pacing. {@code family} may be null; {@code encoding} is
     * {@code fp32} or {@code int8}. The job survives reboots (the app needs {@code RECEIVE_BOOT_COMPLETED}).
     */
    public static int schedule(Context context, Class<? extends FedzooJobService> service, int jobId, String task,
                               String encoding, String family, long delayMs, Constraints constraints) {
        return schedule(context, service, jobId, task, encoding, family, delayMs, constraints, 0);
    }

    static int schedule(Context context, Class<? extends FedzooJobService> service, int jobId, String task,
                        String encoding, String family, long delayMs, Constraints constraints, int failures) {
        PersistableBundle extras = new PersistableBundle();
        extras.putString(EXTRA_TASK, task);
        extras.putString(EXTRA_ENCODING, encoding);
        if (family != null) {
            extras.putString(EXTRA_FAMILY, family);
        }
        extras.putInt(EXTRA_FAILURES, failures);
        extras.putBoolean(EXTRA_CHARGING, constraints.requiresCharging);
        extras.putBoolean(EXTRA_UNMETERED, constraints.requiresUnmeteredNetwork);
        extras.putBoolean(EXTRA_IDLE, constraints.requiresDeviceIdle);
        JobInfo.Builder job = new JobInfo.Builder(jobId, new ComponentName(context, service))
                .setExtras(extras)
                .setMinimumLatency(Math.max(0, delayMs))
                .setRequiresCharging(constraints.requiresCharging)
                .setRequiredNetworkType(constraints.requiresUnmeteredNetwork ? JobInfo.NETWORK_TYPE_UNMETERED
                        : JobInfo.NETWORK_TYPE_ANY)
                .setRequiresDeviceIdle(constraints.requiresDeviceIdle)
                .setPersisted(true);
        JobScheduler scheduler = (JobScheduler) context.getSystemService(Context.JOB_SCHEDULER_SERVICE);
        return scheduler.schedule(job.build());
    }

    /** The wait before the next try after {@code failures} failed participations in a row (1 or more). */
    public static long backoffMs(int failures) {
        return Math.min(MAX_BACKOFF_MS, BACKOFF_MS << Math.min(failures - 1, 20));
    }

    /** Stops scheduling participations (a running one is asked to stop through its stop signal). */
    public static void cancel(Context context, int jobId) {
        ((JobScheduler) context.getSystemService(Context.JOB_SCHEDULER_SERVICE)).cancel(jobId);
    }
}
