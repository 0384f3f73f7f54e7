package dev.fedzoo.fl;

import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.FedzooException;
import dev.fedzoo.InvalidInputException;
import dev.fedzoo.ModelCard;
import dev.fedzoo.client.ApiException;
import dev.fedzoo.client.BlobCache;
import dev.fedzoo.client.CardSignatureException;
import dev.fedzoo.client.FedzooClient;
import dev.fedzoo.client.StateStore;
import dev.fedzoo.client.StopSignal;
import dev.fedzoo.client.Timestamps;
import dev.fedzoo.codec.UpdateCodec;
import dev.fedzoo.dp.Clipping;
import dev.fedzoo.dp.DistributedNoise;
import dev.fedzoo.edge.Adam;
import dev.fedzoo.edge.EdgeSession;
import dev.fedzoo.edge.FloatTensor;
import dev.fedzoo.edge.OnnxInitializers;
import dev.fedzoo.edge.Optimizer;
import dev.fedzoo.edge.Sgd;
import dev.fedzoo.edge.Trainer;
import dev.fedzoo.secagg.ProtocolViolation;
import dev.fedzoo.secagg.SecAggBounds;

/**
 * The device's part of federated learning, as {@code fedzoo.clients.participation}: check in, download the
 * round's model and training graph, train locally on private data, send back only the weight delta.
 *
 * <p>{@link #participateOnce} does one check-in and returns instead of sleeping: with no task, the result carries
 * the server's {@code retry_after_s}, so an Android job can finish and be rescheduled. A {@link StopSignal} is
 * checked between batches and between requests. With a {@link StateStore}, a trained update is saved before it is
 * sent and removed only once the server confirmed it, so an update trained before the process died is re-sent by
 * the next check-in (a 409 {@code duplicate_update} then means an earlier attempt got through: delivered).
 *
 * <p>In a private round ({@code task.privacy}) the delta is first reduced to the weights and clipped for DP
 * ({@link #privateDelta}); under SecAgg+ it never leaves the device: {@link SecureParticipation} runs the stages.
 * The server hands private tasks only to devices that declared they can do them ({@link Capabilities}); a
 * refusal (a server that broke the protocol, another protocol version) is told to the server, which records it.
 */
public final class Participation {
    /** The batch order of each epoch: a permutation of {@code 0..size-1}. */
    public interface BatchOrder {
        int[] permutation(int epoch, int size);
    }

    /** The training result: the delta ({@code trained - global}) per parameter and the local loss and accuracy. */
    public static final class TrainingResult {
        public final Map<String, FloatTensor> delta;
        public final Map<String, Double> metrics;

        TrainingResult(Map<String, FloatTensor> delta, Map<String, Double> metrics) {
            this.delta = delta;
            this.metrics = metrics;
        }
    }

    /** Thrown inside training when the stop signal is set; {@link Participation} turns it into outcome "stopped". */
    public static final class StoppedException extends FedzooException {
        private static final long serialVersionUID = 1L;

        StoppedException() {
            super("stopped by the stop signal");
        }
    }

    private final FedzooClient client;
    private final StateStore state;
    private final Random random = new Random();
    private int threads = 1;
    private SecAggBounds bounds = new SecAggBounds();
    private Set<String> trustedSigningKeys;

    /** Participation of {@code client}'s device; {@code state} (may be null) keeps unsent updates across restarts. */
    public Participation(FedzooClient client, StateStore state) {
        this.client = client;
        this.state = state;
    }

    /**
     * The device's own limits on a SecAgg+ round's parameters (default {@link SecAggBounds#SecAggBounds()}) and,
     * when the operator pins them on the device, the enrolled devices' signing keys (base64; null: any).
     */
    public Participation secureAggregation(SecAggBounds bounds, Set<String> trustedSigningKeys) {
        this.bounds = bounds;
        this.trustedSigningKeys = trustedSigningKeys;
        return this;
    }

    /** Intra-op threads for training (default 1, as the Python trainer). */
    public Participation threads(int threads) {
        this.threads = threads;
        return this;
    }

    /** Epoch orders drawn from one {@link Random} seeded with {@code seed} (Fisher–Yates). */
    public static BatchOrder shuffled(long seed) {
        final Random random = new Random(seed);
        return new BatchOrder() {
            public int[] permutation(int epoch, int size) {
                int[] order = new int[size];
                for (int i = 0; i < size; i++) {
                    order[i] = i;
                }
                for (int i = size - 1; i > 0; i--) {
                    int j = random.nextInt(i + 1);
                    int swap = order[i];
                    order[i] = order[j];
                    order[j] = swap;
                }
                return order;
            }
        };
    }

    /** The optimizer a round's {@code training} config names ({@code sgd} with momentum, or {@code adam}). */
    public static Optimizer optimizerFor(JSONObject training) {
        String name = training.optString("optimizer");
        double learningRate = training.optDouble("learning_rate");
        if (name.equals("sgd")) {
            return new Sgd(learningRate, training.optDouble("momentum", 0.0));
        }
        if (name.equals("adam")) {
            return new Adam(learningRate);
        }
        throw new InvalidInputException("unknown optimizer '" + name + "'; this client knows [adam, sgd]", "optimizer");
    }

    /**
     * Fine-tunes the model's trainable parameters on local data with the round's optimizer, epochs and batch size,
     * adding FedProx's {@code proximal_mu * (w - w_global)} to every gradient; returns the delta and local metrics.
     * A graph built with {@code batch_norm="training"} also updates the BatchNorm running statistics, whose change
     * travels in the delta as {@code running.<name>} (the server averages them apart from the parameters).
     */
    public static TrainingResult trainLocally(byte[] trainingGraph, byte[] model, ModelCard card, JSONObject training,
                                              LocalData data, BatchOrder order, StopSignal stop, int threads) {
        Optimizer optimizer = optimizerFor(training);
        int epochs = training.optInt("local_epochs", 1);
        int batchSize = training.optInt("batch_size", 32);
        float proximalMu = (float) training.optDouble("proximal_mu", 0.0);
        if (batchSize < 1 || epochs < 1) {
            throw new InvalidInputException("local_epochs and batch_size must be >= 1", "training");
        }
        Trainer trainer = Trainer.fromInferenceModel(trainingGraph, model, optimizer, threads);
        try {
            Map<String, FloatTensor> global = new LinkedHashMap<String, FloatTensor>();
            for (String name : trainer.parameterNames()) {
                global.put(name, trainer.parameters().get(name).copy());
            }
            Map<String, FloatTensor> globalStatistics = new LinkedHashMap<String, FloatTensor>();
            for (Map.Entry<String, FloatTensor> statistic : trainer.statistics().entrySet()) {
                globalStatistics.put(statistic.getKey(), statistic.getValue().copy());
            }
            FloatTensor features = EdgeSession.normalise(data.x, card.normalisationMean(), card.normalisationStd());
            double weightedLoss = 0.0;
            for (int epoch = 0; epoch < epochs; epoch++) {
                int[] permutation = order.permutation(epoch, data.size());
                for (int start = 0; start < permutation.length; start += batchSize) {
                    if (stop != null && stop.isStopped()) {
                        throw new StoppedException();
                    }
                    int end = Math.min(start + batchSize, permutation.length);
                    Trainer.LossAndGradients result = trainer.lossAndGradients(gather(features, permutation, start, end),
                            gatherLabels(data.y, permutation, start, end));
                    if (proximalMu != 0f) {
                        for (String name : trainer.parameterNames()) {
                            float[] gradient = result.gradients.get(name).data();
                            float[] parameter = trainer.parameters().get(name).data();
                            float[] anchor = global.get(name).data();
                            for (int i = 0; i < gradient.length; i++) {
                                gradient[i] += proximalMu * (parameter[i] - anchor[i]);
                            }
                        }
                    }
                    trainer.apply(result);
                    weightedLoss += (double) result.loss * (end - start);
                }
            }
            Map<String, FloatTensor> delta = new LinkedHashMap<String, FloatTensor>();
            for (String name : trainer.parameterNames()) {
                delta.put(name, difference(trainer.parameters().get(name), global.get(name)));
            }
            for (Map.Entry<String, FloatTensor> statistic : trainer.statistics().entrySet()) {
                delta.put(Trainer.RUNNING_PREFIX + statistic.getKey(),
                        difference(statistic.getValue(), globalStatistics.get(statistic.getKey())));
            }
            Map<String, FloatTensor> trainedState = new LinkedHashMap<String, FloatTensor>(trainer.parameters());
            trainedState.putAll(trainer.statistics());
            EdgeSession session = new EdgeSession(OnnxInitializers.replace(model, trainedState), null, threads);
            double accuracy;
            try {
                accuracy = EdgeSession.accuracy(EdgeSession.argmax(session.run(features, false)), data.y);
            } finally {
                session.close();
            }
            Map<String, Double> metrics = new LinkedHashMap<String, Double>();
            metrics.put("loss", weightedLoss / ((double) data.size() * epochs));
            metrics.put("accuracy", accuracy);
            return new TrainingResult(delta, metrics);
        } finally {
            trainer.close();
        }
    }

    private static FloatTensor difference(FloatTensor trained, FloatTensor anchor) {
        float[] values = trained.data();
        float[] start = anchor.data();
        float[] difference = new float[values.length];
        for (int i = 0; i < values.length; i++) {
            difference[i] = values[i] - start[i];
        }
        return new FloatTensor(anchor.shape(), difference);
    }

    /** One check-in: first any update kept from an earlier attempt, else the task's work if this device was selected. */
    public ParticipationResult participateOnce(String task, LocalData data, UpdateCodec.Encoding encoding, String family,
                                               StopSignal stop) {
        if (stopped(stop)) {
            return outcome(null, "stopped");
        }
        if (state != null) {
            List<StateStore.PendingUpdate> pending = state.pending();
            if (!pending.isEmpty()) {
                return deliver(pending.get(0));
            }
        }
        JSONObject answer = client.flTask(task, family);
        JSONObject work = answer.optJSONObject("task");
        if (work == null) {
            Double retryAfterS = answer.isNull("retry_after_s") ? null : answer.optDouble("retry_after_s");
            return new ParticipationResult(null, "no task", 0, 0, Collections.<String, Double>emptyMap(), retryAfterS);
        }
        return runTask(work, data, encoding, random.nextLong(), stop, task, family);
    }

    /** The work of one task: download, train locally (batch order from {@code seed}), upload. */
    public ParticipationResult runTask(JSONObject work, LocalData data, UpdateCodec.Encoding encoding, long seed,
                                       StopSignal stop) {
        return runTask(work, data, encoding, seed, stop, null, null);
    }

    /**
     * The work of one task, where SecAgg+ stages check in again for {@code checkedInTask} and {@code checkedInFamily}
     * (the ones this device asked for work on; null: the model card's, but a zoo-wide round's training card names
     * its subnet's task, not the zoo's).
     */
    public ParticipationResult runTask(JSONObject work, LocalData data, UpdateCodec.Encoding encoding, long seed,
                                       StopSignal stop, String checkedInTask, String checkedInFamily) {
        try {
            long roundId = work.getLong("round_id");
            ModelCard card = client.card(work.getString("model_id"));
            client.verifyCard(card);
            if (client.signedCardsRequired() && (!card.sha256().equals(work.getString("model_sha256"))
                    || !work.getString("training_graph_sha256").equals(card.trainingGraph()))) {
                throw new CardSignatureException("round " + roundId + " names blobs its signed card "
                        + card.id() + " does not", "field_mismatch");
            }
            if (stopped(stop)) {
                return outcome(roundId, "stopped");
            }
            byte[] model = BlobCache.readBytes(client.download(work.getString("model_url"), work.getString("model_sha256")));
            if (stopped(stop)) {
                return outcome(roundId, "stopped");
            }
            byte[] graph = BlobCache.readBytes(client.download(work.getString("training_graph_url"), work.getString("training_graph_sha256")));
            JSONObject privacy = work.optJSONObject("privacy");
            DistributedNoise.Policy policy;
            try { // after the card verified (signed cards required): its line is the one the terms are checked for
                policy = SecureParticipation.roundNoisePolicy(client, card.lineId(), privacy);
            } catch (ProtocolViolation refused) {
                String outcome = new SecureParticipation(client, bounds, trustedSigningKeys).decline(roundId,
                        refused.reason(), refused.getMessage(), 0).outcome;
                return new ParticipationResult(roundId, outcome, 0, 0, Collections.<String, Double>emptyMap(), null);
            }
            TrainingResult trained;
            try {
                trained = trainLocally(graph, model, card, work.getJSONObject("training"), data, shuffled(seed), stop, threads);
            } catch (StoppedException stoppedInTraining) {
                return outcome(roundId, "stopped");
            }
            JSONObject metadata = new JSONObject().put("base_version", work.getInt("base_version"))
                    .put("num_examples", data.size()).put("metrics", new JSONObject(trained.metrics));
            if (!finite(trained)) {
                // the server would refuse it (422); a model that diverged here is no update worth the bytes
                return new ParticipationResult(roundId, "diverged", 0, data.size(), trained.metrics, null);
            }
            Map<String, FloatTensor> delta = privacy != null ? privateDelta(trained.delta, privacy) : trained.delta;
            if (privacy != null && privacy.optJSONObject("secure_aggregation") != null) {
                SecureParticipation.Outcome secure = new SecureParticipation(client, bounds, trustedSigningKeys).takePart(
                        work, SecureParticipation.ringInputOf(delta, data.size(), random, policy,
                                bounds, withinClipNorm(trained.delta, privacy)),
                        new SecureParticipation.CheckIn() {
                            public JSONObject checkIn() {
                                return checkedInTask != null ? client.flTask(checkedInTask, checkedInFamily)
                                        : client.flTask(card.task(), card.family());
                            }
                        }, stop);
                return new ParticipationResult(roundId, secure.outcome, secure.sentBytes, data.size(), trained.metrics,
                        null);
            }
            JSONArray accepted = work.getJSONObject("upload").getJSONArray("encodings");
            UpdateCodec.Encoding chosen = contains(accepted, encoding.wireName()) ? encoding : UpdateCodec.Encoding.FP32;
            StateStore.PendingUpdate update = new StateStore.PendingUpdate(roundId, work.getJSONObject("upload").getString("url"),
                    metadata, work.getString("deadline_at"), chosen.wireName(), UpdateCodec.encode(delta, chosen));
            if (state != null) {
                state.savePending(update);
            }
            if (stopped(stop)) {
                return outcome(roundId, "stopped"); // the saved update goes out at the next check-in
            }
            return deliver(update);
        } catch (JSONException error) {
            throw new FedzooException("the server's task is not what this client understands: " + error.getMessage(), error);
        }
    }

    /**
     * What a private round (DP-FedAvg and/or SecAgg+) takes of a trained delta: the weights only (the running
     * statistics stay the parent's, as the server aggregates them), clipped to the round's DP clip norm if it has one.
     */
    public static Map<String, FloatTensor> privateDelta(Map<String, FloatTensor> delta, JSONObject privacy) {
        Map<String, FloatTensor> weights = weightsOf(delta);
        return privacy.isNull("clip_norm") ? weights : Clipping.clip(weights, privacy.optDouble("clip_norm"));
    }

    private static Map<String, FloatTensor> weightsOf(Map<String, FloatTensor> delta) {
        Map<String, FloatTensor> weights = new LinkedHashMap<String, FloatTensor>();
        for (Map.Entry<String, FloatTensor> entry : delta.entrySet()) {
            if (!entry.getKey().startsWith(Trainer.RUNNING_PREFIX)) {
                weights.put(entry.getKey(), entry.getValue());
            }
        }
        return weights;
    }

    /**
     * Whether a trained delta's weights were within the round's DP clip norm before clipping (adaptive clipping's
     * "unclipped" bit, as Python's {@code clip_for_privacy}); true without DP.
     */
    public static boolean withinClipNorm(Map<String, FloatTensor> delta, JSONObject privacy) {
        return privacy.isNull("clip_norm") || Clipping.l2Norm(weightsOf(delta)) <= privacy.optDouble("clip_norm");
    }

    /**
     * Sends a trained update and forgets it once the server decided: accepted (201, or 409 {@code duplicate_update}
     * for an earlier attempt that got through) or refused. Kept when the server could not be reached.
     */
    public ParticipationResult deliver(StateStore.PendingUpdate update) {
        int examples = update.metadata.optInt("num_examples");
        Map<String, Double> metrics = metricsOf(update.metadata.optJSONObject("metrics"));
        String outcome = "accepted";
        if (System.currentTimeMillis() >= Timestamps.parseMillis(update.deadlineAt)) {
            outcome = "expired";
        } else {
            try {
                client.uploadUpdate(update.uploadUrl, update.metadata, update.delta);
            } catch (ApiException.Conflict conflict) {
                if (!conflict.code().equals("duplicate_update")) {
                    outcome = "refused: " + conflict.code();
                }
            } catch (ApiException.Authentication unauthenticated) {
                throw unauthenticated; // the update stays: it goes out once the device has a valid token again
            } catch (ApiException refused) {
                outcome = "refused: " + refused.code();
            }
        }
        if (state != null) {
            state.removePending(update.roundId);
        }
        long bytes = outcome.equals("accepted") ? update.delta.length : 0;
        return new ParticipationResult(update.roundId, outcome, bytes, examples, metrics, null);
    }

    static FloatTensor gather(FloatTensor features, int[] order, int start, int end) {
        long[] shape = features.shape();
        int rowSize = features.size() / (int) shape[0];
        float[] rows = new float[(end - start) * rowSize];
        for (int i = start; i < end; i++) {
            System.arraycopy(features.data(), order[i] * rowSize, rows, (i - start) * rowSize, rowSize);
        }
        shape[0] = end - start;
        return new FloatTensor(shape, rows);
    }

    static long[] gatherLabels(long[] labels, int[] order, int start, int end) {
        long[] out = new long[end - start];
        for (int i = start; i < end; i++) {
            out[i - start] = labels[order[i]];
        }
        return out;
    }

    private static boolean finite(TrainingResult trained) {
        for (FloatTensor value : trained.delta.values()) {
            for (float v : value.data()) {
                if (Float.isNaN(v) || Float.isInfinite(v)) {
                    return false;
                }
            }
        }
        for (double metric : trained.metrics.values()) {
            if (Double.isNaN(metric) || Double.isInfinite(metric)) {
                return false;
            }
        }
        return true;
    }

    private static Map<String, Double> metricsOf(JSONObject metrics) {
        Map<String, Double> out = new HashMap<String, Double>();
        if (metrics != null) {
            for (Iterator<String> names = metrics.keys(); names.hasNext();) {
                String name = names.next();
                out.put(name, metrics.optDouble(name));
            }
        }
        return out;
    }

    private static boolean contains(JSONArray values, String wanted) {
        for (int i = 0; i < values.length(); i++) {
            if (wanted.equals(values.optString(i))) {
                return true;
            }
        }
        return false;
    }

    private static boolean stopped(StopSignal stop) {
        return stop != null && stop.isStopped();
    }

    private static ParticipationResult outcome(Long roundId, String outcome) {
        return new ParticipationResult(roundId, outcome, 0, 0, Collections.<String, Double>emptyMap(), null);
    }
}
