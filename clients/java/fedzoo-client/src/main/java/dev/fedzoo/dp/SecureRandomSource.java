package dev.fedzoo.dp;

import java.math.BigInteger;
import java.security.SecureRandom;

import dev.fedzoo.InvalidInputException;

/**
 * Uniform bytes and integers for DP noise, as {@code fedzoo.dp.discrete_gaussian.SecureRandom}: from the operating
 * system's CSPRNG ({@link SecureRandom}); {@link SeededStream} replaces the bytes with a reproducible stream for the
 * shared vectors only. {@link #below} draws exactly as Python's: the fewest whole bytes, little-endian, shifted right
 * by the excess bits, rejected until below the bound.
 */
public class SecureRandomSource {
    private final SecureRandom random = new SecureRandom();

    /** {@code count} uniform bytes. */
    public byte[] read(int count) {
        byte[] bytes = new byte[count];
        random.nextBytes(bytes);
        return bytes;
    }

    /** A uniform integer in [0, bound) (rejection sampling: no modulo bias). */
    public BigInteger below(BigInteger bound) {
        if (bound.signum() <= 0) {
            throw new InvalidInputException("bound must be positive, got " + bound, "bound");
        }
        int bits = bound.subtract(BigInteger.ONE).bitLength();
        if (bits == 0) {
            return BigInteger.ZERO;
        }
        int excess = (8 - bits % 8) % 8;
        while (true) {
            byte[] little = read((bits + 7) / 8);
            byte[] big = new byte[little.length];
            for (int i = 0; i < little.length; i++) {
                big[i] = little[little.length - 1 - i];
            }
            BigInteger value = new BigInteger(1, big).shiftRight(excess);
            if (value.compareTo(bound) < 0) {
                return value;
            }
        }
    }
}
