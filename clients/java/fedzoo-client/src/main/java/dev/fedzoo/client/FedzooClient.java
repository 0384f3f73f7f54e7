package dev.fedzoo.client;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.UUID;
import java.util.function.LongSupplier;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.FedzooException;
import dev.fedzoo.InvalidInputException;
import dev.fedzoo.ModelCard;
import dev.fedzoo.dp.DistributedNoise;
import dev.fedzoo.edge.DeviceProfile;
import dev.fedzoo.edge.EdgeSession;
import dev.fedzoo.fl.Capabilities;
import dev.fedzoo.secagg.DeviceCertificates;
import dev.fedzoo.secagg.Signatures;
import dev.fedzoo.secagg.SignedRounds;

/**
 * One device's session with one fedzoo server, as {@code fedzoo.clients.client.FedzooClient}: register, look up
 * the best model, download it (resumable, sha256-checked, cached), run it, report its latency, and the
 * federated-learning calls. Every call blocks: call it off Android's main thread. The SDK starts no threads.
 *
 * <pre>{@code
 * FedzooClient client = new FedzooClient("https://models.example", null, new File(context.getCacheDir(), "fedzoo"))
 *         .keepStateIn(new StateStore(new File(context.getFilesDir(), "fedzoo")));   // token survives restarts
 * client.register(DeviceProfile.collect("phone-17", 1, null, calibrationModels), enrollmentToken);
 * JSONObject choice = client.lookup("mnist", 5.0, null, null);
 * ModelCard card = new ModelCard(choice.getJSONObject("model"));
 * EdgeSession session = client.session(card, 1);            // signature (if pinned), sha256, then onnxruntime
 * int[] classes = session.predict(images);
 * }</pre>
 */
public class FedzooClient {
    /** The SDK's version, sent in the User-Agent. */
    public static final String VERSION = "0.1.0";
    private static final int DOWNLOAD_ATTEMPTS = 5;

    private final FedzooHttp http;
    private final BlobCache cache;
    private static final LongSupplier SYSTEM_CLOCK_MS = new LongSupplier() {
        @Override
        public long getAsLong() {
            return System.currentTimeMillis();
        }
    };
    /** Refresh the device token once this share of its lifetime has passed (as the Python SDK). */
    private static final double REFRESH_AT_LIFETIME_FRACTION = 0.5;

    /** The state's key for the device's long-term SecAgg+ signing key (raw Ed25519 private key, base64), as Python's. */
    static final String SIGNING_KEY_STATE = "secagg_signing_key";

    private CardVerifier verifier;
    private NeighbourTrust neighbourTrust;
    private DistributedNoise.Policy noisePolicy = DistributedNoise.Policy.permissive();
    private StateStore state;
    private SignedRounds signedRounds = new SignedRounds();
    private String deviceId;
    private Ed25519PrivateKeyParameters signingKey;
    private long tokenRefreshAtMs = -1;
    private LongSupplier clockMs = SYSTEM_CLOCK_MS;
    private long downloadedBytes;
    private long uploadedBytes;

    /** A client of {@code baseUrl} with a device token (null before registering) and a blob cache directory. */
    public FedzooClient(String baseUrl, String token, File cacheDir) {
        this(baseUrl, token, cacheDir, new RetryPolicy(), 30_000);
    }

    /** A client with its own retry policy and connect/read timeout (milliseconds). */
    public FedzooClient(String baseUrl, String token, File cacheDir, RetryPolicy retry, int timeoutMs) {
        this.http = new FedzooHttp(baseUrl, token, retry, timeoutMs);
        this.cache = new BlobCache(cacheDir);
    }

    /**
     * This device's clock (Unix milliseconds; the system clock by default), which decides when the token is due for
     * refresh and whether a card's signature has expired (the Python SDK's {@code clock}).
     */
    public FedzooClient withClock(LongSupplier clockMs) {
        this.clockMs = clockMs;
        return this;
    }

    /**
     * Keeps this device's identity in {@code state} (server, device id, token and when to refresh it, accepted card
     * versions), and takes a token saved there earlier when none was given: a restarted app carries on.
     */
    public FedzooClient keepStateIn(final StateStore state) {
        this.state = state;
        this.signedRounds = new SignedRounds() {
            @Override
            public void claim(String roundId) {
                state.claimSignedRound(roundId);
            }
        };
        JSONObject saved = state.load();
        deviceId = saved.optString("device_id", null);
        if (signingKey == null && saved.has(SIGNING_KEY_STATE)) {
            signingKey = new Ed25519PrivateKeyParameters(Base64.decode(saved.optString(SIGNING_KEY_STATE)), 0);
        }
        if (http.token() == null && saved.has("token")) {
            http.setToken(saved.optString("token"));
            tokenRefreshAtMs = saved.optLong("token_refresh_at_ms", -1);
        }
        return this;
    }

    /**
     * Verify every card against {@code verifier}'s pinned keys before its model is downloaded or loaded, refusing
     * versions below the newest one accepted for the card's model line (kept in the {@link #keepStateIn state},
     * which this needs, so a restart cannot be used to roll a device back).
     */
    public FedzooClient requireSignedCards(CardVerifier verifier) {
        if (state == null) {
            throw new IllegalStateException("signed cards need keepStateIn(...) first: accepted versions must persist");
        }
        this.verifier = verifier;
        return this;
    }

    /**
     * Accept a SecAgg+ neighbour's key only with the operator's certificate, checked against {@code operatorKeys} (the
     * operator key set, {@code fedzoo keys export-public}; never {@code GET /v1/keys}, which holds the server's key)
     * and the newest revocation list held in the {@link #keepStateIn state}, which this needs (the operator keys
     * also verify that list). Without it, this device
     * declines SecAgg+ rounds ({@code operator_keys_required}).
     */
    public FedzooClient requireCertifiedNeighbours(DeviceCertificates operatorKeys) {
        if (state == null) {
            throw new IllegalStateException("certified neighbours need keepStateIn(...) first: the newest revocation "
                    + "list must persist");
        }
        this.neighbourTrust = new NeighbourTrust(operatorKeys, state);
        return this;
    }

    /**
     * This device's terms for DP under SecAgg+ (Python's {@code noise_policy}): require that it adds its own share of
     * the noise, or a floor on the noise multiplier; a request outside them is refused.
     */
    public FedzooClient withNoisePolicy(DistributedNoise.Policy policy) {
        this.noisePolicy = policy;
        return this;
    }

    /** The device's terms for DP under SecAgg+ ({@link #withNoisePolicy}; permissive by default). */
    public DistributedNoise.Policy noisePolicy() {
        return noisePolicy;
    }

    /** The pinned operator keys and held revocation list ({@link #requireCertifiedNeighbours}), or null. */
    public NeighbourTrust neighbourTrust() {
        return neighbourTrust;
    }

    /** Whether cards must verify against pinned keys ({@link #requireSignedCards}). */
    public boolean signedCardsRequired() {
        return verifier != null;
    }

    /** The SecAgg+ round ids this device took part in: kept in the {@link #keepStateIn state} where there is one. */
    public SignedRounds signedRounds() {
        return signedRounds;
    }

    /** The HTTP layer (token, retries, sleeper). */
    public FedzooHttp http() {
        return http;
    }

    /** The blob cache downloads go through. */
    public BlobCache cache() {
        return cache;
    }

    /** The device token in use, or null before registering. */
    public String token() {
        return http.token();
    }

    /** This device's id once registered (or loaded from the state), else null. */
    public String deviceId() {
        return deviceId;
    }

    /** The device's long-term SecAgg+ signing key (made at registration, kept in the state), or null. */
    public Ed25519PrivateKeyParameters signingKey() {
        return signingKey;
    }

    /** Bytes this client transferred in downloads (0 for cache hits). */
    public long downloadedBytes() {
        return downloadedBytes;
    }

    /** Bytes of update archives this client uploaded and the server accepted. */
    public long uploadedBytes() {
        return uploadedBytes;
    }

    // registry ----------------------------------------------------------------------------------------

    /**
     * Registers this device, with the fleet's enrollment token (null where the server enrolls openly); the token
     * in the answer is kept for every later call (and in the {@link #keepStateIn state}), and refreshed at half its
     * lifetime when the server says how long it lives. Not re-sent after an ambiguous failure: a second
     * registration would be refused as a duplicate.
     */
    public JSONObject register(DeviceProfile profile, String enrollmentToken) {
        Map<String, String> headers = enrollmentToken == null ? null
                : Collections.singletonMap("Authorization", "Bearer " + enrollmentToken);
        String deviceToken = http.token();
        http.setToken(null); // an old device token is no enrollment credential
        Ed25519PrivateKeyParameters newSigningKey = Signatures.newSigningKey(); // a new identity, a new key
        JSONObject registration;
        try {
            JSONObject body = profile.toJson().put("signing_public_key",
                    Base64.toBase64String(Signatures.publicBytes(newSigningKey)));
            registration = http.request("POST", "/v1/devices", body.toString().getBytes(FedzooHttp.UTF8),
                    "application/json", headers, FedzooHttp.Resend.UNSAFE, 201).json();
        } catch (JSONException impossible) {
            throw new IllegalStateException(impossible);
        } finally {
            http.setToken(deviceToken);
        }
        signingKey = newSigningKey;
        if (state != null) {
            state.put(SIGNING_KEY_STATE, Base64.toBase64String(newSigningKey.getEncoded()));
        }
        deviceId = registration.optString("device_id");
        keepToken(registration.optString("token"), registration.optLong("token_expires_in_s", -1));
        return registration;
    }

    /**
     * Trades the device token for a fresh one ({@code POST /v1/devices/<id>/token}; the server keeps the old one
     * valid for a short grace). Called by every device call once half the token's lifetime has passed.
     */
    public JSONObject refreshToken() {
        if (deviceId == null) {
            throw new IllegalStateException("register first: refreshing a token needs this device's id");
        }
        JSONObject answer = http.request("POST", "/v1/devices/" + deviceId + "/token", new byte[0], "application/json", null,
                FedzooHttp.Resend.UNSAFE, 201).json();
        keepToken(answer.optString("token"), answer.optLong("token_expires_in_s", -1));
        return answer;
    }

    private void keepToken(String token, long lifetimeS) {
        // on this device's clock, so a skewed clock cannot make it refresh too late
        http.setToken(token);
        tokenRefreshAtMs = lifetimeS >= 0 ? clockMs.getAsLong() + Math.round(lifetimeS * 1000 * REFRESH_AT_LIFETIME_FRACTION) : -1;
        if (state != null) {
            JSONObject saved = state.load();
            try {
                saved.put("server", http.baseUrl()).put("device_id", deviceId).put("token", token)
                        .put("token_refresh_at_ms", tokenRefreshAtMs);
            } catch (JSONException error) {
                throw new FedzooException("cannot save the token: " + error.getMessage());
            }
            state.save(saved);
        }
    }

    private void refreshTokenIfDue() {
        if (tokenRefreshAtMs >= 0 && deviceId != null && clockMs.getAsLong() >= tokenRefreshAtMs) {
            refreshToken();
        }
    }

    /** One page of published models ({@code task} may be null): {@code {"models": [...], ...}}. */
    public JSONObject listModels(String task, int limit, int offset) {
        Map<String, String> query = new LinkedHashMap<String, String>();
        query.put("limit", String.valueOf(limit));
        query.put("offset", String.valueOf(offset));
        if (task != null) {
            query.put("task", task);
        }
        return http.getJson("/v1/models", query);
    }

    /**
     * A published model's card ({@code GET /v1/models/<id>}); {@link IntegrityException} when the server answers
     * another model's card (a signed card of another model verifies: only this check stops it passing for the
     * one asked for).
     */
    public ModelCard card(String modelId) {
        ModelCard card = new ModelCard(http.getJson("/v1/models/" + modelId, null));
        if (!modelId.equals(card.id())) {
            throw new IntegrityException("asked for the card of '" + modelId + "', the server answered the card of '"
                    + card.id() + "'");
        }
        return card;
    }

    /**
     * The server's choice for this device: {@code model} (the card), {@code latency_ms}, {@code reason},
     * {@code runner_up}. The memory budget and minimum accuracy may be null.
     */
    public JSONObject lookup(String task, double latencyBudgetMs, Double memoryBudgetMb, Double minAccuracy) {
        return lookup(task, latencyBudgetMs, memoryBudgetMb, minAccuracy, null, null);
    }

    /**
     * The lookup with a margin ({@code latency_margin_sigmas}: a model fits when its latency times
     * exp(margin x {@code latency_log_sigma}) fits the budget) and, with {@code shortlistMaxModels}, the
     * {@code shortlist} to time on the device. Any option may be null.
     */
    public JSONObject lookup(String task, double latencyBudgetMs, Double memoryBudgetMb, Double minAccuracy,
                             Double latencyMarginSigmas, Integer shortlistMaxModels) {
        JSONObject body = new JSONObject();
        try {
            body.put("task", task).put("latency_budget_ms", latencyBudgetMs);
            if (memoryBudgetMb != null) {
                body.put("memory_budget_mb", memoryBudgetMb.doubleValue());
            }
            if (minAccuracy != null) {
                body.put("min_accuracy", minAccuracy.doubleValue());
            }
            if (latencyMarginSigmas != null) {
                body.put("latency_margin_sigmas", latencyMarginSigmas.doubleValue());
            }
            if (shortlistMaxModels != null) {
                body.put("shortlist_max_models", shortlistMaxModels.intValue());
            }
        } catch (JSONException error) {
            throw new FedzooException("invalid lookup value: " + error.getMessage());
        }
        refreshTokenIfDue();
        return http.postJson("/v1/lookup", body, FedzooHttp.Resend.SAFE, 200); // a lookup changes nothing
    }

    /**
     * The lookup confirmed on this device: the server's shortlist timed here, the most accurate model that
     * measured within the budget kept, every timing reported. The answer has {@code model}, {@code latency_ms},
     * {@code confirmed}, {@code measurements}, {@code skipped}, {@code seconds_spent}, {@code bytes_downloaded}.
     */
    public JSONObject lookupConfirmed(String task, double latencyBudgetMs, Double memoryBudgetMb, Double minAccuracy,
                                      Double latencyMarginSigmas, ConfirmationPolicy policy) {
        return new Confirmation(this, policy == null ? ConfirmationPolicy.DEFAULT : policy, latencyBudgetMs)
                .run(task, memoryBudgetMb, minAccuracy, latencyMarginSigmas);
    }

    /**
     * The server's calibration models by name (downloaded through the cache), to time for registration:
     * {@code DeviceProfile.collect(deviceId, threads, deviceClass, client.calibrationModels())}.
     */
    public Map<String, byte[]> calibrationModels() {
        Map<String, byte[]> models = new LinkedHashMap<String, byte[]>();
        int offset = 0;
        while (offset >= 0) {
            Map<String, String> query = new LinkedHashMap<String, String>();
            query.put("limit", "200");
            query.put("offset", String.valueOf(offset));
            JSONObject page = http.getJson("/v1/calibration-models", query);
            try {
                JSONArray entries = page.getJSONArray("calibration_models");
                for (int i = 0; i < entries.length(); i++) {
                    JSONObject entry = entries.getJSONObject(i);
                    models.put(entry.getString("name"), BlobCache.readBytes(downloadBlob(entry.getString("sha256"))));
                }
                offset = page.isNull("next_offset") ? -1 : page.getInt("next_offset");
            } catch (JSONException error) {
                throw new FedzooException("unexpected calibration-models answer: " + error.getMessage(), error);
            }
        }
        return models;
    }

    // blobs -------------------------------------------------------------------------------------------

    /**
     * Checks the card's signature when signed cards are required; otherwise does nothing. Called before any
     * byte of the card's model is fetched or loaded.
     */
    public void verifyCard(ModelCard card) {
        if (verifier == null) {
            return;
        }
        verifier.verify(card, clockMs.getAsLong(), state.acceptedVersion(card.lineId()), state.acceptedCardId(card.lineId()));
        RevocationList revocations = state.revocationList();
        if (revocations != null) {
            revocations.refuseRevoked(card);
        }
        state.acceptCard(card.lineId(), card.version(), card.id());
    }

    /**
     * Fetches the operator's signed revocation list ({@code GET /v1/revocations}) and keeps it in the
     * {@link #keepStateIn state} when it is newer than the one held; from then on {@link #downloadModel} refuses
     * the cards it revokes and SecAgg+ rounds the device keys it revokes. It is verified against the operator keys
     * ({@link #requireCertifiedNeighbours}), or the pinned card keys where no operator keys are pinned. A list none of
     * them signed, an older one (a server rolling a revocation back) or another list under the held version throws
     * {@link CardSignatureException}. Returns the list held (null when the server has none and nothing is held).
     */
    public RevocationList refreshRevocations() {
        if (verifier == null && neighbourTrust == null) {
            throw new InvalidInputException("a revocation list is verified against the pinned keys: "
                    + "requireCertifiedNeighbours or requireSignedCards first", "operator_keys");
        }
        JSONObject document = servedRevocationList();
        if (document == null) {
            return state.revocationList(); // none published: keep whatever this device holds
        }
        return state.holdRevocationList(neighbourTrust != null ? neighbourTrust.operatorKeys().operatorKeys()
                : verifier.keys(), document);
    }

    /** The operator's newest signed revocation list as the server serves it, not yet verified (null: none). */
    public JSONObject servedRevocationList() {
        try {
            return http.getJson("/v1/revocations", null);
        } catch (ApiException.NotFound none) {
            return null;
        }
    }

    /**
     * Fetches the operator's signed privacy terms ({@code GET /v1/privacy-terms}) and keeps them when newer than the
     * ones held ({@link #holdPrivacyTerms}); returns the terms held (null when neither the server nor this device
     * has any). Needs {@link #requireCertifiedNeighbours}: the terms are verified against the operator keys.
     */
    public PrivacyTerms refreshPrivacyTerms() {
        JSONObject document;
        try {
            document = http.getJson("/v1/privacy-terms", null);
        } catch (ApiException.NotFound none) {
            return operatorTrust().heldPrivacyTerms(); // none published: keep whatever this device holds
        }
        return holdPrivacyTerms(document);
    }

    /**
     * Verifies privacy terms against the operator keys and keeps them when newer than the ones held (an app may
     * ship the terms it was built with, so that a server cannot withhold them from a fresh install);
     * {@link CardSignatureException} for terms no operator key signed, older ones or others under the held version.
     */
    public PrivacyTerms holdPrivacyTerms(JSONObject document) {
        return state.holdPrivacyTerms(operatorTrust().operatorKeys().operatorKeys(), document);
    }

    /**
     * This device's policy for a round on {@code lineId}: the owner's {@link #withNoisePolicy}, made at least as
     * strict as the operator's privacy terms held for the line.
     */
    public DistributedNoise.Policy noisePolicyFor(String lineId) {
        return DistributedNoise.policyFor(neighbourTrust != null ? state.privacyTerms() : null, lineId, noisePolicy);
    }

    private NeighbourTrust operatorTrust() {
        if (neighbourTrust == null) {
            throw new InvalidInputException("privacy terms are verified against the operator keys: "
                    + "requireCertifiedNeighbours first", "operator_keys");
        }
        return neighbourTrust;
    }

    /**
     * The model's ONNX file in the cache (card verified if required, then downloaded, resumed or reused). With
     * signed cards required, a cached file is hashed again, so a file altered on disk since is refused too.
     */
    public File downloadModel(ModelCard card) {
        verifyCard(card);
        File model = download("/v1/models/" + card.id() + "/blob", card.sha256());
        if (verifier != null && !BlobCache.sha256Of(model).equals(card.sha256())) {
            BlobCache.deleteQuietly(model);
            throw new IntegrityException("cached blob " + model + " does not hash to " + card.sha256()
                    + " as card '" + card.id() + "' signs; discarded");
        }
        return model;
    }

    /** Any blob (a training graph, an artifact) by digest, through the cache. */
    public File downloadBlob(String sha256) {
        return download("/v1/blobs/" + sha256, sha256);
    }

    /** The blob at {@code urlPath} (expected to hash to {@code sha256}) through the cache. */
    public File download(String urlPath, String sha256) {
        BlobCache.Fetched fetched = cache.fetch(http, urlPath, sha256, DOWNLOAD_ATTEMPTS);
        downloadedBytes += fetched.transferredBytes;
        return fetched.path;
    }

    // inference and telemetry ------------------------------------------------------------------------------

    /** An {@link EdgeSession} of the card's model (downloaded if needed), applying the card's normalisation. */
    public EdgeSession session(ModelCard card, int threads) {
        return new EdgeSession(BlobCache.readBytes(downloadModel(card)), card, threads);
    }

    /** Tells the server how fast the model ran here, so later lookups use this device's own figure. */
    public JSONObject reportLatency(String modelId, double medianMs, Double p90Ms, Integer threads) {
        JSONObject body = new JSONObject();
        try {
            body.put("model_id", modelId).put("median_ms", medianMs);
            if (p90Ms != null) {
                body.put("p90_ms", p90Ms.doubleValue());
            }
            if (threads != null) {
                body.put("threads", threads.intValue());
            }
        } catch (JSONException error) {
            throw new FedzooException("invalid telemetry value: " + error.getMessage());
        }
        refreshTokenIfDue();
        return http.postJson("/v1/telemetry", body, FedzooHttp.Resend.UNSAFE, 201);
    }

    // federated learning ----------------------------------------------------------------------------------

    /** Checks in, declaring what this SDK can do: {@code {"task": {...} | null, "retry_after_s": ...}}; {@code family} may be null. */
    public JSONObject flTask(String task, String family) {
        return flTask(task, family, Capabilities.JAVA_SDK);
    }

    /** Checks in, declaring {@code capabilities} (the server hands out only tasks they cover). */
    public JSONObject flTask(String task, String family, Capabilities capabilities) {
        Map<String, String> query = new LinkedHashMap<String, String>();
        query.put("task", task);
        if (family != null) {
            query.put("family", family);
        }
        query.putAll(capabilities.toQuery());
        refreshTokenIfDue();
        return http.getJson("/v1/fl/task", query);
    }

    /** Tells the server this device will not do round {@code roundId}'s task, and why (the round records it). */
    public JSONObject declineTask(long roundId, String reason, String message) {
        JSONObject body = new JSONObject();
        try {
            body.put("reason", reason).put("message", message.length() > 500 ? message.substring(0, 500) : message);
        } catch (JSONException impossible) {
            throw new IllegalStateException(impossible);
        }
        refreshTokenIfDue();
        return http.postJson("/v1/fl/rounds/" + roundId + "/decline", body, FedzooHttp.Resend.SAFE, 201);
    }

    /** Sends this device's reply to a SecAgg+ stage: a JSON object, or the framed or raw bytes the stage takes. */
    public JSONObject secureReply(String replyUrl, Object reply) {
        refreshTokenIfDue();
        boolean raw = reply instanceof byte[];
        byte[] body = raw ? (byte[]) reply : reply.toString().getBytes(FedzooHttp.UTF8);
        JSONObject receipt = http.request("POST", replyUrl, body, raw ? "application/octet-stream" : "application/json",
                null, FedzooHttp.Resend.SAFE, 201).json();
        uploadedBytes += body.length;
        return receipt;
    }

    /** A round's state, counts and outcome ({@code GET /v1/fl/rounds/<id>}): needs the viewer or admin token. */
    public JSONObject flRound(long roundId) {
        refreshTokenIfDue();
        return http.getJson("/v1/fl/rounds/" + roundId, null);
    }

    /**
     * Sends one update (multipart: {@code metadata} JSON field + {@code delta} .npz file); returns the server's
     * receipt. Re-sent after an ambiguous failure: the server answers a repeat with 409 {@code duplicate_update}.
     */
    public JSONObject uploadUpdate(String uploadUrl, JSONObject metadata, byte[] deltaNpz) {
        refreshTokenIfDue();
        String boundary = "fedzoo-" + UUID.randomUUID();
        ByteArrayOutputStream body = new ByteArrayOutputStream(deltaNpz.length + 1024);
        writeText(body, "--" + boundary + "\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n"
                + metadata + "\r\n--" + boundary + "\r\nContent-Disposition: form-data; name=\"delta\"; "
                + "filename=\"delta.npz\"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.write(deltaNpz, 0, deltaNpz.length);
        writeText(body, "\r\n--" + boundary + "--\r\n");
        JSONObject receipt = http.request("POST", uploadUrl, body.toByteArray(), "multipart/form-data; boundary=" + boundary,
                null, FedzooHttp.Resend.SAFE, 201).json();
        uploadedBytes += deltaNpz.length;
        return receipt;
    }

    private static void writeText(ByteArrayOutputStream out, String text) {
        byte[] bytes = text.getBytes(FedzooHttp.UTF8);
        out.write(bytes, 0, bytes.length);
    }
}
