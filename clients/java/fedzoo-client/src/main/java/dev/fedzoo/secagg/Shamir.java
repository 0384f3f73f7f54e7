package dev.fedzoo.secagg;

import java.math.BigInteger;
import java.security.SecureRandom;

/**
 * Shamir secret sharing of 32-byte secrets over GF(2^256 + 297), as {@code fedzoo.secagg.shamir}: the secret is
 * the constant term of a random polynomial of degree t - 1, holder x gets its value at x, and any t shares give the
 * secret back by Lagrange interpolation at 0. A share's value travels as 33 big-endian bytes.
 */
public final class Shamir {
    public static final BigInteger PRIME = BigInteger.ONE.shiftLeft(256).add(BigInteger.valueOf(297));
    public static final int SECRET_BYTES = 32;
    public static final int SHARE_BYTES = 33;
    private static final SecureRandom RANDOM = new SecureRandom();

    private Shamir() {
    }

    /** The share values for holders {@code xs} (distinct, >= 1) such that any {@code threshold} recover {@code secret}. */
    public static BigInteger[] split(byte[] secret, int threshold, int[] xs) {
        if (secret.length != SECRET_BYTES || threshold < 1 || threshold > xs.length) {
            throw new IllegalArgumentException("a 32-byte secret and a threshold in [1, holders]");
        }
        BigInteger[] coefficients = new BigInteger[threshold];
        coefficients[0] = new BigInteger(1, secret);
        for (int i = 1; i < threshold; i++) {
            BigInteger candidate;
            do {
                candidate = new BigInteger(PRIME.bitLength(), RANDOM);
            } while (candidate.compareTo(PRIME) >= 0);
            coefficients[i] = candidate;
        }
        BigInteger[] values = new BigInteger[xs.length];
        for (int h = 0; h < xs.length; h++) {
            BigInteger x = BigInteger.valueOf(xs[h]);
            BigInteger value = BigInteger.ZERO;
            for (int i = threshold - 1; i >= 0; i--) { // Horner's rule
                value = value.multiply(x).add(coefficients[i]).mod(PRIME);
            }
            values[h] = value;
        }
        return values;
    }

    /** The secret from the first {@code threshold} shares (xs[i], values[i]); null if they interpolate to none. */
    public static byte[] combine(int[] xs, BigInteger[] values, int threshold) {
        BigInteger secret = BigInteger.ZERO;
        for (int i = 0; i < threshold; i++) {
            BigInteger numerator = BigInteger.ONE;
            BigInteger denominator = BigInteger.ONE;
            for (int j = 0; j < threshold; j++) {
                if (j != i) {
                    numerator = numerator.multiply(BigInteger.valueOf(xs[j])).mod(PRIME);
                    denominator = denominator.multiply(BigInteger.valueOf(xs[j] - xs[i])).mod(PRIME);
                }
            }
            secret = secret.add(values[i].multiply(numerator).multiply(denominator.modInverse(PRIME))).mod(PRIME);
        }
        if (secret.bitLength() > 8 * SECRET_BYTES) {
            return null;
        }
        return fixedBytes(secret, SECRET_BYTES);
    }

    /** A share's value as 33 big-endian bytes (for encryption and commitments). */
    public static byte[] valueBytes(BigInteger value) {
        return fixedBytes(value, SHARE_BYTES);
    }

    static byte[] fixedBytes(BigInteger value, int size) {
        byte[] raw = value.toByteArray(); // big-endian two's complement, possibly with a leading 0
        byte[] out = new byte[size];
        int copy = Math.min(raw.length, size);
        System.arraycopy(raw, raw.length - copy, out, size - copy, copy);
        return out;
    }
}
