package dev.fedzoo.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;

import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

import dev.fedzoo.FaultProxy;
import dev.fedzoo.LiveServer;
import dev.fedzoo.ModelCard;
import dev.fedzoo.TestSupport;
import dev.fedzoo.codec.UpdateCodec;
import dev.fedzoo.edge.DeviceProfile;
import dev.fedzoo.edge.EdgeSession;
import dev.fedzoo.fl.Capabilities;
import dev.fedzoo.fl.Participation;
import dev.fedzoo.fl.SecureParticipation;
import dev.fedzoo.secagg.DeviceCertificates;
import dev.fedzoo.secagg.SecAggBounds;
import dev.fedzoo.secagg.SecAggClient;
import dev.fedzoo.secagg.SecAggConfig;
import dev.fedzoo.fl.LocalData;
import dev.fedzoo.fl.Participation;
import dev.fedzoo.fl.ParticipationResult;

/**
 * The Java SDK against the real Python server on loopback: registry, resumable download, inference equal to
 * Python's, federated rounds of Java devices and of Java and Python devices together, typed errors, pacing, and an
 * update delivered exactly once across a server restart. The tests share one server and run in order: rounds of
 * one task follow each other.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class LiveServerTest {
    private static final RetryPolicy QUICK = new RetryPolicy(3, 0.05, 0.5);
    private static LiveServer server;
    private static int devices;
    /** The zoo server test 19 started and its three certified Java devices, reused by test 20. */
    private static JSONObject zooServer;
    private static List<FedzooClient> zooDevices;

    @BeforeAll
    static void startServer() {
        server = LiveServer.start();
    }

    @AfterAll
    static void stopServer() {
        server.close();
    }

    /** The enrollment token the live server's admin created for this run's devices. */
    private static String enrollmentToken() {
        return server.ready.optString("enrollment_token");
    }

    private static FedzooClient registeredDevice(String url) {
        FedzooClient client = new FedzooClient(url, null, TestSupport.workDirectory("device-cache"), QUICK, 30_000);
        client.register(DeviceProfile.collect("java-device-" + (devices++), 1, null, null), enrollmentToken());
        return client;
    }

    /**
     * A registered device whose signing key the operator certified (the live server's {@code certify}), pinning the
     * operator key set for its SecAgg+ neighbours.
     */
    private static FedzooClient certifiedDevice() {
        String name = "java-device-" + (devices++);
        FedzooClient client = new FedzooClient(server.url, null, TestSupport.workDirectory("device-cache"), QUICK, 30_000)
                .keepStateIn(new StateStore(TestSupport.workDirectory("state-" + name)));
        client.register(DeviceProfile.collect(name, 1, null, null), enrollmentToken());
        try {
            server.command(new JSONObject().put("cmd", "certify"));
            return client.requireCertifiedNeighbours(DeviceCertificates.fromJson(server.ready.getJSONObject("operator_keys")));
        } catch (org.json.JSONException malformed) {
            throw new IllegalStateException(malformed);
        }
    }

    private static long startRound(int targetClients, String extra) throws Exception {
        OperatorClient admin = new OperatorClient(server.url, null, TestSupport.workDirectory("admin"));
        JSONObject config = new JSONObject().put("model_id", server.ready.getString("model_id")).put("min_clients", targetClients)
                .put("target_clients", targetClients).put("over_selection", 0.0).put("deadline_s", 120)
                .put("local_epochs", 1).put("batch_size", 16).put("learning_rate", 0.05).put("optimizer", "sgd")
                .put("momentum", 0.9).put("evaluation_sha256", server.ready.getString("evaluation_sha256"))
                // the accuracy gate is open: these tests are about the protocol, and whether an aggregate clears a
                // gate depends on the CPU's numerics (the server's gate has its own tests)
                .put("max_accuracy_drop", 1.0);
        if (extra != null) {
            JSONObject more = new JSONObject(extra);
            for (java.util.Iterator<String> keys = more.keys(); keys.hasNext();) {
                String key = keys.next();
                config.put(key, more.get(key));
            }
        }
        return admin.createRounds(config, server.ready.getString("admin_token")).getLong("id");
    }

    /**
     * Each device takes part once in {@code task} on its shard, all at the same time (SecAgg+ devices answer each
     * stage together); the results of those that finished within {@code timeoutMs}.
     */
    private static List<ParticipationResult> participateTogether(List<FedzooClient> clients, String task,
            java.util.function.IntFunction<LocalData> shard, UpdateCodec.Encoding encoding, long timeoutMs)
            throws InterruptedException {
        final List<ParticipationResult> results = Collections.synchronizedList(new java.util.ArrayList<ParticipationResult>());
        List<Thread> devices = new java.util.ArrayList<Thread>();
        for (int i = 0; i < clients.size(); i++) {
            final FedzooClient device = clients.get(i);
            final LocalData data = shard.apply(i);
            devices.add(new Thread(() -> results.add(new Participation(device, null).participateOnce(task, data,
                    encoding, null, null))));
        }
        for (Thread device : devices) {
            device.start();
        }
        for (Thread device : devices) {
            device.join(timeoutMs);
        }
        return results;
    }

    /**
     * The three zoo devices take part in zoo-wide round {@code roundId} together, each on its shard: every update is
     * accepted in that round and the round closes; its view.
     */
    private static JSONObject zooRoundClosesWithEveryUpdate(List<FedzooClient> devices, String url, String task,
            long roundId) throws Exception {
        List<ParticipationResult> results = participateTogether(devices, task, server::zooShard,
                UpdateCodec.Encoding.FP32, 240_000);
        assertEquals(3, results.size());
        for (ParticipationResult result : results) {
            assertEquals("accepted", result.outcome, result.toString());
            assertEquals(Long.valueOf(roundId), result.roundId);
        }
        JSONObject view = waitUntilFinished(url, roundId, 300_000);
        assertEquals("closed", view.getString("state"), view.toString());
        return view;
    }

    private static JSONObject waitUntilFinished(long roundId) throws Exception {
        return waitUntilFinished(server.url, roundId, 60_000);
    }

    private static JSONObject waitUntilFinished(String url, long roundId, long timeoutMs) throws Exception {
        // a round's read needs the viewer or admin token (a DP round's carries no counts: docs/privacy.md)
        FedzooClient observer = new FedzooClient(url, server.ready.getString("admin_token"),
                TestSupport.workDirectory("observer"));
        long giveUp = System.currentTimeMillis() + timeoutMs;
        JSONObject view = observer.flRound(roundId);
        while (Arrays.asList("open", "collecting", "aggregating").contains(view.getString("state"))
                && System.currentTimeMillis() < giveUp) {
            Thread.sleep(100);
            view = observer.flRound(roundId);
        }
        return view;
    }

    @Test
    @Order(1)
    void idleCheckInReturnsTheServersRetryDelayWithoutSleeping() {
        FedzooClient device = registeredDevice(server.url);
        long start = System.currentTimeMillis();
        ParticipationResult result = new Participation(device, null).participateOnce(server.ready.optString("task"),
                server.shard(0), UpdateCodec.Encoding.FP32, null, null);
        assertEquals("no task", result.outcome);
        assertNull(result.roundId);
        assertNotNull(result.retryAfterS);
        assertTrue(result.retryAfterS > 0);
        assertTrue(System.currentTimeMillis() - start < result.retryAfterS * 1000, "participateOnce returned, not slept");
        long next = result.nextCheckInMs(new java.util.Random(1));
        assertTrue(next >= result.retryAfterS * 800 - 1 && next <= result.retryAfterS * 1200 + 1, "jitter within ±20%");
    }

    @Test
    @Order(2)
    void aBadTokenIsATypedAuthenticationError() {
        FedzooClient stranger = new FedzooClient(server.url, "not-a-token", TestSupport.workDirectory("stranger"), QUICK, 30_000);
        ApiException.Authentication refused = assertThrows(ApiException.Authentication.class,
                () -> stranger.flTask("digits", null));
        assertEquals(401, refused.status());
        assertTrue(refused.code().length() > 0 && !refused.code().startsWith("http_"), "the server's own code: " + refused.code());
    }

    @Test
    @Order(3)
    void registerLookupResumedDownloadAndInferenceEqualToPythons() throws Exception {
        FaultProxy proxy = new FaultProxy(server.url);
        try {
            Map<String, byte[]> calibration = Collections.singletonMap("cal-tiny-fp32",
                    TestSupport.read(new File(TestSupport.vectors(), "calibration/cal-tiny-fp32.onnx")));
            FedzooClient client = new FedzooClient(proxy.url(), null, TestSupport.workDirectory("cache"), QUICK, 30_000);
            JSONObject registration = client.register(DeviceProfile.collect("java-phone", 1, null, calibration),
                    enrollmentToken());
            assertEquals("java-phone", registration.getString("device_id"));
            assertNotNull(client.token());
            JSONObject choice = client.lookup("digits", 50.0, null, null);
            ModelCard card = new ModelCard(choice.getJSONObject("model"));
            assertEquals(server.ready.getString("model_id"), card.id());
            assertTrue(client.listModels("digits", 10, 0).getJSONArray("models").length() >= 1);

            proxy.cutNextBlobAfter(1000);
            File model = client.downloadModel(card);
            assertEquals(card.sha256(), BlobCache.sha256Of(model));
            assertEquals(card.sizeBytes(), client.downloadedBytes(), "the cut's 1000 bytes were kept, the rest resumed");
            assertTrue(proxy.requests.contains("GET /v1/models/" + card.id() + "/blob bytes=1000-"), proxy.requests.toString());

            LocalData test = server.testSplit();
            EdgeSession session = client.session(card, 1);
            double accuracy = EdgeSession.accuracy(session.predict(test.x), test.y);
            session.close();
            assertEquals(server.ready.getDouble("python_accuracy"), accuracy, 0.0);
            JSONObject telemetry = client.reportLatency(card.id(), 0.5, 0.7, 1);
            assertEquals(card.id(), telemetry.getString("model_id"));
        } finally {
            proxy.close();
        }
    }

    @Test
    @Order(4)
    void aRoundOfJavaDevicesUploadingFp32AndInt8ClosesAndPublishesANewVersion() throws Exception {
        long roundId = startRound(2, null);
        List<UpdateCodec.Encoding> encodings = Arrays.asList(UpdateCodec.Encoding.FP32, UpdateCodec.Encoding.INT8);
        for (int i = 0; i < encodings.size(); i++) {
            FedzooClient device = registeredDevice(server.url);
            ParticipationResult result = new Participation(device, null).participateOnce("digits", server.shard(i),
                    encodings.get(i), null, null);
            assertEquals("accepted", result.outcome, result.toString());
            assertEquals(Long.valueOf(roundId), result.roundId);
            assertTrue(result.uploadBytes > 0);
        }
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        assertEquals(2, view.getInt("accepted_updates"));
        ModelCard published = new FedzooClient(server.url, null, TestSupport.workDirectory("reader")).card(view.getString("result_model_id"));
        assertEquals(2, published.version());
    }

    @Test
    @Order(5)
    void aMixedRoundOfJavaAndPythonDevicesCloses() throws Exception {
        long roundId = startRound(3, null);
        for (int i = 0; i < 2; i++) {
            FedzooClient device = registeredDevice(server.url);
            UpdateCodec.Encoding encoding = i == 0 ? UpdateCodec.Encoding.INT8 : UpdateCodec.Encoding.FP32;
            assertEquals("accepted", new Participation(device, null).participateOnce("digits", server.shard(i), encoding, null,
                    null).outcome);
        }
        JSONObject python = server.command(new JSONObject().put("cmd", "python_device").put("device_id", "python-device-1")
                .put("shard", 2).put("encoding", "int8"));
        assertEquals("accepted", python.getString("outcome"), python.toString());
        assertEquals(roundId, python.getLong("round_id"));
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        assertEquals(3, view.getInt("accepted_updates"));
        assertNotNull(view.getString("result_model_id"));
    }

    @Test
    @Order(6)
    void anUpdateWhoseAnswerWasLostIsDeliveredExactlyOnceAfterAServerRestart() throws Exception {
        long roundId = startRound(1, "{\"local_epochs\": 2}");
        File stateDirectory = TestSupport.workDirectory("device-state");
        FaultProxy proxy = new FaultProxy(server.url);
        String token;
        try {
            FedzooClient device = new FedzooClient(proxy.url(), null, TestSupport.workDirectory("cache"),
                    new RetryPolicy(1, 0.05, 0.5), 30_000);
            token = device.register(DeviceProfile.collect("java-restart", 1, null, null), enrollmentToken())
                    .getString("token");
            proxy.dropNextUploadAnswer();
            assertThrows(ServerUnavailableException.class, () -> new Participation(device, new StateStore(stateDirectory))
                    .participateOnce("digits", server.shard(3), UpdateCodec.Encoding.INT8, null, null));
        } finally {
            proxy.close();
        }
        assertEquals(1, new StateStore(stateDirectory).pending().size(), "the trained update was kept on disk");
        server.command(new JSONObject().put("cmd", "restart"));

        // a new process: new objects, the same state directory
        FedzooClient restarted = new FedzooClient(server.url, token, TestSupport.workDirectory("cache"), QUICK, 30_000);
        ParticipationResult result = new Participation(restarted, new StateStore(stateDirectory))
                .participateOnce("digits", server.shard(3), UpdateCodec.Encoding.INT8, null, null);
        assertEquals("accepted", result.outcome, "409 duplicate_update counts as delivered");
        assertEquals(Long.valueOf(roundId), result.roundId);
        assertTrue(new StateStore(stateDirectory).pending().isEmpty());
        JSONObject view = waitUntilFinished(roundId);
        assertEquals(1, view.getInt("accepted_updates"), "delivered exactly once");
        assertEquals("closed", view.getString("state"));
    }

    @Test
    @Order(7)
    void aStopSignalEndsTheWorkBetweenBatchesAndNothingIsSent() throws Exception {
        long roundId = startRound(1, "{\"local_epochs\": 50, \"batch_size\": 1}");
        FedzooClient device = registeredDevice(server.url);
        final StopSignal stop = new StopSignal();
        Thread stopper = new Thread(new Runnable() {
            public void run() {
                try {
                    Thread.sleep(500);
                } catch (InterruptedException ignored) {
                    return;
                }
                stop.stop();
            }
        });
        stopper.start();
        long start = System.currentTimeMillis();
        ParticipationResult result = new Participation(device, null).participateOnce("digits", server.shard(1),
                UpdateCodec.Encoding.FP32, null, stop);
        stopper.join();
        assertEquals("stopped", result.outcome);
        assertEquals(Long.valueOf(roundId), result.roundId);
        assertTrue(System.currentTimeMillis() - start < 20_000);
        assertEquals(0, device.uploadedBytes());
    }

    @Test
    @Order(8)
    void registeringNeedsEnrollmentAndARefreshedTokenIsSavedAndReplacesTheOldOne() throws Exception {
        FedzooClient unenrolled = new FedzooClient(server.url, null, TestSupport.workDirectory("unenrolled"), QUICK, 30_000);
        ApiException.Authentication refused = assertThrows(ApiException.Authentication.class,
                () -> unenrolled.register(DeviceProfile.collect("java-unenrolled", 1, null, null), null));
        assertEquals(401, refused.status());
        assertEquals("enrollment_required", refused.code(), "the body of a 401 answering a POST is read");
        assertEquals("Authorization", refused.field());
        assertTrue(!(refused instanceof ApiException.ReregistrationRequired), "an enrollment token is what it lacks");

        StateStore state = new StateStore(TestSupport.workDirectory("refresh-state"));
        FedzooClient device = new FedzooClient(server.url, null, TestSupport.workDirectory("cache"), QUICK, 30_000)
                .keepStateIn(state);
        JSONObject registration = device.register(DeviceProfile.collect("java-refresh", 1, null, null), enrollmentToken());
        assertTrue(registration.getLong("token_expires_in_s") > 0);
        String first = device.token();
        JSONObject refreshed = device.refreshToken();
        assertTrue(refreshed.getLong("token_expires_in_s") > 0);
        assertNotEquals(first, device.token());
        assertEquals(refreshed.getString("token"), device.token());
        assertEquals(device.token(), state.load().getString("token"), "the new token is saved");
        assertNotNull(device.lookup("digits", 50.0, null, null).getJSONObject("model"));
        // a request sent with the old token just before the switch still works (the server's grace period)
        FedzooClient inFlight = new FedzooClient(server.url, first, TestSupport.workDirectory("cache"), QUICK, 30_000);
        assertNotNull(inFlight.lookup("digits", 50.0, null, null).getJSONObject("model"));
        // a restarted app carries on with the saved token
        FedzooClient restarted = new FedzooClient(server.url, null, TestSupport.workDirectory("cache"), QUICK, 30_000)
                .keepStateIn(state);
        assertEquals(device.token(), restarted.token());
        assertNotNull(restarted.lookup("digits", 50.0, null, null).getJSONObject("model"));
    }

    @Test
    @Order(11)
    void anExpiredTokenAndARevokedDeviceAreToldApartOnGetsAndPosts() throws Exception {
        FedzooClient expiring = registeredDevice(server.url);
        String modelId = server.ready.getString("model_id");
        assertTrue(server.command(new JSONObject().put("cmd", "expire_token").put("device_id", expiring.deviceId()))
                .getBoolean("ok"));
        ApiException.ReregistrationRequired onGet = assertThrows(ApiException.ReregistrationRequired.class,
                () -> expiring.flTask("digits", null));
        assertEquals("token_expired", onGet.code());
        ApiException.ReregistrationRequired onPost = assertThrows(ApiException.ReregistrationRequired.class,
                () -> expiring.reportLatency(modelId, 0.5, null, 1));
        assertEquals("token_expired", onPost.code());
        assertEquals("Authorization", onPost.field());
        assertTrue(onPost.getMessage().contains("register again with an enrollment token"), onPost.getMessage());

        FedzooClient revoked = registeredDevice(server.url);
        assertTrue(server.command(new JSONObject().put("cmd", "revoke").put("device_id", revoked.deviceId()))
                .getBoolean("ok"));
        assertEquals("device_revoked", assertThrows(ApiException.ReregistrationRequired.class,
                () -> revoked.lookup("digits", 50.0, null, null)).code());
        assertEquals("device_revoked", assertThrows(ApiException.ReregistrationRequired.class,
                () -> revoked.reportLatency(modelId, 0.5, null, 1)).code());
        assertEquals("device_revoked", assertThrows(ApiException.ReregistrationRequired.class,
                revoked::refreshToken).code());
    }

    private static JSONObject participants(long roundId) throws Exception {
        FedzooClient admin = new FedzooClient(server.url, server.ready.getString("admin_token"),
                TestSupport.workDirectory("admin"));
        return admin.http().getJson("/v1/fl/rounds/" + roundId + "/participants", null);
    }

    @Test
    @Order(12)
    void aDpRoundSelectsOnlyDevicesThatClipAndTheJavaDevicesDeltaArrivesClipped() throws Exception {
        double clipNorm = 0.05;
        long roundId = startRound(1, "{\"privacy\": {\"dp\": {\"max_epsilon\": 1000.0, \"clip_norm\": " + clipNorm
                + ", \"noise_multiplier\": 1.0}}, \"max_accuracy_drop\": 1.0}");
        FedzooClient device = registeredDevice(server.url);
        JSONObject undeclared = device.flTask("digits", null, new Capabilities(null, false, null));
        assertTrue(undeclared.isNull("task"));
        assertTrue(undeclared.getString("reason").contains("DP clipping"), undeclared.toString());

        ParticipationResult result = new Participation(device, null).participateOnce("digits", server.shard(2),
                UpdateCodec.Encoding.FP32, null, null);
        assertEquals("accepted", result.outcome, result.toString());
        assertEquals(Long.valueOf(roundId), result.roundId);
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        JSONObject participant = participants(roundId).getJSONArray("participants").getJSONObject(0);
        assertEquals(device.deviceId(), participant.getString("device_id"));
        assertTrue(participant.getDouble("delta_norm") <= clipNorm * (1 + 1e-5),
                "the server received a delta within the clip norm: " + participant);
        assertTrue(participant.getDouble("delta_norm") >= clipNorm * (1 - 1e-5), "one local epoch moves further than "
                + clipNorm + ", so the delta was clipped to it: " + participant);
    }

    @Test
    @Order(13)
    void aSecureRoundSkipsDevicesThatDoNotSpeakItsProtocolAndOneHandedAnotherVersionDeclinesOnRecord() throws Exception {
        long roundId = startRound(3, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 2, "
                + "\"threshold\": 2}}, \"deadline_s\": 3, \"max_accuracy_drop\": 1.0}");
        FedzooClient device = certifiedDevice();
        JSONObject skipped = device.flTask("digits", null, new Capabilities(1, true, null));
        assertTrue(skipped.isNull("task"), "the round does not select a device that speaks SecAgg+ version 1");
        assertTrue(skipped.getString("reason").contains("secure aggregation version "
                + Capabilities.SECURE_AGGREGATION_VERSION), skipped.toString());

        JSONObject work = device.flTask("digits", null).getJSONObject("task");
        assertEquals(roundId, work.getLong("round_id"));
        // as if the server had changed its protocol under the device: a task of a version this SDK does not speak
        work.getJSONObject("privacy").getJSONObject("secure_aggregation").put("version", 99);
        SecureParticipation.Outcome declined = new SecureParticipation(device, new SecAggBounds(), null).takePart(work,
                (config, privacy) -> new int[config.vectorLength + 1], () -> device.flTask("digits", null), null);
        assertEquals("refused: unsupported_secure_aggregation", declined.outcome);
        assertEquals(0, device.uploadedBytes());
        JSONObject view = waitUntilFinished(roundId);
        assertEquals(1, view.getInt("declined_devices"), view.toString());
        JSONObject participant = participants(roundId).getJSONArray("participants").getJSONObject(0);
        assertEquals("declined", participant.getString("status"));
        assertTrue(participant.getString("reason").startsWith("unsupported_secure_aggregation"), participant.toString());
    }

    /** A Java device that answers the SecAgg+ stages with a known input, or drops out after sharing its keys. */
    private static final class JavaSecureDevice extends Thread {
        final FedzooClient client = certifiedDevice();
        final int[] levels;
        final boolean dropsAfterSharingKeys;
        final List<String> answered = new java.util.ArrayList<String>();
        volatile String outcome;
        volatile Throwable error;

        JavaSecureDevice(int vectorLength, long seed, boolean dropsAfterSharingKeys) {
            java.util.Random random = new java.util.Random(seed);
            levels = new int[vectorLength];
            for (int i = 0; i < vectorLength; i++) {
                levels[i] = random.nextInt(255) - 127;
            }
            this.dropsAfterSharingKeys = dropsAfterSharingKeys;
        }

        @Override
        public void run() {
            try {
                JSONObject work = client.flTask("digits", null).getJSONObject("task");
                if (dropsAfterSharingKeys) {
                    dropAfterSharingKeys(work);
                    return;
                }
                // the SDK's own stage loop, with an input on exact quantisation levels (so the test knows it)
                outcome = new SecureParticipation(client, new SecAggBounds(), null).takePart(work, (config, privacy) -> {
                    double[] vector = new double[levels.length];
                    for (int i = 0; i < vector.length; i++) {
                        vector[i] = levels[i] / 128.0;
                    }
                    return dev.fedzoo.secagg.Encoding.quantise(vector, config, 1.0, new java.util.Random(1));
                }, () -> client.flTask("digits", null), null).outcome;
            } catch (Throwable failure) {
                error = failure;
            }
        }

        private void dropAfterSharingKeys(JSONObject work) throws Exception {
            SecAggClient protocol = null;
            while (!answered.contains("share_keys")) {
                JSONObject secure = work.getJSONObject("privacy").getJSONObject("secure_aggregation");
                JSONObject request = secure.optJSONObject("request");
                if (request != null) {
                    if (protocol == null) {
                        protocol = new SecAggClient(SecAggConfig.fromJson(secure.getJSONObject("config")),
                                secure.getInt("client"), client.signingKey(), new SecAggBounds(), null);
                    }
                    Object body;
                    if (secure.getString("stage").equals("advertise_keys")) {
                        JSONObject keys = protocol.advertiseKeys();
                        keys.remove("stage");
                        keys.remove("client");
                        body = keys;
                    } else {
                        body = dev.fedzoo.secagg.Framing.encodeShareKeys(protocol.shareKeys(request));
                    }
                    client.secureReply(secure.getString("reply_url"), body);
                    answered.add(secure.getString("stage"));
                }
                Thread.sleep(50);
                work = client.flTask("digits", null).getJSONObject("task");
            }
            outcome = "dropped out after " + answered; // and never checks in again
        }
    }

    @Test
    @Order(14)
    void aSecureRoundOfJavaAndPythonDevicesWithAJavaDropoutAfterKeySharingSumsTheOthersExactly() throws Exception {
        // 7 devices: k = 6 and the devices' floor t = 5 (against 2 corrupt devices) leave room for the dropout
        long roundId = startRound(7, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 6, "
                + "\"clip_range\": 0.9921875, \"stage_deadline_s\": 4}}, \"min_clients\": 3, "
                + "\"deadline_s\": 90, \"max_accuracy_drop\": 1.0, \"poll_interval_s\": 0.1, "
                + "\"max_examples_per_update\": 10}");
        JSONObject python = server.command(new JSONObject().put("cmd", "python_secure_devices")
                .put("device_ids", new JSONArray(Arrays.asList("python-secure-1", "python-secure-2"))).put("seed", 5)
                .put("num_examples", 10));
        int vectorLength = python.getJSONObject("levels").getJSONArray("python-secure-1").length();
        List<JavaSecureDevice> java = Arrays.asList(new JavaSecureDevice(vectorLength, 1, false),
                new JavaSecureDevice(vectorLength, 2, false), new JavaSecureDevice(vectorLength, 4, false),
                new JavaSecureDevice(vectorLength, 5, false), new JavaSecureDevice(vectorLength, 3, true));
        for (JavaSecureDevice device : java) {
            device.start();
        }
        for (JavaSecureDevice device : java) {
            device.join(120_000);
            assertNull(device.error, String.valueOf(device.error));
        }
        JSONObject results = server.command(new JSONObject().put("cmd", "python_secure_results"));
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        for (JavaSecureDevice device : java.subList(0, 4)) {
            assertEquals("accepted", device.outcome);
        }
        assertEquals(Arrays.asList("advertise_keys", "share_keys"), java.get(4).answered);
        assertEquals("accepted", results.getJSONObject("outcomes").getString("python-secure-1"), results.toString());
        assertEquals("accepted", results.getJSONObject("outcomes").getString("python-secure-2"), results.toString());
        JSONObject secure = view.getJSONObject("outcome").getJSONObject("secure_aggregation");
        assertEquals(6, secure.getInt("survivors"), secure.toString());
        assertEquals(1, secure.getInt("dropped"), secure.toString());

        JSONArray survivors = new JSONArray().put(python.getJSONObject("levels").getJSONArray("python-secure-1"))
                .put(python.getJSONObject("levels").getJSONArray("python-secure-2"))
                .put(new JSONArray(java.get(0).levels)).put(new JSONArray(java.get(1).levels))
                .put(new JSONArray(java.get(2).levels)).put(new JSONArray(java.get(3).levels));
        double exact = server.command(new JSONObject().put("cmd", "check_secure_sum").put("round_id", roundId)
                .put("levels", survivors)).getDouble("max_abs_diff");
        assertTrue(exact <= 1e-6, "the published model is the base plus the FedAvg of the 6 survivors: " + exact);
        double withDropped = server.command(new JSONObject().put("cmd", "check_secure_sum").put("round_id", roundId)
                .put("levels", new JSONArray(survivors.toString()).put(new JSONArray(java.get(4).levels))))
                .getDouble("max_abs_diff");
        assertTrue(withDropped > 1e-3, "and not the sum with the dropped device's input: " + withDropped);
    }

    /**
     * {@code count} certified Java devices, each in a thread, take part through the SDK's own participation in the
     * SecAgg+ round now open (with an all-zero input): their outcomes.
     */
    private static List<String> secureOutcomes(int count) throws Exception {
        final String[] outcomes = new String[count];
        Thread[] devices = new Thread[count];
        for (int i = 0; i < count; i++) {
            final int index = i;
            final FedzooClient device = certifiedDevice(); // certified: its own certificate is never what is attacked
            devices[i] = new Thread(() -> {
                try {
                    JSONObject work = device.flTask("digits", null).getJSONObject("task");
                    outcomes[index] = new SecureParticipation(device, new SecAggBounds(), null).takePart(work,
                            (config, privacy) -> new int[config.vectorLength + 1], () -> device.flTask("digits", null),
                            null).outcome;
                } catch (Exception failure) {
                    outcomes[index] = "error: " + failure;
                }
            });
            devices[i].start();
        }
        for (Thread device : devices) {
            device.join(120_000);
        }
        return Arrays.asList(outcomes);
    }

    private static final String THREE_DEVICE_SECURE_ROUND = "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 2, "
            + "\"threshold\": 2, \"clip_range\": 0.05, \"stage_deadline_s\": 4}}, \"poll_interval_s\": 0.1}";

    /** A lying server relays keys of its own making under the neighbours' genuine signatures: every Java device refuses. */
    @Test
    @Order(16)
    void javaDevicesRefuseKeysTheServerSubstitutedUnderTheirNeighboursSignatures() throws Exception {
        server.command(new JSONObject().put("cmd", "substitute_relayed_keys").put("on", true));
        try {
            long roundId = startRound(3, THREE_DEVICE_SECURE_ROUND);
            assertEquals(Collections.nCopies(3, "refused: bad_signature"), secureOutcomes(3));
            JSONObject view = waitUntilFinished(roundId);
            assertEquals("failed", view.getString("state"), view.toString());
        } finally {
            server.command(new JSONObject().put("cmd", "substitute_relayed_keys").put("on", false));
        }
    }

    /**
     * Issue #44: a lying server puts signing keys of its own in the neighbours' place and signs everything it relays
     * with them, through a real server: the operator certified none of those keys, and every Java device refuses.
     */
    @Test
    @Order(17)
    void javaDevicesRefuseNeighbourSigningKeysTheOperatorDidNotCertify() throws Exception {
        server.command(new JSONObject().put("cmd", "substitute_signing_keys").put("on", true));
        try {
            long roundId = startRound(3, THREE_DEVICE_SECURE_ROUND);
            assertEquals(Collections.nCopies(3, "refused: uncertified_key"), secureOutcomes(3));
            JSONObject view = waitUntilFinished(roundId);
            assertEquals("failed", view.getString("state"), view.toString());
        } finally {
            server.command(new JSONObject().put("cmd", "substitute_signing_keys").put("on", false));
        }
    }

    /**
     * Issue #44: the server enrolls two Sybils, certifies them with its own card-signing key (which devices pin for
     * cards, never for neighbours) and seats them next to three Java devices: every Java device refuses them.
     */
    @Test
    @Order(18)
    void javaDevicesRefuseSybilsTheServerSeatedWithoutTheOperatorsCertificate() throws Exception {
        long roundId = startRound(5, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 4, "
                + "\"clip_range\": 0.05, \"stage_deadline_s\": 4}}, \"poll_interval_s\": 0.1}"); // all neighbours
        server.command(new JSONObject().put("cmd", "seat_sybils").put("count", 2));
        try {
            assertEquals(Collections.nCopies(3, "refused: uncertified_key"), secureOutcomes(3));
            JSONObject view = waitUntilFinished(roundId);
            assertEquals("failed", view.getString("state"), view.toString());
        } finally {
            server.command(new JSONObject().put("cmd", "stop_sybils"));
        }
    }

    @Test
    @Order(15)
    void javaDevicesTrainClipAndTakePartInASecureDpRoundThroughTheSdksOwnParticipation() throws Exception {
        long roundId = startRound(3, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 2, "
                + "\"threshold\": 2, \"clip_range\": 0.05, \"stage_deadline_s\": 20}, \"dp\": {\"max_epsilon\": 1000.0, "
                + "\"clip_norm\": 0.5, \"noise_multiplier\": 1.0}}, \"max_accuracy_drop\": 1.0, \"poll_interval_s\": 0.1}");
        List<ParticipationResult> results = participateTogether(
                Arrays.asList(certifiedDevice(), certifiedDevice(), certifiedDevice()), "digits", server::shard,
                UpdateCodec.Encoding.INT8, 120_000);
        assertEquals(3, results.size());
        for (ParticipationResult result : results) {
            assertEquals("accepted", result.outcome, result.toString());
            assertEquals(Long.valueOf(roundId), result.roundId);
            assertTrue(result.uploadBytes > 0);
        }
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        // a DP round's read withholds its counts (docs/privacy.md): the operator's participant list has the devices
        assertFalse(view.getJSONObject("outcome").getJSONObject("secure_aggregation").has("survivors"));
        assertEquals(3, participants(roundId).getJSONArray("participants").length());
    }

    /** The newest published version of {@code family}. */
    private static ModelCard newestVersion(FedzooClient client, String family) throws Exception {
        ModelCard newest = null;
        JSONArray models = client.listModels("digits", 50, 0).getJSONArray("models");
        for (int i = 0; i < models.length(); i++) {
            ModelCard card = new ModelCard(models.getJSONObject(i));
            if (card.family().equals(family) && (newest == null || card.version() > newest.version())) {
                newest = card;
            }
        }
        return newest;
    }

    @Test
    @Order(9)
    void cardsSignedByTheOperatorAndByTheServerVerifyAgainstPinnedKeysAndForgeriesAndRollbacksAreRefused()
            throws Exception {
        // the fleet's key set, fetched out of band once (here: before the device exists) and pinned
        FedzooClient provisioning = new FedzooClient(server.url, null, TestSupport.workDirectory("provisioning"));
        CardVerifier pinned = CardVerifier.fromJson(provisioning.http().getJson("/v1/keys", null));
        ModelCard base = provisioning.card(server.ready.getString("model_id"));
        final ModelCard federated = newestVersion(provisioning, base.family()); // a round's, signed by the server
        assertNotNull(federated);
        assertTrue(federated.version() > base.version(), "earlier tests' rounds published new versions");
        assertEquals(server.ready.getString("operator_key_id"), base.signature().getString("key_id"));
        assertTrue(!federated.signature().getString("key_id").equals(base.signature().getString("key_id")),
                "a federated version is signed by the server, not by the operator");

        FedzooClient device = new FedzooClient(server.url, null, TestSupport.workDirectory("signed-cache"))
                .keepStateIn(new StateStore(TestSupport.workDirectory("signed-state"))).requireSignedCards(pinned);
        assertEquals(base.sha256(), BlobCache.sha256Of(device.downloadModel(base)));
        EdgeSession session = device.session(federated, 1);
        LocalData test = server.testSplit();
        assertTrue(EdgeSession.accuracy(session.predict(test.x), test.y) > 0.5);
        session.close();

        JSONObject forged = new JSONObject(federated.json().toString()).put("sha256", base.sha256())
                .put("size_bytes", base.sizeBytes());
        CardSignatureException tampered = assertThrows(CardSignatureException.class,
                () -> device.downloadModel(new ModelCard(forged)));
        assertEquals("field_mismatch", tampered.reason());
        CardSignatureException rolledBack = assertThrows(CardSignatureException.class, () -> device.downloadModel(base));
        assertEquals("rollback", rolledBack.reason());
        CardSignatureException stranger = assertThrows(CardSignatureException.class,
                () -> new FedzooClient(server.url, null, TestSupport.workDirectory("stranger-cache"))
                        .keepStateIn(new StateStore(TestSupport.workDirectory("stranger-state")))
                        .requireSignedCards(CardVerifier.fromJson(new JSONObject().put("keys", new JSONArray())))
                        .downloadModel(federated));
        assertEquals("unknown_key", stranger.reason());
    }

    @Test
    @Order(10)
    void servedCalibrationModelsRegisterADeviceAndItsLookupIsConfirmedOnTheDevice() throws Exception {
        FedzooClient client = new FedzooClient(server.url, null, TestSupport.workDirectory("confirming"), QUICK, 30_000);
        Map<String, byte[]> calibration = client.calibrationModels();
        assertEquals(8, calibration.size());
        assertTrue(Arrays.equals(TestSupport.read(new File(TestSupport.vectors(), "calibration/cal-tiny-fp32.onnx")),
                calibration.get("cal-tiny-fp32")), "the served model is the one Python builds");
        client.register(DeviceProfile.collect("java-confirming", 1, null, calibration), enrollmentToken());

        String serversChoice = client.lookup("digits", 50.0, null, null).getJSONObject("model").getString("id");
        JSONObject confirmed = client.lookupConfirmed("digits", 50.0, null, null, null, null);
        assertTrue(confirmed.getBoolean("confirmed"));
        assertEquals(serversChoice, confirmed.getJSONObject("model").getString("id"));
        assertEquals("measured", confirmed.getString("latency_source"));
        assertEquals(1, confirmed.getJSONArray("measurements").length());
        assertTrue(confirmed.getJSONArray("measurements").getJSONObject(0).getBoolean("fits"));
        assertEquals("device_telemetry", client.lookup("digits", 50.0, null, null).getString("latency_basis"),
                "the timing was reported");

        FedzooClient frugal = registeredDevice(server.url);
        JSONObject unconfirmed = frugal.lookupConfirmed("digits", 50.0, null, null, null,
                new ConfirmationPolicy(4, 1, 2.0, 3, 15, 3, 1));
        assertTrue(!unconfirmed.getBoolean("confirmed"));
        assertEquals(0, unconfirmed.getJSONArray("measurements").length());
        assertEquals(1, unconfirmed.getJSONArray("skipped").length());
        assertEquals(0L, unconfirmed.getLong("bytes_downloaded"));
    }

    /**
     * A distributed-DP round of three Java devices: each rounds its clipped delta within the norm bound and adds its own
     * share of the noise in the ring (the SDK's {@code ringInputOf} under the task's {@code distributed_noise}); the
     * server adds none and publishes a card stating the mechanism, the survivors it is calibrated for and the epsilon.
     */
    @Test
    @Order(17)
    void javaDevicesNoiseTheirOwnInputsInADistributedDpRound() throws Exception {
        long roundId = startRound(3, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 2, "
                + "\"threshold\": 2, \"stage_deadline_s\": 4, \"levels\": 32767}, \"dp\": {\"max_epsilon\": 50, "
                + "\"clip_norm\": 0.5, \"noise_multiplier\": 1.5, \"noise\": \"distributed\"}}, "
                + "\"poll_interval_s\": 0.1}");
        final String[] outcomes = new String[3];
        Thread[] devices = new Thread[outcomes.length];
        for (int i = 0; i < devices.length; i++) {
            final int index = i;
            final FedzooClient device = certifiedDevice();
            devices[i] = new Thread(() -> {
                try {
                    JSONObject work = device.flTask("digits", null).getJSONObject("task");
                    outcomes[index] = new SecureParticipation(device, new SecAggBounds(), null).takePart(work,
                            (config, privacy) -> {
                                float[] values = new float[config.vectorLength];
                                values[index] = 0.25f; // within the clip norm
                                java.util.Map<String, dev.fedzoo.edge.FloatTensor> delta =
                                        java.util.Collections.singletonMap("delta", new dev.fedzoo.edge.FloatTensor(
                                                new long[] {values.length}, values));
                                return SecureParticipation.ringInputOf(delta, 1, new java.util.Random(index),
                                        device.noisePolicy(), new SecAggBounds()).ringInput(config, privacy);
                            }, () -> device.flTask("digits", null), null).outcome;
                } catch (Exception failure) {
                    outcomes[index] = "error: " + failure;
                }
            });
            devices[i].start();
        }
        for (Thread device : devices) {
            device.join(120_000);
        }
        assertEquals(Arrays.asList("accepted", "accepted", "accepted"), Arrays.asList(outcomes));
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        JSONObject dp = new FedzooClient(server.url, null, TestSupport.workDirectory("reader"))
                .card(view.getString("result_model_id")).json().getJSONObject("details").getJSONObject("federated")
                .getJSONObject("privacy").getJSONObject("dp");
        assertEquals(dev.fedzoo.dp.DistributedNoise.MECHANISM, dp.getString("mechanism"));
        assertEquals(2, dp.getInt("calibrated_survivors"), dp.toString()); // the floor of 3 less the 1 corrupt withstood
        assertEquals(1.5, dp.getDouble("noise_multiplier"), 0.0);
        assertTrue(dp.getDouble("equivalent_noise_multiplier") >= 1.5, dp.toString());
        assertTrue(dp.getDouble("epsilon") > 0, dp.toString());
    }

    /**
     * Adaptive clipping under SecAgg+ (central noise) with three Java devices: the task asks for the unclipped bit,
     * each device appends it to the vector it masks (the round's vector length counts it) and the round closes with a
     * card whose noised count is one of the counts three devices can give and whose next clip norm follows from it.
     */
    @Test
    @Order(18)
    void javaDevicesAppendTheirUnclippedBitUnderSecureAggregation() throws Exception {
        long roundId = startRound(3, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 2, "
                + "\"threshold\": 2, \"stage_deadline_s\": 4}, \"dp\": {\"max_epsilon\": 50, \"clip_norm\": 0.5, "
                + "\"noise_multiplier\": 1.5, \"adaptive\": {\"clip_learning_rate\": 0.2}}}, \"poll_interval_s\": 0.1}");
        final String[] outcomes = new String[3];
        final boolean[] asked = new boolean[3];
        Thread[] devices = new Thread[outcomes.length];
        for (int i = 0; i < devices.length; i++) {
            final int index = i;
            final FedzooClient device = certifiedDevice();
            devices[i] = new Thread(() -> {
                try {
                    JSONObject work = device.flTask("digits", null).getJSONObject("task");
                    outcomes[index] = new SecureParticipation(device, new SecAggBounds(), null).takePart(work,
                            (config, privacy) -> {
                                asked[index] = privacy.optBoolean("unclipped_bit");
                                float[] values = new float[config.vectorLength - 1]; // the last one is the bit
                                values[index] = index == 0 ? 0.25f : 0.75f; // device 0 within the clip norm
                                java.util.Map<String, dev.fedzoo.edge.FloatTensor> delta =
                                        java.util.Collections.singletonMap("delta", new dev.fedzoo.edge.FloatTensor(
                                                new long[] {values.length}, values));
                                return SecureParticipation.ringInputOf(Participation.privateDelta(delta, privacy), 1,
                                        new java.util.Random(index), device.noisePolicy(), new SecAggBounds(),
                                        Participation.withinClipNorm(delta, privacy)).ringInput(config, privacy);
                            }, () -> device.flTask("digits", null), null).outcome;
                } catch (Exception failure) {
                    outcomes[index] = "error: " + failure;
                }
            });
            devices[i].start();
        }
        for (Thread device : devices) {
            device.join(120_000);
        }
        assertEquals(Arrays.asList("accepted", "accepted", "accepted"), Arrays.asList(outcomes));
        assertTrue(asked[0] && asked[1] && asked[2], "the task asks for the unclipped bit");
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("closed", view.getString("state"), view.toString());
        JSONObject dp = view.getJSONObject("outcome").getJSONObject("privacy").getJSONObject("dp");
        double fraction = dp.getDouble("noised_unclipped_fraction");
        double doubledCentredSum = (fraction - 0.5) * 2 * 3; // 2 x (count - 3 / 2) plus whole-number noise
        assertEquals(Math.rint(doubledCentredSum), doubledCentredSum, 1e-9, dp.toString());
        assertEquals(0.5 * Math.exp(-0.2 * (fraction - 0.5)), dp.getDouble("next_clip_norm"), 1e-12);
    }

    /**
     * A zoo-wide round under SecAgg+ with distributed DP on the live harness's zoo server: three certified Java
     * devices of one tier train the subnet lookup chooses for them (one cohort), each noises its own masked input as
     * the task asks (three times the plan's z: one device can make a cohort of 3 exist), and the round closes with
     * new zoo versions whose cards state their line's epsilon; the supernet's card states the mechanism.
     */
    @Test
    @Order(19)
    void javaDevicesTakePartInADistributedDpZooWideRoundAndItRepublishesTheZoo() throws Exception {
        JSONObject zoo = server.command(new JSONObject().put("cmd", "zoo_server").put("shards", 3));
        String url = zoo.getString("url");
        final String task = zoo.getString("task");
        List<FedzooClient> clients = new java.util.ArrayList<FedzooClient>();
        for (int i = 0; i < 3; i++) {
            String name = "java-zoo-device-" + i;
            FedzooClient client = new FedzooClient(url, null, TestSupport.workDirectory("device-cache"), QUICK, 30_000)
                    .keepStateIn(new StateStore(TestSupport.workDirectory("state-" + name)));
            client.register(DeviceProfile.collect(name, 1, "tier-large", null), zoo.getString("enrollment_token"));
            clients.add(client);
        }
        server.command(new JSONObject().put("cmd", "certify_zoo"));
        JSONObject opened = server.command(new JSONObject().put("cmd", "zoo_round").put("devices", 3)
                .put("noise", "distributed"));
        long roundId = opened.getLong("round_id");
        List<FedzooClient> certified = new java.util.ArrayList<FedzooClient>();
        for (FedzooClient client : clients) {
            certified.add(client.requireCertifiedNeighbours(
                    DeviceCertificates.fromJson(server.ready.getJSONObject("operator_keys"))));
        }
        zooServer = zoo;
        zooDevices = certified;
        JSONObject view = zooRoundClosesWithEveryUpdate(certified, url, task, roundId);
        FedzooClient reader = new FedzooClient(url, null, TestSupport.workDirectory("reader"));
        JSONObject dp = reader.card(view.getString("result_model_id")).json().getJSONObject("details")
                .getJSONObject("federated").getJSONObject("privacy").getJSONObject("dp");
        double z = opened.getDouble("noise_multiplier");
        assertEquals(dev.fedzoo.dp.DistributedNoise.MECHANISM, dp.getString("mechanism"));
        assertEquals(z, dp.getDouble("noise_multiplier"), 0.0);
        assertEquals(3 * z, dp.getDouble("device_noise_multiplier"), 1e-12, dp.toString());
        JSONArray models = view.getJSONObject("outcome").getJSONObject("zoo").getJSONArray("models");
        int republished = 0;
        for (int i = 0; i < models.length(); i++) {
            if (models.getJSONObject(i).getBoolean("published")) {
                JSONObject line = reader.card(models.getJSONObject(i).getString("new_model_id")).json()
                        .getJSONObject("details").getJSONObject("federated").getJSONObject("privacy")
                        .getJSONObject("dp");
                assertEquals(dp.getDouble("epsilon"), line.getDouble("epsilon"), 1e-9, line.toString());
                republished++;
            }
        }
        assertTrue(republished >= 1, view.toString());
    }

    /**
     * A zoo-wide round whose devices run BatchNorm in inference mode ({@code zoo.device_batch_norm}): the training
     * card the Java devices get holds statistics recalibrated on the plan's calibration images and its graph takes
     * and gives none, so the Java Trainer trains scales, biases and weights only; under SecAgg+ the server's layout
     * has no statistics, so a device that sent any would fail the round. It closes with new zoo versions.
     */
    @Test
    @Order(20)
    void javaDevicesTrainAnInferenceBatchNormZooWideRound() throws Exception {
        assertNotNull(zooDevices, "test 19 starts the zoo server and certifies its devices");
        String url = zooServer.getString("url");
        String task = zooServer.getString("task");
        JSONObject opened = server.command(new JSONObject().put("cmd", "zoo_round").put("devices", 3)
                .put("noise", "central").put("device_batch_norm", "inference"));
        long roundId = opened.getLong("round_id");
        JSONObject work = zooDevices.get(0).flTask(task, null).getJSONObject("task");
        assertEquals(roundId, work.getLong("round_id"));
        JSONObject training = zooDevices.get(0).card(work.getString("model_id")).json().getJSONObject("details")
                .getJSONObject("zoo_training");
        assertEquals("inference", training.getString("batch_norm"), training.toString());
        JSONObject view = zooRoundClosesWithEveryUpdate(zooDevices, url, task, roundId);
        assertTrue(view.getJSONObject("outcome").getJSONObject("zoo").getInt("new_versions") >= 1, view.toString());
    }

    /**
     * The operator's signed privacy terms on the live server: every line trains only under distributed DP with
     * z of at least 2.0. A distributed-DP round at z = 1.5 (what a server lowering z would ask), open when the terms
     * arrive (the server refuses such a plan once it holds the terms, so it is planned first), is refused by
     * default Java devices (no noise policy of their owner's), through the SDK's own participation, and the round
     * fails with no output. Last: the terms stay published for every later round.
     */
    @Test
    @Order(21)
    void defaultJavaDevicesRefuseARoundBelowTheOperatorsSignedTermsFloor() throws Exception {
        long roundId = startRound(3, "{\"privacy\": {\"secure_aggregation\": {\"neighbour_count\": 2, "
                + "\"threshold\": 2, \"stage_deadline_s\": 4, \"levels\": 32767}, \"dp\": {\"max_epsilon\": 50, "
                + "\"clip_norm\": 0.5, \"noise_multiplier\": 1.5, \"noise\": \"distributed\"}}, "
                + "\"poll_interval_s\": 0.1, \"deadline_s\": 20}");
        JSONObject every = new JSONObject().put("*", new JSONObject().put("mode", "distributed")
                .put("minimum_noise_multiplier", 2.0));
        assertEquals(1, server.command(new JSONObject().put("cmd", "publish_privacy_terms").put("version", 1)
                .put("lines", every)).getInt("version"));
        List<ParticipationResult> results = participateTogether(
                Arrays.asList(certifiedDevice(), certifiedDevice(), certifiedDevice()), "digits", server::shard,
                UpdateCodec.Encoding.FP32, 120_000);
        assertEquals(3, results.size());
        for (ParticipationResult result : results) {
            assertEquals("refused: noise_below_floor", result.outcome, result.toString());
            assertEquals(Long.valueOf(roundId), result.roundId);
        }
        JSONObject view = waitUntilFinished(roundId);
        assertEquals("failed", view.getString("state"), view.toString());
        assertTrue(view.isNull("result_model_id"), view.toString());
    }
}
