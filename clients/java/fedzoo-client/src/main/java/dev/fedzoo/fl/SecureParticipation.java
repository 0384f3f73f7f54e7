package dev.fedzoo.fl;

import java.util.Map;
import java.util.Random;
import java.util.Set;

import org.json.JSONObject;

import dev.fedzoo.FedzooException;
import dev.fedzoo.client.ApiException;
import dev.fedzoo.client.CardSignatureException;
import dev.fedzoo.client.FedzooClient;
import dev.fedzoo.client.StopSignal;
import dev.fedzoo.dp.DistributedNoise;
import dev.fedzoo.dp.SecureRandomSource;
import dev.fedzoo.edge.FloatTensor;
import dev.fedzoo.secagg.Encoding;
import dev.fedzoo.secagg.Framing;
import dev.fedzoo.secagg.ProtocolViolation;
import dev.fedzoo.secagg.SecAggBounds;
import dev.fedzoo.secagg.SecAggClient;
import dev.fedzoo.secagg.SecAggConfig;

/**
 * The device's part of a SecAgg+ round over REST, as {@code fedzoo.clients.secure_participation}: it never uploads
 * its delta; it quantises it into the round's ring and answers each stage the server shows it at check-in
 * ({@code task.privacy.secure_aggregation}) with a {@link SecAggClient}, whose secrets live in this call only. The
 * device refuses a server that breaks the protocol (a relayed key without its owner's signature, a survivor set
 * fewer than t neighbours signed, parameters outside its {@link SecAggBounds}, a neighbour key without the operator's
 * certificate: {@link FedzooClient#requireCertifiedNeighbours}, without which it declines every SecAgg+ round with
 * {@code operator_keys_required}) and tells the server why
 * ({@code POST .../decline}, recorded by the round); so it does a round of a protocol version it does not speak.
 */
public final class SecureParticipation {
    /** Asks the server again for this device's task ({@code GET /v1/fl/task}). */
    public interface CheckIn {
        JSONObject checkIn();
    }

    /**
     * The device's input to the round, made once the round's configuration is known, from the task's privacy settings
     * as of that stage (under distributed DP they carry the noise request only once the configuration is fixed).
     */
    public interface RingSource {
        int[] ringInput(SecAggConfig config, JSONObject privacy);
    }

    /** How taking part ended: {@code accepted}, {@code refused: <reason>}, {@code dropped out} or {@code stopped}. */
    public static final class Outcome {
        public final String outcome;
        public final long sentBytes;

        Outcome(String outcome, long sentBytes) {
            this.outcome = outcome;
            this.sentBytes = sentBytes;
        }
    }

    private final FedzooClient client;
    private final SecAggBounds bounds;
    private final Set<String> trustedSigningKeys;

    /** The participation of {@code client}'s device under {@code bounds}; {@code trustedSigningKeys} (may be null). */
    public SecureParticipation(FedzooClient client, SecAggBounds bounds, Set<String> trustedSigningKeys) {
        this.client = client;
        this.bounds = bounds;
        this.trustedSigningKeys = trustedSigningKeys;
    }

    /**
     * The ring input of a trained (clipped under DP) delta, as Python's {@code ring_input}: weighted (equal under DP,
     * else by capped examples) and quantised, with adaptive clipping ({@code privacy.unclipped_bit}) followed by
     * whether the delta was {@code within} the clip norm before clipping ({@link #withUnclippedBit}); under
     * distributed DP ({@code privacy.distributed_noise}) rounded within the norm bound and noised by this device from
     * its CSPRNG, after checking the request against the signed config (the honest survivors its floor guarantees
     * under {@code bounds}) and {@code policy}.
     */
    public static RingSource ringInputOf(final Map<String, FloatTensor> delta, final int numExamples,
                                         final Random random, final DistributedNoise.Policy policy,
                                         final SecAggBounds bounds, final boolean within) {
        return new RingSource() {
            public int[] ringInput(SecAggConfig config, JSONObject privacy) {
                if (privacy.has("clip_norm") && !privacy.isNull("clip_norm")) {
                    JSONObject requested = privacy.optJSONObject("distributed_noise");
                    DistributedNoise noise = requested != null ? DistributedNoise.fromJson(requested) : null;
                    DistributedNoise.check(noise, bounds.honestSurvivors(config), policy);
                    if (noise != null) {
                        return noise.noisedRingInput(Encoding.flatten(delta), privacy.optDouble("clip_norm"),
                                config.levels, config.modulusBits(), new SecureRandomSource());
                    }
                }
                double weight = privacy.optBoolean("equal_weights") ? 1.0
                        : Encoding.exampleWeight(numExamples, privacy.optInt("max_examples", numExamples));
                double[] vector = Encoding.flatten(delta);
                if (privacy.optBoolean("unclipped_bit")) {
                    vector = withUnclippedBit(vector, within, config.clipRange);
                }
                return Encoding.quantise(vector, config, weight, random);
            }
        };
    }

    /** The ring input of a delta that was within the clip norm (or of a round without adaptive clipping). */
    public static RingSource ringInputOf(Map<String, FloatTensor> delta, int numExamples, Random random,
                                         DistributedNoise.Policy policy, SecAggBounds bounds) {
        return ringInputOf(delta, numExamples, random, policy, bounds, true);
    }

    /**
     * A flattened delta with its "not clipped" bit appended in clip-range units (0 or clipRange), as Python's
     * {@code fedzoo.aggregation.private.with_unclipped_bit}: under SecAgg+ the server learns only how many were 1.
     */
    public static double[] withUnclippedBit(double[] vector, boolean within, double clipRange) {
        double[] extended = java.util.Arrays.copyOf(vector, vector.length + 1);
        extended[vector.length] = within ? clipRange : 0.0;
        return extended;
    }

    /**
     * Before training on {@code lineId}, as Python's {@code round_noise_policy}: the policy this round must meet (the
     * owner's, made stricter by the operator's privacy terms, fetched first where the device pins operator keys), with
     * the task checked against it ({@link DistributedNoise#checkTaskPrivacy}); {@link ProtocolViolation}
     * {@code bad_privacy_terms} for served terms no operator key signed, older than or different under the version of
     * the terms held, and the task's refusal otherwise.
     */
    public static DistributedNoise.Policy roundNoisePolicy(FedzooClient client, String lineId, JSONObject privacy) {
        if (client.neighbourTrust() != null) {
            try {
                client.refreshPrivacyTerms();
            } catch (CardSignatureException refused) {
                throw new ProtocolViolation("the server's privacy terms are refused (" + refused.reason() + "): "
                        + refused.getMessage(), "bad_privacy_terms");
            }
        }
        DistributedNoise.Policy policy = client.noisePolicyFor(lineId);
        DistributedNoise.checkTaskPrivacy(privacy, policy);
        return policy;
    }

    /** Answers every SecAgg+ stage the server asks of this device in the round of {@code work}. */
    public Outcome takePart(JSONObject work, RingSource input, CheckIn checkIn, StopSignal stop) {
        long roundId = work.optLong("round_id");
        JSONObject privacy = work.optJSONObject("privacy");
        JSONObject secure = privacy.optJSONObject("secure_aggregation");
        if (secure.optInt("version") != Capabilities.SECURE_AGGREGATION_VERSION) {
            return decline(roundId, "unsupported_secure_aggregation", "the round speaks SecAgg+ version "
                    + secure.opt("version") + "; this device speaks " + Capabilities.SECURE_AGGREGATION_VERSION, 0);
        }
        SecAggClient protocol = null;
        int[] ring = null;
        long sent = 0;
        while (true) {
            String stage = secure.optString("stage");
            if (!stage.equals("selection") && !stage.equals("done") && secure.isNull("client")) {
                return new Outcome("refused: not_in_cohort", sent);
            }
            JSONObject request = secure.optJSONObject("request");
            if (request != null) {
                if (client.signingKey() == null) {
                    return new Outcome("refused: signing_key_required", sent);
                }
                if (client.neighbourTrust() == null) {
                    return decline(roundId, "operator_keys_required", "this device has no operator key set to check its "
                            + "neighbours' certificates against (FedzooClient.requireCertifiedNeighbours)", sent);
                }
                Object reply;
                try {
                    if (protocol == null) {
                        protocol = new SecAggClient(SecAggConfig.fromJson(secure.optJSONObject("config")),
                                secure.optInt("client"), client.signingKey(), bounds, trustedSigningKeys,
                                client.signedRounds(), client.neighbourTrust().policy(client.servedRevocationList()));
                        ring = input.ringInput(protocol.config(), privacy);
                    }
                    reply = answer(protocol, stage, request, ring);
                } catch (ProtocolViolation violation) {
                    return decline(roundId, violation.reason(), violation.getMessage(), sent);
                }
                String refused = deliver(secure.optString("reply_url"), reply);
                sent += reply instanceof byte[] ? ((byte[]) reply).length : reply.toString().length();
                if (refused != null) {
                    return new Outcome(refused, sent);
                }
                if (stage.equals("unmask")) {
                    return new Outcome("accepted", sent);
                }
            } else if (stage.equals("done")) {
                return new Outcome("dropped out", sent);
            }
            if (stop != null && stop.isStopped()) {
                return new Outcome("stopped", sent);
            }
            client.http().sleepS(secure.optDouble("retry_after_s", 1.0));
            JSONObject next = checkIn.checkIn().optJSONObject("task");
            if (next == null || next.optLong("round_id") != roundId) {
                return new Outcome("dropped out", sent);
            }
            privacy = next.optJSONObject("privacy");
            secure = privacy.optJSONObject("secure_aggregation");
        }
    }

    /** This device's reply to one stage, as the REST endpoint takes it: JSON, or framed or raw bytes. */
    static Object answer(SecAggClient protocol, String stage, JSONObject request, int[] ring) {
        if (stage.equals("advertise_keys")) {
            return withoutStageAndClient(protocol.advertiseKeys());
        }
        if (stage.equals("share_keys")) {
            return Framing.encodeShareKeys(protocol.shareKeys(request));
        }
        if (stage.equals("masked_input")) {
            return protocol.maskedInput(request, ring);
        }
        if (stage.equals("consistency_check")) {
            return withoutStageAndClient(protocol.consistencyCheck(request));
        }
        if (stage.equals("unmask")) {
            return Framing.encodeUnmask(protocol.unmask(request));
        }
        throw new ProtocolViolation("the server asks for an unknown stage '" + stage + "'", "wrong_stage");
    }

    private static JSONObject withoutStageAndClient(JSONObject reply) {
        reply.remove("stage"); // the URL and the token say them
        reply.remove("client");
        return reply;
    }

    /** Sends a reply (re-sent while the server cannot be reached); null when stored, else "refused: <code>". */
    private String deliver(String replyUrl, Object reply) {
        try {
            client.secureReply(replyUrl, reply);
            return null;
        } catch (ApiException.Conflict conflict) {
            return conflict.code().equals("duplicate_reply") ? null : "refused: " + conflict.code();
        } catch (ApiException refused) {
            return "refused: " + refused.code();
        }
    }

    /** Tells the server why this device stops (the round records it); "refused: <reason>" either way. */
    public Outcome decline(long roundId, String reason, String message, long sent) {
        try {
            client.declineTask(roundId, reason, message);
        } catch (FedzooException unrecorded) {
            // a server that broke the protocol may not listen; the device stops all the same
        }
        return new Outcome("refused: " + reason, sent);
    }
}
