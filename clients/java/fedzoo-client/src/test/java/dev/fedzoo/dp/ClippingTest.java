package dev.fedzoo.dp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;

import org.json.JSONObject;
import org.junit.jupiter.api.Test;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.edge.FloatTensor;
import dev.fedzoo.fl.Participation;

/** DP clipping on the device, and what a private round takes of a delta (weights only, clipped). */
class ClippingTest {
    private static Map<String, FloatTensor> delta(long seed, float scale) {
        Random random = new Random(seed);
        Map<String, FloatTensor> delta = new LinkedHashMap<String, FloatTensor>();
        for (String name : new String[] {"fc1.weight", "fc1.bias"}) {
            float[] values = new float[name.endsWith("weight") ? 64 : 8];
            for (int i = 0; i < values.length; i++) {
                values[i] = (float) random.nextGaussian() * scale;
            }
            delta.put(name, new FloatTensor(new long[] {values.length}, values));
        }
        return delta;
    }

    @Test
    void aLongDeltaIsScaledToTheClipNormAndKeepsItsDirection() {
        Map<String, FloatTensor> original = delta(1, 1.0f);
        double norm = Clipping.l2Norm(original);
        Map<String, FloatTensor> clipped = Clipping.clip(original, norm / 4);
        assertEquals(norm / 4, Clipping.l2Norm(clipped), norm * 1e-6);
        float[] before = original.get("fc1.weight").data();
        float[] after = clipped.get("fc1.weight").data();
        for (int i = 0; i < before.length; i++) {
            assertEquals(before[i] / 4, after[i], Math.abs(before[i]) * 1e-6 + 1e-12);
        }
        assertFalse(before == after, "the input is left as it is");
    }

    @Test
    void aShortDeltaIsLeftAsItIsAndABadClipNormIsRefused() {
        Map<String, FloatTensor> original = delta(2, 0.001f);
        Map<String, FloatTensor> clipped = Clipping.clip(original, 10.0);
        assertArrayEquals(original.get("fc1.bias").data(), clipped.get("fc1.bias").data());
        assertEquals("clip_norm", assertThrows(InvalidInputException.class, () -> Clipping.clip(original, 0.0)).field());
        assertEquals("clip_norm", assertThrows(InvalidInputException.class,
                () -> Clipping.clip(original, Double.NaN)).field());
        original.get("fc1.bias").data()[0] = Float.NaN;
        assertEquals("delta", assertThrows(InvalidInputException.class, () -> Clipping.clip(original, 1.0)).field());
    }

    @Test
    void aPrivateRoundTakesTheWeightsOnlyClippedWhenItRunsDp() throws Exception {
        Map<String, FloatTensor> trained = delta(3, 1.0f);
        trained.put("running.bn.running_mean", new FloatTensor(new long[] {2}, new float[] {0.5f, -0.5f}));
        Map<String, FloatTensor> secureOnly = Participation.privateDelta(trained, new JSONObject().put("clip_norm",
                JSONObject.NULL));
        assertEquals(2, secureOnly.size(), "the running statistics stay the parent's");
        assertArrayEquals(trained.get("fc1.weight").data(), secureOnly.get("fc1.weight").data());
        Map<String, FloatTensor> dp = Participation.privateDelta(trained, new JSONObject().put("clip_norm", 0.5));
        assertEquals(2, dp.size());
        assertEquals(0.5, Clipping.l2Norm(dp), 1e-6);
    }
}
