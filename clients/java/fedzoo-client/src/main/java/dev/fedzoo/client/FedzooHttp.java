package dev.fedzoo.client;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UnsupportedEncodingException;
import java.net.ConnectException;
import java.net.HttpURLConnection;
import java.net.URL;
import java.net.URLEncoder;
import java.nio.charset.Charset;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Random;

import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.FedzooException;

/**
 * Authenticated requests to one server with retries, backoff and typed errors, as
 * {@code fedzoo.clients.http.FedzooHTTP}, on {@link HttpURLConnection} (in the JDK and in Android, no dependency).
 *
 * <p>Which failures are retried depends on whether re-sending could apply the request twice. Every request is
 * retried when the server provably did not process it: the connection was refused, or the answer was 429 or 503
 * (honouring {@code Retry-After}). A failure after the request may have been processed (a timeout, a cut
 * response, 500/502/504) is retried only for requests marked {@link Resend#SAFE}: reads, lookups and update
 * uploads (the server answers a repeated upload with 409 {@code duplicate_update}, which counts as delivered).
 * Registration and telemetry are {@link Resend#UNSAFE}: a second registration would be refused as a duplicate and
 * the token lost, so the caller gets a {@link ServerUnavailableException} saying the request may have been applied.
 *
 * <p>Request bodies are handed to the connection whole, not streamed: the JDK's {@link HttpURLConnection} throws
 * away the answer to a streamed request that the server refused with 401 (an {@code HttpRetryException} instead of
 * the body), and the body names why ({@code token_expired}, {@code device_revoked}, {@code enrollment_required}).
 * The bodies are in memory already, so this costs one copy. One consequence on the JDK (not on Android, whose
 * connection is OkHttp's): when a kept-alive connection dies before any answer, the JDK sends a buffered request
 * once more by itself, as the server had not answered.
 */
public final class FedzooHttp {
    /** Whether a request may be sent again after a failure that leaves open whether the server applied it. */
    public enum Resend { SAFE, UNSAFE }

    /** Waits between attempts; {@link StopSignal} implements it so a stop cuts a wait short. */
    public interface Sleeper {
        void sleep(long millis) throws InterruptedException;
    }

    /** A complete response: status, headers and body. */
    public static final class Response {
        public final int status;
        public final Map<String, String> headers;
        public final byte[] body;

        Response(int status, Map<String, String> headers, byte[] body) {
            this.status = status;
            this.headers = headers;
            this.body = body;
        }

        /** The body as UTF-8 text. */
        public String text() {
            return new String(body, UTF8);
        }

        /** The body as a JSON object; a {@link FedzooException} if it is not one. */
        public JSONObject json() {
            try {
                return new JSONObject(text());
            } catch (JSONException error) {
                throw new FedzooException("the server answered HTTP " + status + " with a body that is not a JSON object: "
                        + text().substring(0, Math.min(200, text().length())));
            }
        }
    }

    static final Charset UTF8 = Charset.forName("UTF-8");
    private static final int[] PROCESSED_NOTHING = {429, 503};
    private static final int[] MAYBE_PROCESSED = {500, 502, 504};

    private final String baseUrl;
    private final RetryPolicy retry;
    private final int timeoutMs;
    private final Random random = new Random();
    private volatile String token;
    private volatile Sleeper sleeper = new Sleeper() {
        public void sleep(long millis) throws InterruptedException {
            Thread.sleep(millis);
        }
    };

    /** Requests to {@code baseUrl} with {@code token} (nullable), {@code retry} (null: the defaults) and a connect/read timeout. */
    public FedzooHttp(String baseUrl, String token, RetryPolicy retry, int timeoutMs) {
        this.baseUrl = baseUrl.replaceAll("/+$", "");
        this.token = token;
        this.retry = retry != null ? retry : new RetryPolicy();
        this.timeoutMs = timeoutMs;
    }

    /** The server's URL, without a trailing slash. */
    public String baseUrl() {
        return baseUrl;
    }

    /** The bearer token sent with every request, or null. */
    public String token() {
        return token;
    }

    /** Replaces the bearer token (after registering, or to drop it). */
    public void setToken(String token) {
        this.token = token;
    }

    /** The retry policy of this connection. */
    public RetryPolicy retry() {
        return retry;
    }

    /** Waits between retries through {@code sleeper} (e.g. a {@link StopSignal}). */
    public void setSleeper(Sleeper sleeper) {
        this.sleeper = sleeper;
    }

    /** Waits {@code seconds} with the current sleeper; an interruption ends the wait with a {@link FedzooException}. */
    public void sleepS(double seconds) {
        try {
            sleeper.sleep(Math.max(0L, Math.round(seconds * 1000)));
        } catch (InterruptedException error) {
            Thread.currentThread().interrupt();
            throw new FedzooException("interrupted while waiting to retry", error);
        }
    }

    /** A backoff delay (s) for attempt {@code attempt}, honouring {@code retryAfterS} when not null. */
    public double delayS(int attempt, Double retryAfterS) {
        return retry.delayS(attempt, retryAfterS, random);
    }

    /**
     * Sends a request, retrying as the class comment says; returns the response of an {@code expected} status and
     * raises the typed {@link ApiException} of any other.
     */
    public Response request(String method, String path, byte[] body, String contentType, Map<String, String> headers,
                            Resend resend, int... expected) {
        String lastProblem = "";
        for (int attempt = 0; attempt < retry.maxAttempts; attempt++) {
            Double retryAfterS = null;
            HttpURLConnection connection = null;
            try {
                connection = open(method, path, headers);
                if (body != null) {
                    connection.setDoOutput(true); // buffered, not streamed: see the class comment
                    connection.setRequestProperty("Content-Type", contentType);
                    OutputStream out = connection.getOutputStream();
                    out.write(body);
                    out.close();
                }
                int status = connection.getResponseCode();
                byte[] answer = readAll(status >= 400 ? connection.getErrorStream() : connection.getInputStream());
                if (contains(expected, status)) {
                    return new Response(status, headersOf(connection), answer);
                }
                boolean retriable = contains(PROCESSED_NOTHING, status)
                        || (resend == Resend.SAFE && contains(MAYBE_PROCESSED, status));
                if (!retriable) {
                    if (status < 400) {
                        throw new FedzooException(method + " " + baseUrl + path + " answered HTTP " + status + ", expected "
                                + Arrays.toString(expected));
                    }
                    if (contains(MAYBE_PROCESSED, status)) {
                        throw new ServerUnavailableException(method + " " + baseUrl + path + " answered HTTP " + status
                                + "; it may have been applied, so it is not sent again");
                    }
                    throw ApiException.forResponse(status, new String(answer, UTF8));
                }
                lastProblem = "HTTP " + status;
                retryAfterS = retryAfterS(connection.getHeaderField("Retry-After"));
            } catch (ConnectException refused) {
                lastProblem = "connection refused: " + refused.getMessage(); // nothing reached the server
            } catch (IOException error) {
                lastProblem = error.getClass().getSimpleName() + ": " + error.getMessage();
                if (resend == Resend.UNSAFE) {
                    throw new ServerUnavailableException(method + " " + baseUrl + path + " failed after it may have "
                            + "reached the server (" + lastProblem + "); it is not sent again", error);
                }
            } finally {
                if (connection != null) {
                    connection.disconnect();
                }
            }
            if (attempt + 1 < retry.maxAttempts) {
                sleepS(delayS(attempt, retryAfterS));
            }
        }
        throw new ServerUnavailableException(method + " " + baseUrl + path + " failed " + retry.maxAttempts
                + " times; last problem: " + lastProblem);
    }

    /** An opened connection with the token and {@code headers} set (for streamed downloads; no retries here). */
    public HttpURLConnection open(String method, String path, Map<String, String> headers) throws IOException {
        HttpURLConnection connection = (HttpURLConnection) new URL(baseUrl + path).openConnection();
        connection.setRequestMethod(method);
        connection.setConnectTimeout(timeoutMs);
        connection.setReadTimeout(timeoutMs);
        connection.setUseCaches(false);
        connection.setInstanceFollowRedirects(false);
        connection.setRequestProperty("Accept", "application/json");
        connection.setRequestProperty("User-Agent", "fedzoo-java/" + FedzooClient.VERSION);
        String current = token;
        if (current != null) {
            connection.setRequestProperty("Authorization", "Bearer " + current);
        }
        if (headers != null) {
            for (Map.Entry<String, String> header : headers.entrySet()) {
                connection.setRequestProperty(header.getKey(), header.getValue());
            }
        }
        return connection;
    }

    /** A GET (query may be null), retried as safe; the JSON object of its 200 answer. */
    public JSONObject getJson(String path, Map<String, String> query) {
        return request("GET", path + queryString(query), null, null, null, Resend.SAFE, 200).json();
    }

    /** A JSON POST; the JSON object of its answer of an {@code expected} status. */
    public JSONObject postJson(String path, JSONObject body, Resend resend, int... expected) {
        return request("POST", path, body.toString().getBytes(UTF8), "application/json", null, resend, expected).json();
    }

    static String queryString(Map<String, String> query) {
        if (query == null || query.isEmpty()) {
            return "";
        }
        StringBuilder out = new StringBuilder();
        try {
            for (Map.Entry<String, String> entry : query.entrySet()) {
                out.append(out.length() == 0 ? '?' : '&').append(URLEncoder.encode(entry.getKey(), "UTF-8"))
                        .append('=').append(URLEncoder.encode(entry.getValue(), "UTF-8"));
            }
        } catch (UnsupportedEncodingException impossible) {
            throw new IllegalStateException(impossible);
        }
        return out.toString();
    }

    static byte[] readAll(InputStream in) throws IOException {
        if (in == null) {
            return new byte[0];
        }
        try {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] chunk = new byte[1 << 14];
            for (int read = in.read(chunk); read > 0; read = in.read(chunk)) {
                out.write(chunk, 0, read);
            }
            return out.toByteArray();
        } finally {
            in.close();
        }
    }

    static Double retryAfterS(String value) {
        if (value == null) {
            return null;
        }
        try {
            return Double.valueOf(value.trim());
        } catch (NumberFormatException httpDate) {
            return null; // an HTTP date: fall back to our own backoff
        }
    }

    private static Map<String, String> headersOf(HttpURLConnection connection) {
        Map<String, String> headers = new LinkedHashMap<String, String>();
        for (String name : connection.getHeaderFields().keySet()) {
            if (name != null) {
                headers.put(name.toLowerCase(Locale.ROOT), connection.getHeaderField(name));
            }
        }
        return headers;
    }

    private static boolean contains(int[] statuses, int status) {
        for (int candidate : statuses) {
            if (candidate == status) {
                return true;
            }
        }
        return false;
    }
}
