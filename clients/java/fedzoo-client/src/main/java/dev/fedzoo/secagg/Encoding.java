package dev.fedzoo.secagg;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.edge.FloatTensor;

/**
 * An update into the ring Z_{2^bits} that SecAgg+ sums in, as {@code fedzoo.secagg.encoding}: each coordinate
 * clipped to +-clip_range, scaled by the device's weight and rounded stochastically (unbiased) to an integer in
 * [-levels, levels] (levels 127: the int8 encoding's values, one scale for the round); the weight travels as one
 * more coordinate, so the server divides the sum of weighted deltas by the sum of weights.
 */
public final class Encoding {
    private Encoding() {
    }

    /** The delta's tensors in sorted name order, as one vector. */
    public static double[] flatten(Map<String, FloatTensor> delta) {
        List<String> names = new ArrayList<String>(delta.keySet());
        Collections.sort(names);
        int size = 0;
        for (String name : names) {
            size += delta.get(name).size();
        }
        double[] vector = new double[size];
        int at = 0;
        for (String name : names) {
            for (float value : delta.get(name).data()) {
                vector[at++] = value;
            }
        }
        return vector;
    }

    /** FedAvg's weight under SecAgg+: examples capped at {@code maxExamples}, as a fraction of it (in (0, 1]). */
    public static double exampleWeight(int numExamples, int maxExamples) {
        if (numExamples < 1 || maxExamples < 1) {
            throw new InvalidInputException("num_examples and max_examples must be at least 1", "num_examples");
        }
        return (double) Math.min(numExamples, maxExamples) / maxExamples;
    }

    /** The device's input: {@code vector_length} weighted, clipped, quantised values plus the weight, in the ring. */
    public static int[] quantise(double[] vector, SecAggConfig config, double weight, Random random) {
        if (vector.length != config.vectorLength) {
            throw new InvalidInputException("the vector must have " + config.vectorLength + " values, got " + vector.length,
                    "vector");
        }
        if (!(weight > 0 && weight <= 1)) {
            throw new InvalidInputException("weight must lie in (0, 1], got " + weight, "weight");
        }
        long weightLevel = Math.max(1, (long) Math.rint(weight * config.levels)); // round half to even, as Python
        double scale = weightLevel / config.clipRange;
        long modulus = 1L << config.modulusBits();
        int[] ring = new int[config.vectorLength + 1];
        for (int i = 0; i < vector.length; i++) {
            double value = vector[i];
            if (Double.isNaN(value) || Double.isInfinite(value)) {
                throw new InvalidInputException("the vector holds NaN or infinite values", "vector");
            }
            double scaled = Math.max(-config.clipRange, Math.min(config.clipRange, value)) * scale;
            double floor = Math.floor(scaled);
            long level = (long) floor + (random.nextDouble() < scaled - floor ? 1 : 0);
            level = Math.max(-config.levels, Math.min(config.levels, level));
            ring[i] = (int) (((level % modulus) + modulus) % modulus);
        }
        ring[config.vectorLength] = (int) weightLevel;
        return ring;
    }
}
