package dev.fedzoo.secagg;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;

/**
 * {@link Signatures#verify} at its edges, as Python's tests/secagg/test_signatures.py: keys and signatures of the wrong
 * length, and keys that are no point of Ed25519 (PIT found both refusals unguarded by the shared vectors).
 */
class SignaturesTest {
    private static final byte[] MESSAGE = "fedzoo signed message".getBytes(TestSupport.UTF8);

    /** y little-endian with the sign bit clear: y = 2 has no x on the curve; y = 2^255 - 19 is no canonical encoding. */
    private static byte[] encoded(byte lowest, byte highest) {
        byte[] point = new byte[32];
        Arrays.fill(point, (byte) 0xff);
        point[0] = lowest;
        point[31] = highest;
        return point;
    }

    @Test
    void aSignatureOrKeyOfTheWrongLengthOrOffTheCurveNeverVerifies() {
        Ed25519PrivateKeyParameters key = Signatures.newSigningKey();
        byte[] publicKey = Signatures.publicBytes(key);
        byte[] signature = Signatures.sign(key, MESSAGE);
        assertTrue(Signatures.verify(publicKey, signature, MESSAGE));
        assertFalse(Signatures.verify(publicKey, Arrays.copyOf(signature, 63), MESSAGE));
        assertFalse(Signatures.verify(publicKey, Arrays.copyOf(signature, 65), MESSAGE));
        assertFalse(Signatures.verify(Arrays.copyOf(publicKey, 31), signature, MESSAGE));
        byte[] two = new byte[32];
        two[0] = 2;
        assertFalse(Signatures.verify(two, signature, MESSAGE));
        assertFalse(Signatures.verify(encoded((byte) 0xed, (byte) 0x7f), signature, MESSAGE));
    }
}
