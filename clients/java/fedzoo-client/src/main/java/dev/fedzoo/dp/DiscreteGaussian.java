package dev.fedzoo.dp;

import java.math.BigInteger;

import dev.fedzoo.InvalidInputException;

/**
 * The discrete Gaussian N_Z(0, sigma^2), sampled exactly (Canonne, Kamath and Steinke 2020, Algorithms 1-3), as
 * {@code fedzoo.dp.discrete_gaussian}: integer arithmetic on uniform integers only, no floating point in the loop,
 * and the same draws from the same source as Python's, so the shared vectors fix the sampler too. sigma^2 is a
 * fraction in lowest terms (Python's {@code Fraction} reduces; the draws depend on the terms).
 */
public final class DiscreteGaussian {
    private DiscreteGaussian() {
    }

    private static boolean bernoulli(BigInteger numerator, BigInteger denominator, SecureRandomSource source) {
        return source.below(denominator).compareTo(numerator) < 0;
    }

    /** Bernoulli(exp(-numerator / denominator)) (CKS Algorithm 1). */
    private static boolean bernoulliExpMinus(BigInteger numerator, BigInteger denominator, SecureRandomSource source) {
        while (numerator.compareTo(denominator) > 0) {
            if (!bernoulliExpMinus(BigInteger.ONE, BigInteger.ONE, source)) {
                return false;
            }
            numerator = numerator.subtract(denominator);
        }
        long k = 1;
        while (bernoulli(numerator, denominator.multiply(BigInteger.valueOf(k)), source)) {
            k++;
        }
        return k % 2 == 1;
    }

    /** P(x) proportional to exp(-|x| / scale) over the integers (CKS Algorithm 2). */
    private static BigInteger discreteLaplace(BigInteger scale, SecureRandomSource source) {
        while (true) {
            BigInteger remainder = source.below(scale);
            if (!bernoulliExpMinus(remainder, scale, source)) {
                continue;
            }
            BigInteger failures = BigInteger.ZERO;
            while (bernoulliExpMinus(BigInteger.ONE, BigInteger.ONE, source)) {
                failures = failures.add(BigInteger.ONE);
            }
            BigInteger magnitude = failures.multiply(scale).add(remainder);
            boolean negative = bernoulli(BigInteger.ONE, BigInteger.valueOf(2), source);
            if (negative && magnitude.signum() == 0) {
                continue;
            }
            return negative ? magnitude.negate() : magnitude;
        }
    }

    /** floor(sqrt(n)) for n >= 0, as Python's {@code math.isqrt} (BigInteger.sqrt is Java 9). */
    static BigInteger isqrt(BigInteger n) {
        if (n.signum() == 0) {
            return n;
        }
        BigInteger x = BigInteger.ONE.shiftLeft((n.bitLength() + 1) / 2); // above sqrt(n)
        while (true) {
            BigInteger next = x.add(n.divide(x)).shiftRight(1);
            if (next.compareTo(x) >= 0) {
                return x;
            }
            x = next;
        }
    }

    /** One draw of N_Z(0, a / b) (CKS Algorithm 3); a / b in lowest terms. */
    public static long sample(BigInteger a, BigInteger b, SecureRandomSource source) {
        if (a.signum() <= 0 || b.signum() <= 0) {
            throw new InvalidInputException("sigma^2 must be positive, got " + a + "/" + b, "sigma");
        }
        BigInteger scale = isqrt(a.divide(b)).add(BigInteger.ONE);
        BigInteger bias = BigInteger.valueOf(2).multiply(a).multiply(b).multiply(scale).multiply(scale);
        while (true) {
            BigInteger candidate = discreteLaplace(scale, source);
            BigInteger gap = candidate.abs().multiply(b).multiply(scale).subtract(a);
            if (bernoulliExpMinus(gap.multiply(gap), bias, source)) {
                return candidate.longValue(); // |x| beyond 2^63 has probability 0 at any sigma a ring can hold
            }
        }
    }
}
