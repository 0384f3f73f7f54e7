package dev.fedzoo.dp;

import java.io.ByteArrayOutputStream;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;

/**
 * A deterministic byte stream for the cross-language noise vectors, never for real noise, as
 * {@code fedzoo.dp.seeded_stream}: block i is SHA-256(seed || u64 big-endian i), read one after another.
 */
public final class SeededStream extends SecureRandomSource {
    private final byte[] seed;
    private long counter;
    private byte[] pending = new byte[0];

    public SeededStream(byte[] seed) {
        this.seed = seed.clone();
    }

    @Override
    public byte[] read(int count) {
        if (pending.length < count) {
            ByteArrayOutputStream more = new ByteArrayOutputStream();
            more.write(pending, 0, pending.length);
            while (more.size() < count) {
                byte[] block = Arrays.copyOf(seed, seed.length + 8);
                for (int i = 0; i < 8; i++) {
                    block[seed.length + i] = (byte) (counter >>> (56 - 8 * i));
                }
                counter++;
                byte[] digest = sha256(block);
                more.write(digest, 0, digest.length);
            }
            pending = more.toByteArray();
        }
        byte[] chunk = Arrays.copyOf(pending, count);
        pending = Arrays.copyOfRange(pending, count, pending.length);
        return chunk;
    }

    private static byte[] sha256(byte[] data) {
        try {
            return MessageDigest.getInstance("SHA-256").digest(data);
        } catch (NoSuchAlgorithmException impossible) {
            throw new IllegalStateException(impossible);
        }
    }
}
