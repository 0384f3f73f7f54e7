package dev.fedzoo.dp;

import java.util.LinkedHashMap;
import java.util.Map;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.edge.FloatTensor;

/**
 * Client-side clipping for DP-FedAvg, as {@code fedzoo.dp.clipping}: the device bounds its own influence before
 * anything leaves it, which is what lets DP compose with secure aggregation (the server sees only a sum). The same
 * arithmetic as Python's: the norm in double, the scale rounded once to float, then float products (numpy sums
 * pairwise, so the two norms may differ in their last bits).
 */
public final class Clipping {
    private Clipping() {
    }

    /** The L2 norm of all of a delta's tensors together. */
    public static double l2Norm(Map<String, FloatTensor> delta) {
        double sum = 0.0;
        for (FloatTensor tensor : delta.values()) {
            double tensorSum = 0.0;
            for (float value : tensor.data()) {
                tensorSum += (double) value * value;
            }
            sum += tensorSum;
        }
        return Math.sqrt(sum);
    }

    /** The delta scaled down to L2 norm {@code clipNorm} if longer (a new map; the input is left as it is). */
    public static Map<String, FloatTensor> clip(Map<String, FloatTensor> delta, double clipNorm) {
        if (!(clipNorm > 0) || Double.isInfinite(clipNorm)) {
            throw new InvalidInputException("clip_norm must be a positive number, got " + clipNorm, "clip_norm");
        }
        double norm = l2Norm(delta);
        if (Double.isNaN(norm) || Double.isInfinite(norm)) {
            throw new InvalidInputException("the delta holds NaN or infinite values", "delta");
        }
        float scale = (float) (norm > 0 ? Math.min(1.0, clipNorm / norm) : 1.0);
        Map<String, FloatTensor> clipped = new LinkedHashMap<String, FloatTensor>();
        for (Map.Entry<String, FloatTensor> entry : delta.entrySet()) {
            float[] values = entry.getValue().data();
            float[] scaled = new float[values.length];
            for (int i = 0; i < values.length; i++) {
                scaled[i] = values[i] * scale;
            }
            clipped.put(entry.getKey(), new FloatTensor(entry.getValue().shape(), scaled));
        }
        return clipped;
    }
}
