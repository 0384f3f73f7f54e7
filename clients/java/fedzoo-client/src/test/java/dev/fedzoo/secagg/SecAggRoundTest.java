package dev.fedzoo.secagg;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.crypto.params.X25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.Test;

/**
 * Whole SecAgg+ rounds of Java devices in this process, with an in-memory relay playing the server (as Python's
 * {@code tests/secagg/test_protocol.py} does): the sum the relay unmasks is the exact sum of the survivors' inputs,
 * whoever drops after key sharing, in the 16-bit and the 32-bit ring. The masking arithmetic and the ring encoding
 * of {@link SecAggClient#maskedInput} refuse nothing, so only an exact sum shows them wrong.
 */
class SecAggRoundTest {
    /**
     * Five devices, each the neighbour of the four others, threshold 3: the devices' bounds here tolerate one corrupt
     * device (t > (k + 1) / 2), so the round still unmasks when one of five drops.
     */
    private static final SecAggBounds ONE_CORRUPT = new SecAggBounds(0.05, 1, 4, 200, 65_536);

    private static SecAggConfig config(String roundId, int levels) {
        return new SecAggConfig(roundId, 5, 4, 3, 6, 0.5, levels, 3);
    }

    /** Each device's ring input: whole numbers in [0, 2 x levels], what {@link Encoding#quantise} gives. */
    private static int[][] inputs(SecAggConfig config, long seed) {
        Random random = new Random(seed);
        int[][] inputs = new int[config.numClients][config.vectorLength + 1];
        for (int[] input : inputs) {
            for (int i = 0; i < input.length; i++) {
                input[i] = random.nextInt(2 * config.levels + 1);
            }
        }
        return inputs;
    }

    /** The exact sum of the inputs of {@code clients}: below 2^bits by the ring's sizing, so no wrap. */
    private static long[] exactSum(int[][] inputs, Set<Integer> clients) {
        long[] sum = new long[inputs[0].length];
        for (int client : clients) {
            for (int i = 0; i < sum.length; i++) {
                sum[i] += inputs[client][i];
            }
        }
        return sum;
    }

    /**
     * One round: every device advertises and shares keys; those in {@code dropBeforeMasking} send no masked input, those
     * in {@code dropAfterMasking} sign nothing and reveal nothing; the others sign the survivor set and unmask. Returns
     * the relay's unmasked sum, one whole number per ring value.
     */
    private static long[] unmaskedSum(SecAggConfig config, int[][] inputs, Set<Integer> dropBeforeMasking,
                                      Set<Integer> dropAfterMasking) throws Exception {
        int n = config.numClients;
        int bits = config.modulusBits();
        int length = config.vectorLength + 1;
        SecAggClient[] devices = new SecAggClient[n];
        JSONObject[] adverts = new JSONObject[n];
        byte[][] signingKeys = new byte[n][];
        for (int c = 0; c < n; c++) {
            Ed25519PrivateKeyParameters key = Signatures.newSigningKey();
            signingKeys[c] = Signatures.publicBytes(key);
            devices[c] = new SecAggClient(config, c, key, ONE_CORRUPT, null);
            adverts[c] = devices[c].advertiseKeys();
        }
        KeySharingRelay relay = new KeySharingRelay(config, devices, adverts, signingKeys);
        byte[] graphSeed = relay.graphSeed;
        List<List<JSONObject>> inbox = relay.inbox;
        Set<Integer> survivors = new TreeSet<Integer>();
        int[] total = new int[length]; // the ring's sum, wrapping at 2^32 (and so modulo 2^16 too)
        for (int c = 0; c < n; c++) {
            byte[] masked = devices[c].maskedInput(new JSONObject().put("stage", "masked_input")
                    .put("encrypted_shares", new JSONArray(inbox.get(c))), inputs[c]);
            if (!dropBeforeMasking.contains(c)) {
                survivors.add(c);
                addInto(total, ringValues(masked, length, bits));
            }
        }
        JSONObject shown = new JSONObject().put("stage", "consistency_check").put("survivors", new JSONArray(survivors));
        Object[] signatures = new Object[n];
        for (int c : survivors) {
            if (!dropAfterMasking.contains(c)) {
                signatures[c] = devices[c].consistencyCheck(shown).get("signature");
            }
        }
        TreeMap<Integer, List<Integer>> xs = new TreeMap<Integer, List<Integer>>();
        TreeMap<Integer, List<BigInteger>> values = new TreeMap<Integer, List<BigInteger>>();
        for (int c : survivors) {
            if (dropAfterMasking.contains(c)) {
                continue;
            }
            JSONArray signed = new JSONArray();
            for (int peer : Graph.neighbours(config, graphSeed, c)) {
                if (signatures[peer] != null) {
                    signed.put(new JSONObject().put("client", peer).put("signature", signatures[peer]));
                }
            }
            JSONObject revealed = devices[c].unmask(new JSONObject().put("stage", "unmask")
                    .put("survivors", new JSONArray(survivors)).put("signatures", signed));
            assertEquals(0, revealed.getJSONArray("undecryptable").length());
            JSONArray shares = revealed.getJSONArray("shares");
            for (int i = 0; i < shares.length(); i++) {
                JSONObject share = shares.getJSONObject(i);
                int owner = share.getInt("owner");
                assertEquals(survivors.contains(owner) ? SecAggClient.SELF_MASK : SecAggClient.MASK_KEY,
                        share.getString("kind"), "a survivor's self-mask share, a dropped device's mask-key share");
                if (!xs.containsKey(owner)) {
                    xs.put(owner, new ArrayList<Integer>());
                    values.put(owner, new ArrayList<BigInteger>());
                }
                xs.get(owner).add(c + 1);
                values.get(owner).add(new BigInteger(1, Base64.decode(share.getString("value"))));
            }
        }
        for (int owner : xs.keySet()) {
            byte[] secret = Shamir.combine(toInts(xs.get(owner)), values.get(owner).toArray(new BigInteger[0]),
                    config.threshold);
            if (survivors.contains(owner)) {
                Crypto.addMask(total, Crypto.deriveKey(secret, "self-mask", config.context()), -1, bits);
            } else { // undo the survivors' pairwise masks with the dropped device, from its mask key
                X25519PrivateKeyParameters maskKey = new X25519PrivateKeyParameters(secret, 0);
                for (int peer : Graph.neighbours(config, graphSeed, owner)) {
                    if (survivors.contains(peer)) {
                        byte[] key = Crypto.agree(maskKey, Base64.decode(adverts[peer].getString("mask_public_key")),
                                "pairwise-mask", config.context());
                        Crypto.addMask(total, key, peer < owner ? -1 : 1, bits);
                    }
                }
            }
        }
        long[] sum = new long[length];
        for (int i = 0; i < length; i++) {
            sum[i] = (total[i] & 0xffffffffL) & ((1L << bits) - 1);
        }
        return sum;
    }

    /** A masked vector's little-endian ring values, 2 or 4 bytes each. */
    private static int[] ringValues(byte[] masked, int length, int bits) {
        int width = bits / 8;
        assertEquals(length * width, masked.length);
        int[] values = new int[length];
        for (int i = 0; i < length; i++) {
            for (int b = 0; b < width; b++) {
                values[i] |= (masked[i * width + b] & 0xff) << (8 * b);
            }
        }
        return values;
    }

    private static void addInto(int[] into, int[] values) {
        for (int i = 0; i < into.length; i++) {
            into[i] += values[i];
        }
    }

    private static int[] toInts(List<Integer> values) {
        int[] out = new int[values.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = values.get(i);
        }
        return out;
    }

    private static Set<Integer> clients(Integer... ids) {
        return new TreeSet<Integer>(Arrays.asList(ids));
    }

    @Test
    void theUnmaskedSumIsTheExactSumOfTheInputsInThe16BitRing() throws Exception {
        SecAggConfig config = config("java-round-16", 127);
        assertEquals(16, config.modulusBits());
        int[][] inputs = inputs(config, 1);
        assertArrayEquals(exactSum(inputs, clients(0, 1, 2, 3, 4)), unmaskedSum(config, inputs, clients(), clients()));
    }

    @Test
    void theUnmaskedSumIsTheExactSumOfTheInputsInThe32BitRing() throws Exception {
        SecAggConfig config = config("java-round-32", 10_000); // 2 x 10,000 x 5 + 1 > 2^16
        assertEquals(32, config.modulusBits());
        int[][] inputs = inputs(config, 2);
        assertArrayEquals(exactSum(inputs, clients(0, 1, 2, 3, 4)), unmaskedSum(config, inputs, clients(), clients()));
    }

    /** One device masks no input after sharing its keys: its neighbours reveal its mask key, and it counts for nothing. */
    @Test
    void aDeviceDroppingAfterKeySharingLeavesTheExactSumOfTheOthers() throws Exception {
        for (int bits : new int[] {16, 32}) {
            SecAggConfig config = config("java-round-drop-" + bits, bits == 16 ? 127 : 10_000);
            int[][] inputs = inputs(config, 3);
            long[] sum = unmaskedSum(config, inputs, clients(1), clients());
            assertArrayEquals(exactSum(inputs, clients(0, 2, 3, 4)), sum);
            assertNotEquals(Arrays.toString(exactSum(inputs, clients(0, 1, 2, 3, 4))), Arrays.toString(sum));
        }
    }

    /** One device masks its input, then signs and reveals nothing: its neighbours reveal its self-mask seed. */
    @Test
    void aDeviceDroppingAfterMaskingStillCountsExactly() throws Exception {
        for (int bits : new int[] {16, 32}) {
            SecAggConfig config = config("java-round-late-" + bits, bits == 16 ? 127 : 10_000);
            int[][] inputs = inputs(config, 4);
            assertArrayEquals(exactSum(inputs, clients(0, 1, 2, 3, 4)),
                    unmaskedSum(config, inputs, clients(), clients(3)));
        }
    }

    /** A device given an input one ring value short refuses to mask it (the caller's mistake, named). */
    @Test
    void anInputOfTheWrongLengthIsRefused() throws Exception {
        final SecAggConfig config = config("java-round-short", 127);
        final int[][] inputs = inputs(config, 5);
        inputs[0] = Arrays.copyOf(inputs[0], config.vectorLength);
        ProtocolViolation refused = assertThrows(ProtocolViolation.class,
                () -> unmaskedSum(config, inputs, clients(), clients()));
        assertEquals("malformed", refused.reason());
        assertTrue(refused.getMessage().startsWith("the input must have 7 ring values, got 6"), refused.getMessage());
    }
}
