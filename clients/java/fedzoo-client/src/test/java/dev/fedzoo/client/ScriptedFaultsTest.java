package dev.fedzoo.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;

import org.json.JSONObject;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import dev.fedzoo.TestSupport;
import dev.fedzoo.edge.DeviceProfile;
import dev.fedzoo.fl.Participation;
import dev.fedzoo.fl.ParticipationResult;

/** Network faults scripted with the JDK's HttpServer: each test queues the answers the server gives, in order. */
class ScriptedFaultsTest {
    private interface Answer {
        void send(HttpExchange exchange) throws IOException;
    }

    private HttpServer server;
    private final ConcurrentLinkedQueue<Answer> script = new ConcurrentLinkedQueue<Answer>();
    private final List<String> seen = Collections.synchronizedList(new ArrayList<String>());
    private final List<Long> sleepsMs = Collections.synchronizedList(new ArrayList<Long>());
    private final List<String> authorizations = Collections.synchronizedList(new ArrayList<String>());

    @BeforeEach
    void start() throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", exchange -> {
            String range = exchange.getRequestHeaders().getFirst("Range");
            seen.add(exchange.getRequestMethod() + " " + exchange.getRequestURI().getPath() + (range != null ? " " + range : ""));
            authorizations.add(exchange.getRequestHeaders().getFirst("Authorization"));
            TestSupport.readAll(exchange.getRequestBody());
            Answer answer = script.poll();
            if (answer == null) {
                send(exchange, 500, "{\"error\": {\"code\": \"unscripted\", \"message\": \"no answer scripted\"}}", null);
            } else {
                answer.send(exchange);
            }
        });
        server.start();
    }

    @AfterEach
    void stop() {
        server.stop(0);
    }

    private FedzooClient client(int attempts) {
        FedzooClient client = new FedzooClient("http://127.0.0.1:" + server.getAddress().getPort(), "token",
                TestSupport.workDirectory("faults"), new RetryPolicy(attempts, 0.01, 5.0), 5_000);
        client.http().setSleeper(millis -> sleepsMs.add(millis));
        return client;
    }

    private static void send(HttpExchange exchange, int status, String body, String retryAfter) throws IOException {
        byte[] bytes = body.getBytes(TestSupport.UTF8);
        if (retryAfter != null) {
            exchange.getResponseHeaders().add("Retry-After", retryAfter);
        }
        exchange.getResponseHeaders().add("Content-Type", "application/json");
        exchange.sendResponseHeaders(status, bytes.length == 0 ? -1 : bytes.length);
        OutputStream out = exchange.getResponseBody();
        out.write(bytes);
        out.close();
    }

    private static Answer json(int status, String body) {
        return exchange -> send(exchange, status, body, null);
    }

    private static Answer bytes(int status, byte[] data, int sendOnly, String contentRange) {
        return exchange -> {
            if (contentRange != null) {
                exchange.getResponseHeaders().add("Content-Range", contentRange);
            }
            exchange.sendResponseHeaders(status, data.length);
            OutputStream out = exchange.getResponseBody();
            out.write(data, 0, sendOnly);
            out.flush();
            if (sendOnly < data.length) {
                throw new IOException("scripted cut"); // HttpServer drops the connection mid-body
            }
            out.close();
        };
    }

    @Test
    void a503WithRetryAfterIsWaitedOutAsTheServerSays() throws Exception {
        script.add(exchange -> send(exchange, 503, "{\"error\": {\"code\": \"busy\", \"message\": \"busy\"}}", "1.5"));
        script.add(json(200, "{\"task\": null, \"retry_after_s\": 30}"));
        JSONObject answer = client(3).flTask("digits", null);
        assertEquals(30.0, answer.getDouble("retry_after_s"), 0.0);
        assertEquals(Collections.singletonList(1500L), sleepsMs);
        assertEquals(2, seen.size());
    }

    @Test
    void a429OnRegistrationIsRetriedBecauseNothingWasProcessed() {
        script.add(exchange -> send(exchange, 429, "{\"error\": {\"code\": \"rate_limited\", \"message\": \"slow down\"}}", "2"));
        script.add(json(201, "{\"device_id\": \"d\", \"token\": \"fresh\"}"));
        FedzooClient client = client(3);
        client.register(new DeviceProfile("d", "linux-x86_64", null, "cpu", 1, 1024, "1.29.0", 1,
                Collections.<DeviceProfile.CalibrationBenchmark>emptyList()), "enrollment-secret");
        assertEquals("fresh", client.token());
        assertEquals(Collections.singletonList(2000L), sleepsMs);
    }

    @Test
    void aRegistrationThatMayHaveBeenAppliedIsNotSentAgain() {
        script.add(json(502, "bad gateway"));
        assertThrows(ServerUnavailableException.class, () -> client(5).register(new DeviceProfile("d", "p", null, "cpu", 1, 1,
                "v", 1, Collections.<DeviceProfile.CalibrationBenchmark>emptyList()), null));
        assertEquals(1, seen.size(), "one POST only");
    }

    @Test
    void aServerThatKeepsFailingRaisesServerUnavailableAfterEveryAttempt() {
        for (int i = 0; i < 3; i++) {
            script.add(json(503, "{}"));
        }
        ServerUnavailableException error = assertThrows(ServerUnavailableException.class, () -> client(3).card("m"));
        assertTrue(error.getMessage().contains("3 times"), error.getMessage());
        assertEquals(2, sleepsMs.size());
    }

    @Test
    void errorBodiesBecomeTypedExceptionsWithTheServersCodeAndField() {
        script.add(json(404, "{\"error\": {\"code\": \"model_not_found\", \"message\": \"no model m\", \"field\": \"model_id\"}}"));
        ApiException.NotFound error = assertThrows(ApiException.NotFound.class, () -> client(3).card("m"));
        assertEquals("model_not_found", error.code());
        assertEquals("model_id", error.field());
        assertEquals(404, error.status());
        script.add(json(422, "<html>proxy says no</html>"));
        ApiException.BadRequest text = assertThrows(ApiException.BadRequest.class, () -> client(3).card("m"));
        assertEquals("http_422", text.code());
    }

    @Test
    void aTruncatedDownloadResumesWithRangeAndVerifies() {
        byte[] blob = new byte[50_000];
        new java.util.Random(3).nextBytes(blob);
        String sha = BlobCache.sha256Of(blob);
        byte[] rest = java.util.Arrays.copyOfRange(blob, 20_000, blob.length);
        script.add(bytes(200, blob, 20_000, null));
        script.add(bytes(206, rest, rest.length, "bytes 20000-49999/50000"));
        FedzooClient client = client(3);
        File file = client.downloadBlob(sha);
        assertArrayEquals(blob, TestSupport.read(file));
        assertEquals("GET /v1/blobs/" + sha + " bytes=20000-", seen.get(1));
        assertEquals(50_000, client.downloadedBytes());
        assertFalse(client.cache().partialPath(sha).exists());
    }

    @Test
    void bytesThatDoNotHashToTheSha256AreDiscarded() {
        byte[] blob = "the bytes the server promised".getBytes(TestSupport.UTF8);
        byte[] other = "something else entirely, arrived".getBytes(TestSupport.UTF8);
        String sha = BlobCache.sha256Of(blob);
        script.add(bytes(200, other, other.length, null));
        FedzooClient client = client(3);
        assertThrows(IntegrityException.class, () -> client.downloadBlob(sha));
        assertNull(client.cache().get(sha));
        assertFalse(client.cache().partialPath(sha).exists());
    }

    @Test
    void anUploadRetriedAfterA502ThatTheServerAlreadyHadCountsAsDelivered() throws Exception {
        script.add(json(502, "{}"));
        script.add(json(409, "{\"error\": {\"code\": \"duplicate_update\", \"message\": \"already have it\"}}"));
        StateStore state = new StateStore(TestSupport.workDirectory("state"));
        StateStore.PendingUpdate update = new StateStore.PendingUpdate(7, "/v1/fl/rounds/7/updates",
                new JSONObject().put("base_version", 1).put("num_examples", 5).put("metrics", new JSONObject().put("loss", 0.5)),
                "2999-01-01T00:00:00Z", "fp32", new byte[] {1, 2, 3});
        state.savePending(update);
        ParticipationResult result = new Participation(client(3), state).deliver(state.pending().get(0));
        assertEquals("accepted", result.outcome);
        assertEquals(2, seen.size());
        assertTrue(state.pending().isEmpty());
    }

    @Test
    void aStaleUpdateIsRefusedAndForgotten() throws Exception {
        script.add(json(409, "{\"error\": {\"code\": \"stale_update\", \"message\": \"old base\"}}"));
        StateStore state = new StateStore(TestSupport.workDirectory("state"));
        state.savePending(new StateStore.PendingUpdate(8, "/v1/fl/rounds/8/updates", new JSONObject().put("num_examples", 5),
                "2999-01-01T00:00:00Z", "int8", new byte[] {4}));
        assertEquals("refused: stale_update", new Participation(client(3), state).deliver(state.pending().get(0)).outcome);
        assertTrue(state.pending().isEmpty());
    }

    @Test
    void anUpdatePastItsDeadlineIsDroppedWithoutSending() throws Exception {
        StateStore state = new StateStore(TestSupport.workDirectory("state"));
        state.savePending(new StateStore.PendingUpdate(9, "/v1/fl/rounds/9/updates", new JSONObject().put("num_examples", 5),
                "2020-01-01T00:00:00.5+00:00", "fp32", new byte[] {4}));
        assertEquals("expired", new Participation(client(3), state).participateOnce("digits", null, null, null, null).outcome);
        assertTrue(seen.isEmpty());
        assertTrue(state.pending().isEmpty());
    }

    @Test
    void aCardIsVerifiedBeforeAnyByteOfItsModelIsFetched() throws Exception {
        JSONObject vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/card_signatures.json")), TestSupport.UTF8));
        JSONObject valid = null;
        JSONObject tampered = null;
        JSONObject expired = null;
        for (int i = 0; i < vectors.getJSONArray("cases").length(); i++) {
            JSONObject vector = vectors.getJSONArray("cases").getJSONObject(i);
            valid = vector.getString("name").equals("valid") ? vector : valid;
            tampered = vector.getString("name").equals("model_sha256_swapped") ? vector : tampered;
            expired = vector.getString("name").equals("expired") ? vector : expired;
        }
        StateStore state = new StateStore(TestSupport.workDirectory("signed"));
        final long[] nowMs = {Timestamps.parseMillis(valid.getString("now"))}; // the vectors' own clock, not the wall's
        FedzooClient client = client(1).keepStateIn(state).withClock(() -> nowMs[0])
                .requireSignedCards(CardVerifier.fromJson(vectors.getJSONObject("trusted_keys")));
        dev.fedzoo.ModelCard bad = new dev.fedzoo.ModelCard(tampered.getJSONObject("card"));
        CardSignatureException refused = assertThrows(CardSignatureException.class, () -> client.downloadModel(bad));
        assertEquals("field_mismatch", refused.reason());
        assertTrue(seen.isEmpty(), "nothing was fetched for a card that failed verification");

        dev.fedzoo.ModelCard good = new dev.fedzoo.ModelCard(valid.getJSONObject("card"));
        script.add(json(404, "{\"error\": {\"code\": \"not_found\", \"message\": \"no blob\"}}"));
        assertThrows(ApiException.NotFound.class, () -> client.downloadModel(good));
        assertEquals(1, seen.size(), "a verified card's model is fetched");
        assertEquals(Integer.valueOf(good.version()), state.acceptedVersion(good.lineId()));

        nowMs[0] = Timestamps.parseMillis(expired.getString("now")); // the same card, once its signature has expired
        assertEquals("expired", assertThrows(CardSignatureException.class, () -> client.downloadModel(good)).reason());
        assertEquals(1, seen.size(), "nothing more was fetched");
    }

    private static JSONObject vectorCase(String file, String name) throws Exception {
        org.json.JSONArray cases = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/" + file)), TestSupport.UTF8)).getJSONArray("cases");
        for (int i = 0; i < cases.length(); i++) {
            if (cases.getJSONObject(i).getString("name").equals(name)) {
                return cases.getJSONObject(i);
            }
        }
        throw new AssertionError("no vector " + name + " in " + file);
    }

    @Test
    void aRevokedCardIsRefusedAndALyingServerCannotRollTheListBack() throws Exception {
        JSONObject valid = vectorCase("card_signatures.json", "valid");
        JSONObject newer = vectorCase("revocation_lists.json", "newer_than_held"); // version 3, revokes the valid card
        StateStore state = new StateStore(TestSupport.workDirectory("revocations"));
        long nowMs = Timestamps.parseMillis(valid.getString("now"));
        CardVerifier verifier = CardVerifier.fromJson(new JSONObject(new String(TestSupport.read(new File(
                TestSupport.repository(), "tests/vectors/card_signatures.json")), TestSupport.UTF8)).getJSONObject("trusted_keys"));
        FedzooClient client = client(1).keepStateIn(state).withClock(() -> nowMs).requireSignedCards(verifier);
        script.add(json(404, "{\"error\": {\"code\": \"no_revocation_list\", \"message\": \"none\"}}"));
        assertNull(client.refreshRevocations());
        script.add(json(200, newer.getJSONObject("document").toString()));
        assertEquals(3, client.refreshRevocations().version());
        dev.fedzoo.ModelCard card = new dev.fedzoo.ModelCard(valid.getJSONObject("card"));
        CardSignatureException refused = assertThrows(CardSignatureException.class, () -> client.downloadModel(card));
        assertEquals("revoked", refused.reason());
        assertEquals(2, seen.size(), "the two list fetches, never the model: " + seen);

        script.add(json(200, newer.getJSONObject("held").toString())); // version 2: it revokes less
        assertEquals("rollback", assertThrows(CardSignatureException.class, client::refreshRevocations).reason());
        FedzooClient restarted = client(1).keepStateIn(new StateStore(state.directory())).withClock(() -> nowMs)
                .requireSignedCards(verifier);
        assertEquals("revoked", assertThrows(CardSignatureException.class, () -> restarted.downloadModel(card)).reason());
        assertEquals(3, seen.size(), "nothing fetched after the refused list: " + seen);
    }

    @Test
    void aSecondCardForAnAcceptedLineAndVersionIsRefusedBeforeItsModelIsFetched() throws Exception {
        JSONObject valid = vectorCase("card_signatures.json", "valid");
        StateStore state = new StateStore(TestSupport.workDirectory("line-versions"));
        dev.fedzoo.ModelCard card = new dev.fedzoo.ModelCard(valid.getJSONObject("card"));
        state.acceptCard(card.lineId(), card.version(), "digits-mlp-v3-r9"); // another plan's "version 3", met first
        long nowMs = Timestamps.parseMillis(valid.getString("now"));
        FedzooClient client = client(1).keepStateIn(state).withClock(() -> nowMs)
                .requireSignedCards(CardVerifier.fromJson(new JSONObject(new String(TestSupport.read(new File(
                        TestSupport.repository(), "tests/vectors/card_signatures.json")), TestSupport.UTF8))
                        .getJSONObject("trusted_keys")));
        CardSignatureException refused = assertThrows(CardSignatureException.class, () -> client.downloadModel(card));
        assertEquals("version_reused", refused.reason());
        assertTrue(seen.isEmpty(), "nothing was fetched: " + seen);
    }

    @Test
    void aConfirmedLookupRefusesATamperedShortlistedCardBeforeFetchingItsModel() throws Exception {
        JSONObject vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/card_signatures.json")), TestSupport.UTF8));
        for (String name : new String[] {"labels_edited", "normalisation_edited", "unknown_key"}) {
            JSONObject tampered = null;
            for (int i = 0; i < vectors.getJSONArray("cases").length(); i++) {
                JSONObject vector = vectors.getJSONArray("cases").getJSONObject(i);
                tampered = vector.getString("name").equals(name) ? vector : tampered;
            }
            JSONObject card = tampered.getJSONObject("card");
            JSONObject entry = new JSONObject().put("model_id", card.getString("id")).put("sha256", card.getString("sha256"))
                    .put("size_bytes", card.getLong("size_bytes")).put("latency_ms", 0.01)
                    .put("latency_source", "predicted");
            script.add(json(200, new JSONObject().put("model", card).put("latency_ms", 0.01)
                    .put("shortlist", new org.json.JSONArray().put(entry)).toString()));
            script.add(json(200, card.toString()));
            seen.clear();
            StateStore state = new StateStore(TestSupport.workDirectory("confirming-" + name));
            FedzooClient client = client(1).keepStateIn(state)
                    .requireSignedCards(CardVerifier.fromJson(vectors.getJSONObject("trusted_keys")));
            CardSignatureException refused = assertThrows(CardSignatureException.class,
                    () -> client.lookupConfirmed("digits", 50.0, null, null, null, null), name);
            assertEquals(tampered.getString("expect"), refused.reason(), name);
            assertEquals(2, seen.size(), name + ": the lookup and the card, never the model: " + seen);
            assertTrue(seen.get(1).startsWith("GET /v1/models/"), name);
            assertNull(state.acceptedVersion(new dev.fedzoo.ModelCard(card).lineId()), name);
        }
    }

    @Test
    void cardRefusesAValidlySignedCardOfAnotherModel() throws Exception {
        JSONObject other = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/card_signatures.json")), TestSupport.UTF8)).getJSONArray("cases").getJSONObject(0)
                .getJSONObject("card");
        script.add(json(200, other.toString()));
        script.add(json(200, other.toString()));
        IntegrityException refused = assertThrows(IntegrityException.class, () -> client(1).card("digits-pinned"));
        assertTrue(refused.getMessage().contains("asked for the card of 'digits-pinned'"), refused.getMessage());
        assertEquals(other.getString("id"), client(1).card(other.getString("id")).id());
    }

    @Test
    void aModelTheServerLabelsMeasuredIsStillTimedOnTheDevice() throws Exception {
        JSONObject card = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/card_signatures.json")), TestSupport.UTF8)).getJSONArray("cases").getJSONObject(0)
                .getJSONObject("card");
        JSONObject entry = new JSONObject().put("model_id", card.getString("id")).put("sha256", card.getString("sha256"))
                .put("size_bytes", card.getLong("size_bytes")).put("latency_ms", 0.0).put("latency_source", "measured");
        script.add(json(200, new JSONObject().put("model", card).put("latency_ms", 0.0)
                .put("shortlist", new org.json.JSONArray().put(entry)).toString()));
        script.add(json(200, card.toString()));
        script.add(json(404, "{\"error\": {\"code\": \"not_found\", \"message\": \"no blob\"}}"));
        FedzooClient client = client(1);
        // a lying server's "measured at 0 ms" confirms nothing: the device fetches the model to time it itself
        assertThrows(ApiException.NotFound.class, () -> client.lookupConfirmed("digits", 1e-9, null, null, null, null));
        assertEquals(3, seen.size(), "the lookup, the card and the model's bytes: " + seen);
        assertTrue(seen.get(2).endsWith("/blob"), seen.get(2));
    }

    @Test
    void aTokenPastHalfItsLifetimeIsRefreshedBeforeTheNextCallAndKept() throws Exception {
        script.add(json(201, "{\"device_id\": \"d\", \"token\": \"first\", \"token_expires_in_s\": 0}"));
        script.add(json(201, "{\"device_id\": \"d\", \"token\": \"second\", \"token_expires_in_s\": 3600}"));
        script.add(json(200, "{\"task\": null, \"retry_after_s\": 30}"));
        StateStore state = new StateStore(TestSupport.workDirectory("tokens"));
        FedzooClient client = new FedzooClient("http://127.0.0.1:" + server.getAddress().getPort(), null,
                TestSupport.workDirectory("tokens-cache")).keepStateIn(state);
        client.register(new DeviceProfile("d", "p", null, "cpu", 1, 1, "v", 1,
                Collections.<DeviceProfile.CalibrationBenchmark>emptyList()), "enrollment-secret");
        client.flTask("digits", null);
        assertEquals(java.util.Arrays.asList("POST /v1/devices", "POST /v1/devices/d/token", "GET /v1/fl/task"), seen);
        assertEquals(java.util.Arrays.asList("Bearer enrollment-secret", "Bearer first", "Bearer second"), authorizations);
        FedzooClient restarted = new FedzooClient("http://127.0.0.1:" + server.getAddress().getPort(), null,
                TestSupport.workDirectory("tokens-cache")).keepStateIn(new StateStore(state.directory()));
        assertEquals("second", restarted.token());
    }

    @Test
    void timestampsParseTheServersForms() {
        assertEquals(0L, Timestamps.parseMillis("1970-01-01T00:00:00Z"));
        assertEquals(1_500L, Timestamps.parseMillis("1970-01-01T00:00:01.500123"));
        assertEquals(-3_600_000L, Timestamps.parseMillis("1970-01-01T00:00:00+01:00"));
        assertEquals("2026-12-01T12:00:00Z", Timestamps.formatSeconds(Timestamps.parseMillis("2026-12-01T12:00:00.999+00:00")));
    }
}
