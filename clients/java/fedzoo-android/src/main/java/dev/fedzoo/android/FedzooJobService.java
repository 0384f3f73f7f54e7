package dev.fedzoo.android;

import java.io.File;
import java.util.Random;

import org.json.JSONObject;

import android.app.job.JobParameters;
import android.app.job.JobService;
import android.content.Context;
import android.net.ConnectivityManager;
import android.net.NetworkInfo;
import android.os.BatteryManager;
import android.os.PersistableBundle;
import android.os.PowerManager;
import android.util.Log;

import dev.fedzoo.FedzooException;
import dev.fedzoo.client.FedzooClient;
import dev.fedzoo.client.StateStore;
import dev.fedzoo.client.StopSignal;
import dev.fedzoo.codec.UpdateCodec;
import dev.fedzoo.fl.LocalData;
import dev.fedzoo.fl.Participation;
import dev.fedzoo.fl.ParticipationResult;

/**
 * One participation per job run, on a worker thread (JobService callbacks run on the main thread), then the next
 * job is scheduled with the same constraints: after the server's pacing, or after a backoff that doubles with each
 * failure in a row ({@link FedzooScheduler#backoffMs}). A run that finds its constraints not holding (JobScheduler
 * should never start one, but a device's state changes between the decision and the start) trains nothing and
 * waits for them again. {@link #onStopJob} (constraints lost: unplugged, screen on) sets the stop signal, which the
 * SDK checks between batches and requests; an update already trained stays in the {@link StateStore} and goes out
 * at the next run. The app subclasses this service, supplies its private data, and declares it in its manifest
 * with {@code android.permission.BIND_JOB_SERVICE}. Tested under Robolectric; never run on a device.
 */
public abstract class FedzooJobService extends JobService {
    private static final String LOG_TAG = "fedzoo";
    private final Random random = new Random();
    private volatile StopSignal stop;

    /** The device's private training data; called on the worker thread. */
    protected abstract LocalData localData();

    /** Where the SDK keeps its state (token, pending update) and blob cache: app-private storage by default. */
    protected File stateDirectory() {
        return new File(getFilesDir(), "fedzoo");
    }

    /** The client a run uses (override for other timeouts or retries); the server and token come from the state. */
    protected FedzooClient client(StateStore state) {
        JSONObject saved = state.load();
        return new FedzooClient(saved.optString("server"), null, new File(stateDirectory(), "cache")).keepStateIn(state);
    }

    /** Called on the worker thread when a run has ended (the next one is scheduled): its result, or the failure that
     * ended it (one of the two is null). */
    protected void onParticipationEnded(ParticipationResult result, FedzooException failure) {
        if (failure != null) {
            Log.w(LOG_TAG, "participation failed, backing off: " + failure.getMessage());
        } else {
            Log.i(LOG_TAG, "participation: " + result);
        }
    }

    @Override
    public boolean onStartJob(final JobParameters params) {
        FedzooScheduler.Constraints constraints = FedzooScheduler.Constraints.of(params.getExtras());
        if (!constraintsHold(constraints)) {
            scheduleNext(params, 0, failures(params));
            return false; // nothing to do now: the next run waits for the constraints again
        }
        stop = new StopSignal();
        final StopSignal signal = stop;
        new Thread(new Runnable() {
            public void run() {
                participate(params, signal);
            }
        }, "fedzoo-participation").start();
        return true; // still working: jobFinished is called from the worker
    }

    @Override
    public boolean onStopJob(JobParameters params) {
        StopSignal signal = stop;
        if (signal != null) {
            signal.stop();
        }
        return true; // run again when the constraints hold again
    }

    /** Whether the device is, right now, in the state the job asked for (charging, unmetered, idle). */
    protected boolean constraintsHold(FedzooScheduler.Constraints constraints) {
        if (constraints.requiresCharging
                && !((BatteryManager) getSystemService(Context.BATTERY_SERVICE)).isCharging()) {
            return false;
        }
        if (constraints.requiresUnmeteredNetwork) {
            ConnectivityManager connectivity = (ConnectivityManager) getSystemService(Context.CONNECTIVITY_SERVICE);
            NetworkInfo network = connectivity.getActiveNetworkInfo();
            if (network == null || !network.isConnected() || connectivity.isActiveNetworkMetered()) {
                return false;
            }
        }
        return !constraints.requiresDeviceIdle || !((PowerManager) getSystemService(Context.POWER_SERVICE)).isInteractive();
    }

    private void participate(JobParameters params, StopSignal signal) {
        PersistableBundle extras = params.getExtras();
        StateStore state = new StateStore(stateDirectory());
        if (!state.load().has("token")) {
            Log.w(LOG_TAG, "not registered: register with a client that keepStateIn(this state) before scheduling");
            jobFinished(params, false);
            return;
        }
        FedzooClient client = client(state);
        client.http().setSleeper(signal);
        ParticipationResult result = null;
        FedzooException failure = null;
        try {
            result = new Participation(client, state).participateOnce(extras.getString(FedzooScheduler.EXTRA_TASK),
                    localData(), UpdateCodec.Encoding.fromWireName(extras.getString(FedzooScheduler.EXTRA_ENCODING, "fp32")),
                    extras.getString(FedzooScheduler.EXTRA_FAMILY), signal);
        } catch (FedzooException error) {
            failure = error;
        }
        if (!signal.isStopped()) { // a stopped job is run again by JobScheduler (onStopJob answered true)
            if (failure != null) {
                int failures = failures(params) + 1;
                scheduleNext(params, FedzooScheduler.backoffMs(failures), failures);
            } else {
                scheduleNext(params, result.nextCheckInMs(random), 0);
            }
        }
        jobFinished(params, false);
        onParticipationEnded(result, failure);
    }

    private void scheduleNext(JobParameters params, long delayMs, int failures) {
        PersistableBundle extras = params.getExtras();
        FedzooScheduler.schedule(this, getClass(), params.getJobId(), extras.getString(FedzooScheduler.EXTRA_TASK),
                extras.getString(FedzooScheduler.EXTRA_ENCODING, "fp32"), extras.getString(FedzooScheduler.EXTRA_FAMILY),
                delayMs, FedzooScheduler.Constraints.of(extras), failures);
    }

    private static int failures(JobParameters params) {
        return params.getExtras().getInt(FedzooScheduler.EXTRA_FAILURES, 0);
    }
}
