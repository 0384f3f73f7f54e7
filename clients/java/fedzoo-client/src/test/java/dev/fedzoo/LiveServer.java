package dev.fedzoo;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;
import java.util.concurrent.TimeUnit;

import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.codec.Npy;
import dev.fedzoo.fl.LocalData;

/**
 * The real Python server on loopback ({@code tests/clients/java_live_server.py}), started with ProcessBuilder and
 * driven by JSON lines: restart it, or let a Python SDK device take part beside the Java ones.
 */
public final class LiveServer implements AutoCloseable {
    public final JSONObject ready;
    public final String url;
    public final File dataDir;
    private final Process process;
    private final BufferedReader output;
    private final Writer input;
    private static FutureTask<LiveServer> backgroundStart;

    private LiveServer(File dataDir) throws IOException, JSONException {
        this.dataDir = dataDir;
        ProcessBuilder builder = new ProcessBuilder(Arrays.asList(TestSupport.python(), "tests/clients/java_live_server.py",
                "--data-dir", dataDir.getPath())).directory(TestSupport.repository())
                .redirectError(new File(dataDir, "server.log"));
        process = builder.start();
        output = new BufferedReader(new InputStreamReader(process.getInputStream(), TestSupport.UTF8));
        input = new OutputStreamWriter(process.getOutputStream(), TestSupport.UTF8);
        ready = nextReply();
        url = ready.getString("url");
    }

    /**
     * The harness, started now or, after {@link #startInBackground()}, the one started then (its Python start takes
     * about 10 s: the federation, the server and their imports).
     */
    public static LiveServer start() {
        FutureTask<LiveServer> started = takeBackgroundStart();
        if (started == null) {
            return launch();
        }
        try {
            return started.get();
        } catch (ExecutionException failed) {
            throw failed.getCause() instanceof RuntimeException ? (RuntimeException) failed.getCause()
                    : new IllegalStateException(failed.getCause());
        } catch (InterruptedException interrupted) {
            throw new IllegalStateException("interrupted while the live server started", interrupted);
        }
    }

    /** Starts the harness on another thread, so that its start overlaps the tests that run before the live ones. */
    public static synchronized void startInBackground() {
        if (backgroundStart == null) {
            backgroundStart = new FutureTask<LiveServer>(LiveServer::launch);
            Thread thread = new Thread(backgroundStart, "live-server-start");
            thread.setDaemon(true);
            thread.start();
        }
    }

    /** Stops a harness started in the background that no test took. */
    public static void closeUnused() {
        FutureTask<LiveServer> started = takeBackgroundStart();
        if (started != null) {
            try {
                started.get().close();
            } catch (ExecutionException | InterruptedException | RuntimeException notStarted) {
                // nothing to stop
            }
        }
    }

    private static synchronized FutureTask<LiveServer> takeBackgroundStart() {
        FutureTask<LiveServer> started = backgroundStart;
        backgroundStart = null;
        return started;
    }

    private static LiveServer launch() {
        try {
            return new LiveServer(TestSupport.workDirectory("live-server"));
        } catch (IOException | JSONException error) {
            throw new IllegalStateException("the live server did not start: " + error, error);
        }
    }

    /** Sends one command and returns the harness's answer. */
    public JSONObject command(JSONObject command) {
        try {
            input.write(command + "\n");
            input.flush();
            return nextReply();
        } catch (IOException | JSONException error) {
            throw new IllegalStateException("the live server did not answer " + command + ": " + error, error);
        }
    }

    /** Device {@code index}'s private data, as the harness wrote it. */
    public LocalData shard(int index) {
        return data("shard-" + index + ".npz");
    }

    /** Device {@code index}'s images for the zoo server (after the {@code zoo_server} command wrote them). */
    public LocalData zooShard(int index) {
        return data("zoo-shard-" + index + ".npz");
    }

    public LocalData testSplit() {
        return data("test.npz");
    }

    private LocalData data(String name) {
        Map<String, Npy.Array> arrays = TestSupport.npz(new File(dataDir, name));
        return new LocalData(TestSupport.tensor(arrays.get("x")), arrays.get("y").longs());
    }

    private JSONObject nextReply() throws IOException, JSONException {
        for (String line = output.readLine(); line != null; line = output.readLine()) {
            if (line.startsWith("{")) { // the server's own log lines are not for us
                return new JSONObject(line);
            }
        }
        throw new IOException("the harness ended; see " + new File(dataDir, "server.log"));
    }

    @Override
    public void close() {
        try {
            input.write("{\"cmd\": \"quit\"}\n");
            input.close();
            if (!process.waitFor(20, TimeUnit.SECONDS)) {
                process.destroy();
            }
        } catch (IOException | InterruptedException stoppedAlready) {
            process.destroy();
        }
    }
}
