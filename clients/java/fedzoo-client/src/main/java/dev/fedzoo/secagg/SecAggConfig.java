package dev.fedzoo.secagg;

import java.nio.ByteBuffer;
import java.nio.charset.Charset;

import org.json.JSONObject;

/**
 * A SecAgg+ round's public parameters, as {@code fedzoo.secagg.config.SecAggConfig}: the server sends them with
 * the first stage, and both sides derive the same graph, ring and signed context from them. A configuration
 * that breaks the protocol's own rules is refused ({@code malformed}); the device's stricter limits are
 * {@link SecAggBounds}.
 */
public final class SecAggConfig {
    static final Charset UTF8 = Charset.forName("UTF-8");

    public final String roundId;
    public final int numClients;
    public final int neighbourCount;
    public final int threshold;
    public final int vectorLength;
    public final double clipRange;
    public final int levels;
    public final int minimumSurvivors;

    /** Checked parameters; a {@link ProtocolViolation} ({@code malformed}) names the first broken rule. */
    public SecAggConfig(String roundId, int numClients, int neighbourCount, int threshold, int vectorLength,
                        double clipRange, int levels, int minimumSurvivors) {
        this.roundId = roundId;
        this.numClients = numClients;
        this.neighbourCount = neighbourCount;
        this.threshold = threshold;
        this.vectorLength = vectorLength;
        this.clipRange = clipRange;
        this.levels = levels;
        this.minimumSurvivors = minimumSurvivors;
        require(roundId != null && !roundId.isEmpty(), "round_id must be a non-empty string");
        require(numClients >= 3, "num_clients must be at least 3");
        require(neighbourCount >= 2 && neighbourCount < numClients && neighbourCount % 2 == 0,
                "neighbour_count must be even and lie in [2, num_clients - 1]");
        require(neighbourCount / 2.0 < threshold && threshold <= neighbourCount,
                "threshold must lie in (neighbour_count / 2, neighbour_count]");
        require(vectorLength >= 1, "vector_length must be at least 1");
        require(clipRange > 0 && !Double.isInfinite(clipRange), "clip_range must be a positive number");
        require(levels >= 1 && levels <= 32767, "levels must lie in [1, 32767]");
        require(minimumSurvivors >= leastSurvivors(threshold) && minimumSurvivors <= numClients,
                "minimum_survivors must lie in [max(3, threshold), num_clients]");
        require(2L * levels * numClients + 1 <= (1L << 32), "num_clients x levels is too large for a 32-bit ring");
    }

    /** The fewest inputs a sum may hold: 3 (with 2, each reads the other's input), and t. */
    public static int leastSurvivors(int threshold) {
        return Math.max(3, threshold);
    }

    /** The configuration the server sent ({@code task.privacy.secure_aggregation.config}). */
    public static SecAggConfig fromJson(JSONObject json) {
        if (json == null) {
            throw new ProtocolViolation("the round sent no SecAgg+ configuration", "malformed");
        }
        for (String key : new String[] {"round_id", "num_clients", "neighbour_count", "threshold", "vector_length",
                "clip_range", "levels", "minimum_survivors"}) {
            require(json.has(key) && !json.isNull(key), "the SecAgg+ configuration lacks " + key);
        }
        return new SecAggConfig(json.optString("round_id"), json.optInt("num_clients"), json.optInt("neighbour_count"),
                json.optInt("threshold"), json.optInt("vector_length"), json.optDouble("clip_range"),
                json.optInt("levels"), json.optInt("minimum_survivors"));
    }

    /** 16 when every possible sum fits in Z_{2^16} (2 x levels x n + 1 <= 2^16), else 32. */
    public int modulusBits() {
        return 2L * levels * numClients + 1 <= (1L << 16) ? 16 : 32;
    }

    /** What keys, ciphertexts and commitments of this round are bound to. */
    public byte[] context() {
        return ("round=" + roundId + ";n=" + numClients + ";k=" + neighbourCount + ";t=" + threshold).getBytes(UTF8);
    }

    /** SHA-256 of every parameter (signed along with keys and survivor sets, v2 §2). */
    public byte[] digest() {
        byte[] clip = ByteBuffer.allocate(8).putDouble(clipRange).array();
        return Crypto.sha256(Signatures.signedMessage("config", roundId.getBytes(UTF8), u32(numClients),
                u32(neighbourCount), u32(threshold), u32(vectorLength), clip, u32(levels), u32(minimumSurvivors)));
    }

    static byte[] u32(int value) {
        return ByteBuffer.allocate(4).putInt(value).array();
    }

    private static void require(boolean holds, String rule) {
        if (!holds) {
            throw new ProtocolViolation("bad SecAgg+ configuration: " + rule, "malformed");
        }
    }
}
