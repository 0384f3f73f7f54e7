package dev.fedzoo.secagg;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The k-regular graph of SecAgg+ (Bell et al. 2020), as {@code fedzoo.secagg.graph}: clients on a ring ordered by
 * SHA-256 of the graph seed and their number, each joined to the k/2 clients on either side. The seed is SHA-256 of
 * the round's parameters and every advertised client's stage-1 nonce, which the server relays as one list
 * ({@code advertised}): each device finds its own nonce there and derives its neighbours itself, so the server cannot
 * seat chosen devices next to a victim.
 */
public final class Graph {
    public static final int ENTRY_BYTES = 4 + Signatures.NONCE_BYTES;

    private Graph() {
    }

    /** The advertised list's client -> nonce entries (ascending, distinct, below num_clients), or it is malformed. */
    public static TreeMap<Integer, byte[]> readAdvertised(byte[] data, int numClients) {
        if (data.length % ENTRY_BYTES != 0) {
            throw new ProtocolViolation("the advertised list must hold entries of " + ENTRY_BYTES + " bytes", "malformed");
        }
        TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
        for (int at = 0; at < data.length; at += ENTRY_BYTES) {
            long client = ((data[at] & 0xffL) << 24) | ((data[at + 1] & 0xff) << 16) | ((data[at + 2] & 0xff) << 8)
                    | (data[at + 3] & 0xff);
            if (client >= numClients || (!nonces.isEmpty() && client <= nonces.lastKey())) {
                throw new ProtocolViolation("the advertised list must name distinct clients in order, each below "
                        + "num_clients", "malformed");
            }
            nonces.put((int) client, Arrays.copyOfRange(data, at + 4, at + ENTRY_BYTES));
        }
        return nonces;
    }

    /** The advertised list's bytes: client (u32) then nonce, ascending by client. */
    public static byte[] advertisedBytes(TreeMap<Integer, byte[]> nonces) {
        byte[] out = new byte[0];
        for (Map.Entry<Integer, byte[]> entry : nonces.entrySet()) {
            out = concat(out, SecAggConfig.u32(entry.getKey()), entry.getValue());
        }
        return out;
    }

    /** SHA-256 of the round's parameters and every advertised client's nonce. */
    public static byte[] graphSeed(SecAggConfig config, TreeMap<Integer, byte[]> nonces) {
        return Crypto.sha256(Signatures.signedMessage("graph_seed", config.context(), config.digest(),
                advertisedBytes(nonces)));
    }

    /** The clients in ring order. */
    public static List<Integer> ringOrder(SecAggConfig config, byte[] seed) {
        final byte[][] positions = new byte[config.numClients][];
        List<Integer> order = new ArrayList<Integer>();
        for (int client = 0; client < config.numClients; client++) {
            positions[client] = Crypto.sha256(Signatures.signedMessage("graph_position", seed, SecAggConfig.u32(client)));
            order.add(client);
        }
        Collections.sort(order, new Comparator<Integer>() {
            public int compare(Integer a, Integer b) {
                return compareUnsigned(positions[a], positions[b]);
            }
        });
        return order;
    }

    /** The k neighbours of {@code client}, sorted. */
    public static int[] neighbours(SecAggConfig config, byte[] seed, int client) {
        List<Integer> order = ringOrder(config, seed);
        int position = order.indexOf(client);
        int half = config.neighbourCount / 2;
        int[] around = new int[config.neighbourCount];
        int next = 0;
        for (int step = -half; step <= half; step++) {
            if (step != 0) {
                around[next++] = order.get(((position + step) % config.numClients + config.numClients) % config.numClients);
            }
        }
        Arrays.sort(around);
        return around;
    }

    private static int compareUnsigned(byte[] a, byte[] b) {
        for (int i = 0; i < a.length; i++) {
            int difference = (a[i] & 0xff) - (b[i] & 0xff);
            if (difference != 0) {
                return difference;
            }
        }
        return 0;
    }

    static byte[] concat(byte[]... parts) {
        int size = 0;
        for (byte[] part : parts) {
            size += part.length;
        }
        byte[] out = new byte[size];
        int at = 0;
        for (byte[] part : parts) {
            System.arraycopy(part, 0, out, at, part.length);
            at += part.length;
        }
        return out;
    }
}
