package dev.fedzoo.client;

import java.io.File;
import java.util.HashMap;
import java.util.Map;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.FedzooException;
import dev.fedzoo.edge.DeviceProfile;

/**
 * The device-confirmed lookup, as {@code fedzoo.clients.confirmation.confirmed_lookup}: the server's shortlist
 * (the models ranked above its choice that might truly fit, then the choice) timed on this device, most accurate
 * first; the first whose measured median fits is kept, every timing is reported as telemetry, and when none fits
 * the server is asked again (it then knows those medians). The policy bounds bytes and seconds; the answer says
 * what was measured and what was skipped. Every shortlisted model is timed through its card, as
 * {@link FedzooClient#downloadModel} loads one: with signed cards required the card verifies (signature, expiry,
 * no rollback of its line) before a byte is fetched, and the bytes must hash to the card's signed sha256, never
 * the shortlist's word, before ONNX Runtime opens them. Only this device's own timings confirm anything: an entry
 * the server labels "measured" is timed like any prediction, and a model timed earlier in this lookup counts with
 * the median measured here, never the server's figure.
 */
final class Confirmation {
    /** What creating an onnxruntime session of a small model costs, on top of its runs (as the Python SDK). */
    static final double SESSION_SETUP_S = 0.05;

    private final FedzooClient client;
    private final ConfirmationPolicy policy;
    private final double budgetMs;
    private final long startedNs = System.nanoTime();
    private final long bytesBefore;
    private final JSONArray measurements = new JSONArray();
    private final JSONArray skipped = new JSONArray();
    /** Model id to the median this device measured, in this lookup. */
    private final Map<String, Double> measuredMs = new HashMap<String, Double>();

    Confirmation(FedzooClient client, ConfirmationPolicy policy, double budgetMs) {
        this.client = client;
        this.policy = policy;
        this.budgetMs = budgetMs;
        this.bytesBefore = client.downloadedBytes();
    }

    JSONObject run(String task, Double memoryBudgetMb, Double minAccuracy, Double latencyMarginSigmas) {
        try {
            JSONObject answer = null;
            int lookups = 0;
            while (lookups < policy.maxLookups) {
                lookups++;
                answer = client.lookup(task, budgetMs, memoryBudgetMb, minAccuracy, latencyMarginSigmas,
                        policy.maxModels);
                JSONArray shortlist = answer.getJSONArray("shortlist");
                for (int i = 0; i < shortlist.length(); i++) {
                    JSONObject entry = shortlist.getJSONObject(i);
                    String modelId = entry.getString("model_id");
                    Double ownMedianMs = measuredMs.get(modelId);
                    if (ownMedianMs != null) { // the server's "measured" label is no timing of this device's
                        if (ownMedianMs <= budgetMs) {
                            return result(answer, entry, ownMedianMs, true, lookups);
                        }
                        continue;
                    }
                    String reason = overPolicy(entry);
                    if (reason != null) {
                        skipped.put(new JSONObject().put("model_id", modelId).put("reason", reason));
                        continue;
                    }
                    double measuredMs = time(entry);
                    boolean fits = measuredMs <= budgetMs;
                    measurements.put(new JSONObject().put("model_id", modelId)
                            .put("predicted_ms", entry.getDouble("latency_ms")).put("measured_ms", measuredMs)
                            .put("fits", fits).put("runs", policy.timedRuns));
                    if (fits) {
                        return result(answer, entry, measuredMs, true, lookups);
                    }
                }
                if (skipped.length() > 0 || measurements.length() == 0) {
                    break; // the policy stopped it, not the measurements: asking again would not help
                }
            }
            JSONArray shortlist = answer.getJSONArray("shortlist");
            JSONObject chosen = shortlist.getJSONObject(shortlist.length() - 1);
            return result(answer, chosen, chosen.getDouble("latency_ms"), false, lookups);
        } catch (JSONException error) {
            throw new FedzooException("unexpected lookup answer: " + error.getMessage(), error);
        }
    }

    /** Times the entry's model (downloaded through the cache), reports the timing, returns its median. */
    private double time(JSONObject entry) throws JSONException {
        String modelId = entry.getString("model_id");
        File model = client.downloadModel(client.card(modelId)); // verified and hashed: only then timed
        double[] timings = DeviceProfile.time(BlobCache.readBytes(model), policy.threads, policy.warmupRuns,
                policy.timedRuns);
        double medianMs = DeviceProfile.percentile(timings, 50);
        client.reportLatency(modelId, medianMs, DeviceProfile.percentile(timings, 90), policy.threads);
        measuredMs.put(modelId, medianMs);
        return medianMs;
    }

    /** Why timing this shortlisted model would break the policy, or null. */
    private String overPolicy(JSONObject entry) throws JSONException {
        long sizeBytes = entry.getLong("size_bytes");
        boolean cached = client.cache().get(entry.getString("sha256")) != null;
        if (!cached && client.downloadedBytes() - bytesBefore + sizeBytes > policy.maxDownloadBytes) {
            return "download of " + sizeBytes + " bytes over the policy's " + policy.maxDownloadBytes;
        }
        double expectedS = SESSION_SETUP_S + (policy.warmupRuns + policy.timedRuns) * entry.getDouble("latency_ms") / 1000.0;
        double leftS = policy.maxSeconds - secondsSpent();
        if (expectedS > leftS) {
            return String.format("timing would take about %.2f s, %.2f s left of the policy's", expectedS,
                    Math.max(leftS, 0.0));
        }
        return null;
    }

    private double secondsSpent() {
        return (System.nanoTime() - startedNs) / 1e9;
    }

    private JSONObject result(JSONObject answer, JSONObject entry, double latencyMs, boolean confirmed, int lookups)
            throws JSONException {
        JSONObject model = answer.getJSONObject("model");
        if (!entry.getString("model_id").equals(model.getString("id"))) {
            model = client.card(entry.getString("model_id")).json();
        }
        return new JSONObject().put("model", model).put("latency_ms", latencyMs).put("confirmed", confirmed)
                .put("latency_source", confirmed ? "measured" : entry.getString("latency_source"))
                .put("measurements", measurements).put("skipped", skipped).put("lookups", lookups)
                .put("seconds_spent", secondsSpent()).put("bytes_downloaded", client.downloadedBytes() - bytesBefore)
                .put("server_answer", answer);
    }
}
