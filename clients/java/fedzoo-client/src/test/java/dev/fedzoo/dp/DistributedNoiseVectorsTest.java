package dev.fedzoo.dp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.math.BigInteger;

import org.bouncycastle.util.encoders.Hex;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;
import dev.fedzoo.secagg.ProtocolViolation;

/**
 * The shared distributed-DP vectors ({@code tests/vectors/distributed_noise_vectors.json}, written by Python's
 * {@code tests/vectors/distributed_noise_vectors.py}): from the same seeded stream, the Java device scales, rounds,
 * bounds and noises its update into exactly the ring values the Python device does.
 */
class DistributedNoiseVectorsTest {
    private static JSONObject vectors;

    @BeforeAll
    static void read() throws Exception {
        vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/distributed_noise_vectors.json")), TestSupport.UTF8));
    }

    private static byte[] utf8(String text) {
        return text.getBytes(TestSupport.UTF8);
    }

    @Test
    void theSeededStreamAndRejectionSamplingDrawTheSameIntegers() throws Exception {
        JSONObject stream = vectors.getJSONObject("stream");
        assertEquals(stream.getString("first_48_bytes"), Hex.toHexString(new SeededStream(utf8("stream")).read(48)));
        JSONObject below = stream.getJSONObject("below");
        SeededStream source = new SeededStream(utf8(below.getString("seed")));
        JSONArray bounds = below.getJSONArray("bounds");
        for (int i = 0; i < bounds.length(); i++) {
            assertEquals(BigInteger.valueOf(below.getJSONArray("values").getLong(i)),
                    source.below(BigInteger.valueOf(bounds.getLong(i))));
        }
    }

    @Test
    void theDiscreteGaussianSamplerDrawsTheSameValues() throws Exception {
        JSONObject gaussian = vectors.getJSONObject("discrete_gaussian");
        JSONArray sigmaSquared = gaussian.getJSONArray("sigma_squared");
        SeededStream source = new SeededStream(utf8(gaussian.getString("seed")));
        JSONArray values = gaussian.getJSONArray("values");
        for (int i = 0; i < values.length(); i++) {
            assertEquals(values.getLong(i), DiscreteGaussian.sample(BigInteger.valueOf(sigmaSquared.getLong(0)),
                    BigInteger.valueOf(sigmaSquared.getLong(1)), source));
        }
    }

    @Test
    void everyCaseGivesTheSameBoundSigmaAndRingValues() throws Exception {
        JSONArray cases = vectors.getJSONArray("cases");
        for (int c = 0; c < cases.length(); c++) {
            JSONObject item = cases.getJSONObject(c);
            JSONArray vectorJson = item.getJSONArray("vector");
            double[] vector = new double[vectorJson.length()];
            for (int i = 0; i < vector.length; i++) {
                vector[i] = vectorJson.getDouble(i);
            }
            int levels = item.getInt("levels");
            DistributedNoise noise = DistributedNoise.fromJson(item.getJSONObject("noise"));
            assertEquals(item.getLong("norm_bound_squared"), DistributedNoise.normBoundSquared(levels, vector.length));
            BigInteger[] sigma = noise.sigmaSquared(levels, vector.length);
            assertEquals(item.getJSONArray("sigma_squared").getLong(0), sigma[0].longValue(), item.getString("name"));
            assertEquals(item.getJSONArray("sigma_squared").getLong(1), sigma[1].longValue(), item.getString("name"));
            int[] ring = noise.noisedRingInput(vector, item.getDouble("clip_norm"), levels, item.getInt("modulus_bits"),
                    new SeededStream(utf8(item.getString("seed"))));
            JSONArray expected = item.getJSONArray("ring");
            long[] expectedRing = new long[expected.length()];
            long[] actualRing = new long[ring.length];
            for (int i = 0; i < ring.length; i++) {
                actualRing[i] = ring[i] & 0xffffffffL;
            }
            for (int i = 0; i < expectedRing.length; i++) {
                expectedRing[i] = expected.getLong(i);
            }
            assertArrayEquals(expectedRing, actualRing, item.getString("name"));
        }
    }

    @Test
    void aRequestCalibratedAboveTheSurvivorFloorOrDroppedIsRefused() {
        ProtocolViolation above = assertThrows(ProtocolViolation.class, () ->
                DistributedNoise.check(new DistributedNoise(1.0, 30), 4, DistributedNoise.Policy.permissive()));
        assertEquals("noise_survivors_above_floor", above.reason());
        ProtocolViolation dropped = assertThrows(ProtocolViolation.class, () ->
                DistributedNoise.check(null, 4, new DistributedNoise.Policy(true, null)));
        assertEquals("noise_not_distributed", dropped.reason());
        ProtocolViolation weak = assertThrows(ProtocolViolation.class, () ->
                DistributedNoise.check(new DistributedNoise(0.2, 4), 4, new DistributedNoise.Policy(false, 0.5)));
        assertEquals("noise_below_floor", weak.reason());
        DistributedNoise.check(new DistributedNoise(1.0, 4), 4, DistributedNoise.Policy.permissive());
        DistributedNoise.check(null, 4, DistributedNoise.Policy.permissive());
        assertTrue(DistributedNoise.normBoundSquared(127, 100) > 127L * 127);
    }
}
