package dev.fedzoo.android;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNotSame;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.json.JSONObject;
import org.junit.After;
import org.junit.Before;
import org.junit.Test;
import org.junit.runner.RunWith;
import org.robolectric.Robolectric;
import org.robolectric.RobolectricTestRunner;
import org.robolectric.annotation.Config;
import org.robolectric.shadow.api.Shadow;
import org.robolectric.shadows.ShadowBatteryManager;
import org.robolectric.shadows.ShadowConnectivityManager;
import org.robolectric.shadows.ShadowJobService;
import org.robolectric.shadows.ShadowNetworkInfo;
import org.robolectric.shadows.ShadowPowerManager;
import org.robolectric.util.ReflectionHelpers;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import android.app.job.JobInfo;
import android.app.job.JobParameters;
import android.app.job.JobScheduler;
import android.content.Context;
import android.net.ConnectivityManager;
import android.net.NetworkInfo;

import dev.fedzoo.FedzooException;
import dev.fedzoo.client.FedzooClient;
import dev.fedzoo.client.RetryPolicy;
import dev.fedzoo.client.StateStore;
import dev.fedzoo.edge.FloatTensor;
import dev.fedzoo.fl.LocalData;
import dev.fedzoo.fl.ParticipationResult;

/**
 * The background participation service under Robolectric (the Android 14 framework, API 34; the code is built
 * against API 24): what it asks
 * JobScheduler for, the thread it works on, what it does when the constraints go away, a server error and a
 * device that is not in the state the job asked for. The server is a scripted loopback HTTP server (the SDK's
 * own protocol is tested against the real one in fedzoo-client), so no run here trains: each is about scheduling.
 */
@RunWith(RobolectricTestRunner.class)
@Config(sdk = 34)
public class FedzooJobServiceTest {
    private static final int JOB = FedzooScheduler.DEFAULT_JOB_ID;
    private static final String UPLOAD = "POST /v1/fl/rounds/7/updates";
    private static final String CHECK_IN = "GET /v1/fl/task";

    /** What one run of the service came to, and on which thread. */
    static final class Ended {
        final ParticipationResult result;
        final FedzooException failure;
        final Thread thread;

        Ended(ParticipationResult result, FedzooException failure, Thread thread) {
            this.result = result;
            this.failure = failure;
            this.thread = thread;
        }
    }

    /** The app's side: its data, and a client with quick retries for the tests. */
    public static class AppJobService extends FedzooJobService {
        static final BlockingQueue<Ended> ENDED = new LinkedBlockingQueue<Ended>();
        static final AtomicInteger DATA_READS = new AtomicInteger();
        static volatile Thread dataThread;

        @Override
        protected LocalData localData() {
            DATA_READS.incrementAndGet();
            dataThread = Thread.currentThread();
            return new LocalData(FloatTensor.zeros(1, 1, 2, 2), new long[] {0});
        }

        @Override
        protected FedzooClient client(StateStore state) {
            return new FedzooClient(state.load().optString("server"), null, new File(stateDirectory(), "cache"),
                    new RetryPolicy(2, 0.01, 0.05), 10_000).keepStateIn(state);
        }

        @Override
        protected void onParticipationEnded(ParticipationResult result, FedzooException failure) {
            ENDED.add(new Ended(result, failure, Thread.currentThread()));
        }
    }

    /** A loopback server answering each "METHOD path" from a script (each answer once, the last one for good); it
     * logs the requests it answered. */
    static final class ScriptedServer implements AutoCloseable {
        final BlockingQueue<String> requests = new LinkedBlockingQueue<String>();
        private final Map<String, Deque<String[]>> script = new HashMap<String, Deque<String[]>>();
        private final HttpServer http;

        ScriptedServer() throws IOException {
            http = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            http.createContext("/", this::answer);
            http.start();
        }

        String url() {
            return "http://127.0.0.1:" + http.getAddress().getPort();
        }

        /** Adds an answer for {@code route}: status, JSON body, Retry-After (null for none). */
        synchronized void script(String route, int status, String body, String retryAfterS) {
            script.computeIfAbsent(route, key -> new ArrayDeque<String[]>())
                    .add(new String[] {Integer.toString(status), body, retryAfterS});
        }

        /** From now on, {@code route} gets this answer. */
        synchronized void rescript(String route, int status, String body, String retryAfterS) {
            script.remove(route);
            script(route, status, body, retryAfterS);
        }

        private void answer(HttpExchange exchange) throws IOException {
            String route = exchange.getRequestMethod() + " " + exchange.getRequestURI().getPath();
            exchange.getRequestBody().close();
            requests.add(route); // before answering: the client may act on the answer before this thread goes on
            String[] answer;
            synchronized (this) {
                Deque<String[]> answers = script.get(route);
                answer = answers == null ? new String[] {"404", "{\"error\": {\"code\": \"not_found\", \"message\": \"\"}}", null}
                        : answers.size() > 1 ? answers.poll() : answers.peek();
            }
            byte[] body = answer[1].getBytes("UTF-8");
            exchange.getResponseHeaders().add("Content-Type", "application/json");
            if (answer[2] != null) {
                exchange.getResponseHeaders().add("Retry-After", answer[2]);
            }
            exchange.sendResponseHeaders(Integer.parseInt(answer[0]), body.length);
            OutputStream out = exchange.getResponseBody();
            out.write(body);
            out.close();
        }

        @Override
        public void close() {
            http.stop(0);
        }
    }

    private ScriptedServer server;
    private FedzooJobService service;
    private JobScheduler scheduler;
    private StateStore state;

    @Before
    public void deviceChargingOnWifiAndIdle() throws Exception {
        AppJobService.ENDED.clear();
        AppJobService.DATA_READS.set(0);
        AppJobService.dataThread = null;
        server = new ScriptedServer();
        service = Robolectric.setupService(AppJobService.class);
        scheduler = (JobScheduler) service.getSystemService(Context.JOB_SCHEDULER_SERVICE);
        state = new StateStore(new File(service.getFilesDir(), "fedzoo"));
        state.save(new JSONObject().put("server", server.url()).put("device_id", "phone-1").put("token", "device-token"));
        setCharging(true);
        setNetwork(ConnectivityManager.TYPE_WIFI);
        setInteractive(false);
    }

    @After
    public void stopServer() {
        server.close();
    }

    private void setCharging(boolean charging) {
        Shadow.<ShadowBatteryManager>extract(service.getSystemService(Context.BATTERY_SERVICE)).setIsCharging(charging);
    }

    private void setNetwork(int type) {
        Shadow.<ShadowConnectivityManager>extract(service.getSystemService(Context.CONNECTIVITY_SERVICE)).setActiveNetworkInfo(
                ShadowNetworkInfo.newInstance(NetworkInfo.DetailedState.CONNECTED, type, 0, true, NetworkInfo.State.CONNECTED));
    }

    private void setInteractive(boolean interactive) {
        Shadow.<ShadowPowerManager>extract(service.getSystemService(Context.POWER_SERVICE)).setIsInteractive(interactive);
    }

    private void scheduleFirstRun() {
        FedzooScheduler.schedule(service, AppJobService.class, JOB, "digits", "int8", null, 0,
                new FedzooScheduler.Constraints());
    }

    /** The parameters JobScheduler hands the service for a job (their constructor is hidden and differs by API). */
    private static JobParameters parametersOf(JobInfo job) {
        JobParameters params = Shadow.newInstanceOf(JobParameters.class);
        ReflectionHelpers.setField(params, "jobId", job.getId());
        ReflectionHelpers.setField(params, "extras", job.getExtras());
        return params;
    }

    /** What JobScheduler does when the job's time and constraints come: takes the pending job and starts it. */
    private JobParameters startPendingJob() {
        JobInfo job = scheduler.getPendingJob(JOB);
        assertNotNull("a job is scheduled", job);
        scheduler.cancel(JOB); // a one-off job leaves the pending list when it starts
        JobParameters params = parametersOf(job);
        assertTrue("the service works on, off the main thread", service.onStartJob(params));
        return params;
    }

    private Ended awaitEnd() throws InterruptedException {
        Ended ended = AppJobService.ENDED.poll(60, TimeUnit.SECONDS);
        assertNotNull("the run ended", ended);
        return ended;
    }

    private void awaitRequest(String route) throws InterruptedException {
        for (String seen = server.requests.poll(60, TimeUnit.SECONDS); !route.equals(seen);
             seen = server.requests.poll(60, TimeUnit.SECONDS)) {
            assertNotNull("the server saw " + route, seen);
        }
    }

    private static void assertStrictConstraints(JobInfo job) {
        assertTrue(job.isRequireCharging());
        assertEquals(JobInfo.NETWORK_TYPE_UNMETERED, job.getNetworkType());
        assertTrue(job.isRequireDeviceIdle());
        assertTrue(job.isPersisted());
        assertEquals("digits", job.getExtras().getString(FedzooScheduler.EXTRA_TASK));
        assertEquals("int8", job.getExtras().getString(FedzooScheduler.EXTRA_ENCODING));
    }

    private void pendingUpdate() throws Exception {
        state.savePending(new StateStore.PendingUpdate(7, "/v1/fl/rounds/7/updates",
                new JSONObject().put("base_version", 1).put("num_examples", 10).put("metrics", new JSONObject()),
                "2099-01-01T00:00:00Z", "int8", new byte[] {1, 2, 3}));
    }

    @Test
    public void schedulesWithTheDeclaredConstraintsAndRelaxedOnesOnlyWhenAsked() {
        FedzooScheduler.schedule(service, AppJobService.class, JOB, "digits", "int8", null, 5_000,
                new FedzooScheduler.Constraints());
        JobInfo strict = scheduler.getPendingJob(JOB);
        assertStrictConstraints(strict);
        assertEquals(5_000, strict.getMinLatencyMillis());
        assertEquals(AppJobService.class.getName(), strict.getService().getClassName());

        FedzooScheduler.Constraints relaxed = new FedzooScheduler.Constraints();
        relaxed.requiresCharging = false;
        relaxed.requiresUnmeteredNetwork = false;
        relaxed.requiresDeviceIdle = false;
        FedzooScheduler.schedule(service, AppJobService.class, JOB, "digits", "fp32", "mlp", 0, relaxed);
        JobInfo loose = scheduler.getPendingJob(JOB);
        assertFalse(loose.isRequireCharging());
        assertEquals(JobInfo.NETWORK_TYPE_ANY, loose.getNetworkType());
        assertFalse(loose.isRequireDeviceIdle());
        assertEquals("mlp", loose.getExtras().getString(FedzooScheduler.EXTRA_FAMILY));
        assertEquals("one job id, replaced", 1, scheduler.getAllPendingJobs().size());
    }

    @Test
    public void runsOneParticipationOnAWorkerThreadAndSchedulesTheNextAfterTheServersPacing() throws Exception {
        server.script(CHECK_IN, 200, "{\"task\": null, \"retry_after_s\": 42.0, \"reason\": \"no round\"}", null);
        scheduleFirstRun();
        startPendingJob();
        Ended ended = awaitEnd();
        assertNull(ended.failure);
        assertEquals("no task", ended.result.outcome);
        assertEquals("fedzoo-participation", ended.thread.getName());
        assertNotSame(Thread.currentThread(), ended.thread);
        assertSame("the data is read on the worker thread too", ended.thread, AppJobService.dataThread);
        assertTrue(Shadow.<ShadowJobService>extract(service).getIsJobFinished());
        assertFalse(Shadow.<ShadowJobService>extract(service).getIsRescheduleNeeded());
        assertEquals(CHECK_IN, server.requests.poll());
        assertNull("one check-in, no more", server.requests.poll());
        JobInfo next = scheduler.getPendingJob(JOB);
        assertStrictConstraints(next);
        assertTrue("42 s ± 20 %: " + next.getMinLatencyMillis(),
                next.getMinLatencyMillis() >= 33_600 && next.getMinLatencyMillis() <= 50_400);
    }

    @Test
    public void reschedulesWithADoublingBackoffAfterServerErrorsAndResetsItAfterASuccess() throws Exception {
        server.script(CHECK_IN, 500, "{\"error\": {\"code\": \"internal\", \"message\": \"boom\"}}", null);
        server.script(CHECK_IN, 500, "{\"error\": {\"code\": \"internal\", \"message\": \"boom\"}}", null);
        server.script(CHECK_IN, 500, "{\"error\": {\"code\": \"internal\", \"message\": \"boom\"}}", null);
        server.script(CHECK_IN, 500, "{\"error\": {\"code\": \"internal\", \"message\": \"boom\"}}", null);
        server.script(CHECK_IN, 200, "{\"task\": null, \"retry_after_s\": 10.0}", null);
        scheduleFirstRun();
        long[] expectedMs = {FedzooScheduler.BACKOFF_MS, 2 * FedzooScheduler.BACKOFF_MS};
        for (long backoffMs : expectedMs) {
            startPendingJob();
            assertNotNull("the server error ended the run", awaitEnd().failure);
            JobInfo next = scheduler.getPendingJob(JOB);
            assertEquals(backoffMs, next.getMinLatencyMillis());
            assertStrictConstraints(next);
        }
        startPendingJob();
        assertEquals("no task", awaitEnd().result.outcome);
        assertEquals(0, scheduler.getPendingJob(JOB).getExtras().getInt(FedzooScheduler.EXTRA_FAILURES));
        assertTrue(scheduler.getPendingJob(JOB).getMinLatencyMillis() <= 12_000);
    }

    @Test
    public void stopsWhenTheConstraintsGoAwayKeepsThePendingUpdateAndDeliversItNextTime() throws Exception {
        pendingUpdate();
        server.script(UPLOAD, 503, "{\"error\": {\"code\": \"busy\", \"message\": \"later\"}}", "60");
        scheduleFirstRun();
        JobParameters params = startPendingJob();
        awaitRequest(UPLOAD); // the upload was refused for now; the client waits 60 s to send it again
        setCharging(false);
        assertTrue("JobScheduler should run the job again", service.onStopJob(params));
        Ended stopped = awaitEnd();
        assertNotNull("the run gave up at once instead of waiting out the 60 s", stopped.failure);
        assertEquals("the update is kept", 1, state.pending().size());
        assertNull("a stopped job is not rescheduled by the service (JobScheduler does it)", scheduler.getPendingJob(JOB));

        setCharging(true); // the constraints hold again: JobScheduler starts the job once more
        server.rescript(UPLOAD, 201, "{\"round_id\": 7, \"counted_examples\": 10}", null);
        scheduleFirstRun();
        startPendingJob();
        Ended resumed = awaitEnd();
        assertNull(resumed.failure);
        assertEquals("accepted", resumed.result.outcome);
        assertEquals(Long.valueOf(7), resumed.result.roundId);
        assertTrue("delivered, so forgotten", state.pending().isEmpty());
        assertNotNull(scheduler.getPendingJob(JOB));
    }

    @Test
    public void neverWorksWhileTheConstraintsDoNotHold() throws Exception {
        pendingUpdate();
        Runnable[] breakOne = {
            () -> setCharging(false),
            () -> setNetwork(ConnectivityManager.TYPE_MOBILE),
            () -> setInteractive(true),
        };
        Runnable[] mend = {() -> setCharging(true), () -> setNetwork(ConnectivityManager.TYPE_WIFI), () -> setInteractive(false)};
        scheduleFirstRun();
        for (int i = 0; i < breakOne.length; i++) {
            breakOne[i].run();
            JobInfo job = scheduler.getPendingJob(JOB);
            scheduler.cancel(JOB);
            assertFalse("nothing runs", service.onStartJob(parametersOf(job)));
            mend[i].run();
            assertStrictConstraints(scheduler.getPendingJob(JOB)); // waiting for the constraints again
        }
        assertEquals("no data was read", 0, AppJobService.DATA_READS.get());
        assertTrue("no request was sent", server.requests.isEmpty());
        assertTrue(AppJobService.ENDED.isEmpty());
        assertEquals(1, state.pending().size());
    }
}
