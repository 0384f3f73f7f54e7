package dev.fedzoo;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.InetSocketAddress;
import java.net.URL;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpHandler;
import com.sun.net.httpserver.HttpServer;

/**
 * A loopback HTTP proxy (the JDK's HttpServer) in front of the live server that injects one network fault on
 * request: cut a blob download after some bytes, or let an upload reach the server and drop its answer (what a
 * device sees when the connection dies, or the server restarts, after the server committed the update).
 */
public final class FaultProxy implements AutoCloseable {
    private final HttpServer server;
    private final String target;
    private volatile long cutBlobAfterBytes = -1;
    private final AtomicInteger uploadAnswersToDrop = new AtomicInteger();
    /** Each request seen: "METHOD path [Range]". */
    public final List<String> requests = Collections.synchronizedList(new ArrayList<String>());

    public FaultProxy(String target) throws IOException {
        this.target = target;
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", new HttpHandler() {
            public void handle(HttpExchange exchange) throws IOException {
                forward(exchange);
            }
        });
        server.start();
    }

    public String url() {
        return "http://127.0.0.1:" + server.getAddress().getPort();
    }

    public void cutNextBlobAfter(long bytes) {
        cutBlobAfterBytes = bytes;
    }

    /**
     * Lets the next upload reach the server and drops its answer, and the answer to the JDK's own re-send of it
     * (HttpURLConnection sends a buffered POST once more when the connection dies before an answer): to the device,
     * the server never answered.
     */
    public void dropNextUploadAnswer() {
        uploadAnswersToDrop.set(2);
    }

    private void forward(HttpExchange exchange) throws IOException {
        String path = exchange.getRequestURI().toString();
        String range = exchange.getRequestHeaders().getFirst("Range");
        requests.add(exchange.getRequestMethod() + " " + path + (range != null ? " " + range : ""));
        HttpURLConnection upstream = (HttpURLConnection) new URL(target + path).openConnection();
        upstream.setRequestMethod(exchange.getRequestMethod());
        for (Map.Entry<String, List<String>> header : exchange.getRequestHeaders().entrySet()) {
            if (!header.getKey().equalsIgnoreCase("Host") && !header.getKey().equalsIgnoreCase("Content-Length")) {
                upstream.setRequestProperty(header.getKey(), header.getValue().get(0));
            }
        }
        byte[] body = TestSupport.readAll(exchange.getRequestBody());
        if (body.length > 0) {
            upstream.setDoOutput(true);
            upstream.setFixedLengthStreamingMode(body.length);
            OutputStream out = upstream.getOutputStream();
            out.write(body);
            out.close();
        }
        int status = upstream.getResponseCode();
        InputStream stream = status >= 400 ? upstream.getErrorStream() : upstream.getInputStream();
        byte[] answer = stream == null ? new byte[0] : TestSupport.readAll(stream);
        if (path.endsWith("/updates") && uploadAnswersToDrop.getAndUpdate(left -> Math.max(0, left - 1)) > 0) {
            exchange.close(); // the server has the update; the device never hears so
            return;
        }
        for (Map.Entry<String, List<String>> header : upstream.getHeaderFields().entrySet()) {
            String name = header.getKey();
            if (name != null && !name.equalsIgnoreCase("Transfer-Encoding") && !name.equalsIgnoreCase("Content-Length")) {
                exchange.getResponseHeaders().put(name, header.getValue());
            }
        }
        exchange.sendResponseHeaders(status, answer.length == 0 ? -1 : answer.length);
        OutputStream out = exchange.getResponseBody();
        boolean blob = path.contains("/blob");
        long cut = cutBlobAfterBytes;
        if (blob && cut >= 0 && cut < answer.length) {
            cutBlobAfterBytes = -1;
            out.write(answer, 0, (int) cut);
            out.flush();
            throw new IOException("cut after " + cut + " bytes"); // HttpServer closes the connection mid-body
        }
        out.write(answer);
        out.close();
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
