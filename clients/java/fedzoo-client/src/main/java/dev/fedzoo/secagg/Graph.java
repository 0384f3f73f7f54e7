package dev.fedzoo.secagg;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;

/**
 * The k-regular graph of SecAgg+ (Bell et al. 2020), as {@code fedzoo.secagg.graph}: clients on a ring ordered
 * by SHA-256 of the round's context and their number, each joined to the k/2 clients on either side.
 */
public final class Graph {
    private Graph() {
    }

    /** The clients in ring order. */
    public static List<Integer> ringOrder(SecAggConfig config) {
        final byte[] context = config.context();
        final byte[][] positions = new byte[config.numClients][];
        List<Integer> order = new ArrayList<Integer>();
        for (int client = 0; client < config.numClients; client++) {
            positions[client] = Crypto.sha256(concat("fedzoo-secagg/v1/graph/".getBytes(SecAggConfig.UTF8), context,
                    SecAggConfig.u32(client)));
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
    public static int[] neighbours(SecAggConfig config, int client) {
        List<Integer> order = ringOrder(config);
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
