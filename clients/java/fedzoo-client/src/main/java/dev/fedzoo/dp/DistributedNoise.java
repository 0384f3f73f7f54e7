package dev.fedzoo.dp;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

import org.json.JSONObject;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.client.PrivacyTerms;
import dev.fedzoo.secagg.ProtocolViolation;

/**
 * Distributed DP under SecAgg+, as {@code fedzoo.dp.distributed}: the device adds its share of discrete Gaussian
 * noise to its ring input before masking (Kairouz, Liu and Steinke 2021), calibrated so that the sum of the round's
 * fewest survivors carries the plan's noise multiplier. The same steps and float operations as Python's (the shared
 * vectors {@code tests/vectors/distributed_noise_vectors.json}): scale to the grid clip_norm / levels, round each
 * coordinate up when a little-endian uint32 draw is below its fraction x 2^32, redraw until the squared norm is within
 * {@link #normBoundSquared}, add N_Z(0, sigma^2) per coordinate, append the weight (levels) and reduce into the ring.
 */
public final class DistributedNoise {
    public static final String MECHANISM = "distributed-discrete-gaussian";
    /** float32 clipping lands within ~1e-7 of C; the bound itself is enforced on the integers. */
    static final double NORM_TOLERANCE = 1e-5;
    static final int ROUNDING_ATTEMPTS = 1000;
    private static final BigInteger SIGMA_SQUARED_DENOMINATOR = BigInteger.valueOf(1L << 20);

    public final double noiseMultiplier;
    public final int survivors;

    public DistributedNoise(double noiseMultiplier, int survivors) {
        if (!(noiseMultiplier > 0) || Double.isInfinite(noiseMultiplier)) {
            throw new InvalidInputException("noise_multiplier must be a positive number, got " + noiseMultiplier,
                    "noise_multiplier");
        }
        if (survivors < 1) {
            throw new InvalidInputException("survivors must be a whole number >= 1, got " + survivors, "survivors");
        }
        this.noiseMultiplier = noiseMultiplier;
        this.survivors = survivors;
    }

    /** The request a task carries ({@code privacy.distributed_noise}). */
    public static DistributedNoise fromJson(JSONObject json) {
        if (!MECHANISM.equals(json.optString("mechanism"))) {
            throw new InvalidInputException("unknown noise mechanism '" + json.optString("mechanism") + "'",
                    "mechanism");
        }
        return new DistributedNoise(json.optDouble("noise_multiplier", Double.NaN), json.optInt("survivors", 0));
    }

    /** The device's terms for DP under SecAgg+, as Python's {@code NoisePolicy}. */
    public static final class Policy {
        public final boolean requireDistributed;
        public final Double minimumNoiseMultiplier;

        public Policy(boolean requireDistributed, Double minimumNoiseMultiplier) {
            this.requireDistributed = requireDistributed;
            this.minimumNoiseMultiplier = minimumNoiseMultiplier;
        }

        /** What both policies require (the owner's and the operator's privacy terms), as Python's {@code stricter}. */
        public Policy stricter(Policy other) {
            Double floor = minimumNoiseMultiplier == null ? other.minimumNoiseMultiplier
                    : other.minimumNoiseMultiplier == null ? minimumNoiseMultiplier
                    : Double.valueOf(Math.max(minimumNoiseMultiplier, other.minimumNoiseMultiplier));
            return new Policy(requireDistributed || other.requireDistributed, floor);
        }

        /** Central noise allowed, no floor (Python's default). */
        public static Policy permissive() {
            return new Policy(false, null);
        }
    }

    /** The squared norm a rounded update may have: levels^2 + levels + floor(d/4 + sqrt(d)/2) (beta = e^-1/2). */
    public static long normBoundSquared(int levels, int dimension) {
        return (long) levels * levels + levels + (long) Math.floor(dimension / 4.0 + Math.sqrt(dimension) / 2);
    }

    /** Each device's sigma^2 in grid steps as {numerator, denominator} in lowest terms (Python's Fraction). */
    public BigInteger[] sigmaSquared(int levels, int dimension) {
        double bound = Math.sqrt((double) normBoundSquared(levels, dimension));
        double sigma = noiseMultiplier * bound / Math.sqrt(survivors);
        BigInteger numerator = new BigDecimal(Math.ceil((sigma * sigma + 1) * 1048576.0)).toBigIntegerExact();
        BigInteger common = numerator.gcd(SIGMA_SQUARED_DENOMINATOR);
        return new BigInteger[] {numerator.divide(common), SIGMA_SQUARED_DENOMINATOR.divide(common)};
    }

    /**
     * Refuse a request the device must not follow (the reasons Python's {@code check_noise_request} gives);
     * {@code honestSurvivors} is {@link dev.fedzoo.secagg.SecAggBounds#honestSurvivors} of the signed config.
     */
    public static void check(DistributedNoise noise, int honestSurvivors, Policy policy) {
        if (noise == null) {
            if (policy.requireDistributed) {
                throw new ProtocolViolation("this device adds its own share of DP noise under SecAgg+, and the round "
                        + "asks the server to add it (central noise: the server would see the noiseless sum)",
                        "noise_not_distributed");
            }
            return;
        }
        if (noise.survivors > honestSurvivors) {
            throw new ProtocolViolation("the noise is calibrated for " + noise.survivors + " honest survivors, but a sum "
                    + "the round unmasks may hold only " + honestSurvivors + ": it would carry less than the accounted "
                    + "noise", "noise_survivors_above_floor");
        }
        if (policy.minimumNoiseMultiplier != null && noise.noiseMultiplier < policy.minimumNoiseMultiplier) {
            throw new ProtocolViolation("noise multiplier " + noise.noiseMultiplier + " is below this device's floor "
                    + policy.minimumNoiseMultiplier, "noise_below_floor");
        }
    }

    /**
     * The policy for a round on {@code lineId}, as Python's {@code policy_for}: {@code own} (the owner's), made at
     * least as strict as the operator's privacy terms for the line; {@code own} where the terms are null or do not
     * cover the line.
     */
    public static Policy policyFor(PrivacyTerms terms, String lineId, Policy own) {
        Double floor = terms == null ? null : terms.minimumNoiseMultiplierFor(lineId);
        return floor == null ? own : own.stricter(new Policy(true, floor));
    }

    /**
     * Before training, as Python's {@code check_task_privacy}: {@link ProtocolViolation}
     * {@code noise_not_distributed} for a task that cannot carry the device's own noise where the policy requires it
     * (no DP clipping or no SecAgg+). The noise request is checked once the SecAgg+ config is fixed ({@link #check}).
     */
    public static void checkTaskPrivacy(JSONObject privacy, Policy policy) {
        if (!policy.requireDistributed) {
            return;
        }
        if (privacy == null || privacy.isNull("clip_norm") || privacy.optJSONObject("secure_aggregation") == null) {
            throw new ProtocolViolation("this device requires distributed DP under SecAgg+ on this line (the "
                    + "operator's privacy terms or its owner's policy), and the round asks for no DP or no SecAgg+ (the "
                    + "update would leave without this device's noise)", "noise_not_distributed");
        }
    }

    /** KLS's conditional randomized rounding of the scaled vector, redrawn until within {@code boundSquared}. */
    static long[] roundConditionally(double[] scaled, long boundSquared, SecureRandomSource source) {
        long[] rounded = new long[scaled.length];
        for (int attempt = 0; attempt < ROUNDING_ATTEMPTS; attempt++) {
            ByteBuffer draws = ByteBuffer.wrap(source.read(4 * scaled.length)).order(ByteOrder.LITTLE_ENDIAN);
            long squared = 0;
            for (int i = 0; i < scaled.length; i++) {
                double floor = Math.floor(scaled[i]);
                double draw = (double) (draws.getInt() & 0xffffffffL);
                rounded[i] = (long) floor + (draw < (scaled[i] - floor) * 4294967296.0 ? 1 : 0);
                squared += rounded[i] * rounded[i];
            }
            if (squared <= boundSquared) {
                return rounded;
            }
        }
        throw new InvalidInputException("no rounding within the norm bound in " + ROUNDING_ATTEMPTS + " attempts: the "
                + "vector is not clipped to the round's clip norm", "vector");
    }

    /**
     * The device's SecAgg+ input under distributed DP: its clipped delta (L2 norm at most clipNorm) on the grid,
     * rounded within the bound, noised, with weight 1 (levels) appended, as ring values (int bits of Z_2^bits).
     */
    public int[] noisedRingInput(double[] clipped, double clipNorm, int levels, int modulusBits,
                                 SecureRandomSource source) {
        double squaredNorm = 0;
        for (double value : clipped) {
            if (Double.isNaN(value) || Double.isInfinite(value)) {
                throw new InvalidInputException("the update must be a finite vector", "vector");
            }
            squaredNorm += value * value;
        }
        if (Math.sqrt(squaredNorm) > clipNorm * (1 + NORM_TOLERANCE)) {
            throw new InvalidInputException("the update's norm " + Math.sqrt(squaredNorm) + " is above clip_norm "
                    + clipNorm, "vector");
        }
        double scale = levels / clipNorm;
        double[] scaled = new double[clipped.length];
        for (int i = 0; i < clipped.length; i++) {
            scaled[i] = clipped[i] * scale;
        }
        long[] rounded = roundConditionally(scaled, normBoundSquared(levels, clipped.length), source);
        BigInteger[] sigmaSquared = sigmaSquared(levels, clipped.length);
        long modulus = 1L << modulusBits;
        int[] ring = new int[clipped.length + 1];
        for (int i = 0; i < clipped.length; i++) {
            long value = rounded[i] + DiscreteGaussian.sample(sigmaSquared[0], sigmaSquared[1], source);
            ring[i] = (int) (((value % modulus) + modulus) % modulus);
        }
        ring[clipped.length] = levels;
        return ring;
    }
}
