package dev.fedzoo.android;

import java.io.File;

import org.json.JSONObject;

import android.app.job.JobParameters;
import android.app.job.JobService;
import android.os.PersistableBundle;
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
 * job is scheduled after the server's pacing. {@link #onStopJob} (constraints lost: unplugged, screen on) sets
 * the stop signal, which the SDK checks between batches and requests; an update already trained stays in the
 * {@link StateStore} and goes out at the next run. The app subclasses this service, supplies its private data,
 * and declares it in its manifest with {@code android.permission.BIND_JOB_SERVICE}. Compiled, never run on a device.
 */
public abstract class FedzooJobService extends JobService {
    private static final String LOG_TAG = "fedzoo";
    private volatile StopSignal stop;

    /** The device's private training data; called on the worker thread. */
    protected abstract LocalData localData();

    /** Where the SDK keeps its state (token, pending update) and blob cache: app-private storage by default. */
    protected File stateDirectory() {
        return new File(getFilesDir(), "fedzoo");
    }

    @Override
    public boolean onStartJob(final JobParameters params) {
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

    private void participate(JobParameters params, StopSignal signal) {
        PersistableBundle extras = params.getExtras();
        String task = extras.getString(FedzooScheduler.EXTRA_TASK);
        String encoding = extras.getString(FedzooScheduler.EXTRA_ENCODING, "fp32");
        String family = extras.getString(FedzooScheduler.EXTRA_FAMILY);
        StateStore state = new StateStore(stateDirectory());
        JSONObject saved = state.load();
        if (!saved.has("server") || !saved.has("token")) {
            Log.w(LOG_TAG, "not registered: register with a client that keepStateIn(this state) before scheduling");
            jobFinished(params, false);
            return;
        }
        FedzooClient client = new FedzooClient(saved.optString("server"), null, new File(stateDirectory(), "cache"))
                .keepStateIn(state);
        client.http().setSleeper(signal);
        try {
            ParticipationResult result = new Participation(client, state).participateOnce(task, localData(),
                    UpdateCodec.Encoding.fromWireName(encoding), family, signal);
            Log.i(LOG_TAG, "participation: " + result);
            if (!signal.isStopped()) {
                FedzooScheduler.Constraints constraints = new FedzooScheduler.Constraints();
                FedzooScheduler.schedule(this, getClass(), params.getJobId(), task, encoding, family,
                        result.nextCheckInMs(new java.util.Random()), constraints);
            }
            jobFinished(params, false);
        } catch (FedzooException failure) {
            Log.w(LOG_TAG, "participation failed, retrying later: " + failure.getMessage());
            jobFinished(params, true);
        }
    }
}
