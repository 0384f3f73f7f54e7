package dev.fedzoo.secagg;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;

import javax.crypto.Cipher;
import javax.crypto.spec.IvParameterSpec;
import javax.crypto.spec.SecretKeySpec;

import org.bouncycastle.crypto.InvalidCipherTextException;
import org.bouncycastle.crypto.agreement.X25519Agreement;
import org.bouncycastle.crypto.digests.SHA256Digest;
import org.bouncycastle.crypto.generators.HKDFBytesGenerator;
import org.bouncycastle.crypto.modes.ChaCha20Poly1305;
import org.bouncycastle.crypto.params.AEADParameters;
import org.bouncycastle.crypto.params.HKDFParameters;
import org.bouncycastle.crypto.params.KeyParameter;
import org.bouncycastle.crypto.params.X25519PrivateKeyParameters;
import org.bouncycastle.crypto.params.X25519PublicKeyParameters;
import org.bouncycastle.util.encoders.Base64;

/**
 * The cryptographic building blocks of SecAgg+, byte for byte those of {@code fedzoo.secagg.crypto}: X25519 key
 * agreement, HKDF-SHA256 with the purpose and round in {@code info}, ChaCha20-Poly1305 share encryption, AES-256-CTR
 * masks read as little-endian ring values, and SHA-256 commitments. X25519, HKDF and ChaCha20-Poly1305 come from
 * BouncyCastle (Android's own provider has X25519 only from API 33); AES-CTR is the platform's (every API level,
 * and hardware-accelerated).
 */
public final class Crypto {
    public static final int KEY_BYTES = 32;
    static final int NONCE_BYTES = 12;
    private static final int MASK_CHUNK_BYTES = 16_384;
    private static final SecureRandom RANDOM = new SecureRandom();
    private static final X25519PrivateKeyParameters PROBE_KEY = new X25519PrivateKeyParameters(RANDOM);

    private Crypto() {
    }

    /** A fresh X25519 private key. */
    public static X25519PrivateKeyParameters newKeyPair() {
        return new X25519PrivateKeyParameters(RANDOM);
    }

    /** The raw 32-byte public key of a private key. */
    public static byte[] publicBytes(X25519PrivateKeyParameters privateKey) {
        return privateKey.generatePublicKey().getEncoded();
    }

    /**
     * Whether a 32-byte X25519 public key gives a key agreement (low-order points give none, whatever the private key:
     * a clamped scalar is a multiple of 8, so one probe key serves every check).
     */
    public static boolean isUsablePublicKey(byte[] publicKey) {
        if (publicKey.length != KEY_BYTES) {
            return false;
        }
        try {
            sharedSecret(PROBE_KEY, publicKey);
            return true;
        } catch (IllegalStateException lowOrder) {
            return false;
        }
    }

    /** A 32-byte key for one purpose and one round: HKDF-SHA256 (no salt) with info "fedzoo-secagg/v1/purpose/context". */
    public static byte[] deriveKey(byte[] secret, String purpose, byte[] context) {
        byte[] prefix = ("fedzoo-secagg/v1/" + purpose + "/").getBytes(SecAggConfig.UTF8);
        byte[] info = new byte[prefix.length + context.length];
        System.arraycopy(prefix, 0, info, 0, prefix.length);
        System.arraycopy(context, 0, info, prefix.length, context.length);
        HKDFBytesGenerator hkdf = new HKDFBytesGenerator(new SHA256Digest());
        hkdf.init(new HKDFParameters(secret, null, info));
        byte[] key = new byte[KEY_BYTES];
        hkdf.generateBytes(key, 0, KEY_BYTES);
        return key;
    }

    /** The key two clients share for {@code purpose}: HKDF of their X25519 secret (symmetric in the two parties). */
    public static byte[] agree(X25519PrivateKeyParameters privateKey, byte[] peerPublicKey, String purpose, byte[] context) {
        return deriveKey(sharedSecret(privateKey, peerPublicKey), purpose, context);
    }

    private static byte[] sharedSecret(X25519PrivateKeyParameters privateKey, byte[] peerPublicKey) {
        X25519Agreement agreement = new X25519Agreement();
        agreement.init(privateKey);
        byte[] secret = new byte[agreement.getAgreementSize()];
        agreement.calculateAgreement(new X25519PublicKeyParameters(peerPublicKey, 0), secret, 0);
        return secret;
    }

    /** nonce || ChaCha20-Poly1305(plaintext), authenticating {@code associatedData} too. */
    public static byte[] encrypt(byte[] key, byte[] plaintext, byte[] associatedData) {
        byte[] nonce = new byte[NONCE_BYTES];
        RANDOM.nextBytes(nonce);
        ChaCha20Poly1305 cipher = new ChaCha20Poly1305();
        cipher.init(true, new AEADParameters(new KeyParameter(key), 128, nonce, associatedData));
        byte[] out = new byte[NONCE_BYTES + cipher.getOutputSize(plaintext.length)];
        System.arraycopy(nonce, 0, out, 0, NONCE_BYTES);
        int written = cipher.processBytes(plaintext, 0, plaintext.length, out, NONCE_BYTES);
        try {
            cipher.doFinal(out, NONCE_BYTES + written);
        } catch (InvalidCipherTextException impossible) {
            throw new IllegalStateException(impossible);
        }
        return out;
    }

    /** The plaintext of {@link #encrypt}'s output, or null when anything was altered (or it is not for us). */
    public static byte[] decrypt(byte[] key, byte[] ciphertext, byte[] associatedData) {
        if (ciphertext.length < NONCE_BYTES + 16) {
            return null;
        }
        byte[] nonce = new byte[NONCE_BYTES];
        System.arraycopy(ciphertext, 0, nonce, 0, NONCE_BYTES);
        ChaCha20Poly1305 cipher = new ChaCha20Poly1305();
        cipher.init(false, new AEADParameters(new KeyParameter(key), 128, nonce, associatedData));
        byte[] out = new byte[cipher.getOutputSize(ciphertext.length - NONCE_BYTES)];
        try {
            int written = cipher.processBytes(ciphertext, NONCE_BYTES, ciphertext.length - NONCE_BYTES, out, 0);
            cipher.doFinal(out, written);
        } catch (InvalidCipherTextException tampered) {
            return null;
        }
        return out;
    }

    /**
     * {@code length} uniform integers modulo 2^{@code modulusBits} (16 or 32) from the AES-256-CTR keystream under
     * {@code key} (zero IV: each key serves one stream), little-endian; 32-bit values are held in int's bits.
     */
    public static int[] mask(byte[] key, int length, int modulusBits) {
        int[] values = new int[length];
        addMask(values, key, 1, modulusBits);
        return values;
    }

    /**
     * Adds {@code sign} times {@link #mask}'s values to {@code into} (wrapping, as the ring does), streaming the
     * keystream in chunks instead of holding a whole mask: a device adds k + 1 of them to its input.
     */
    public static void addMask(int[] into, byte[] key, int sign, int modulusBits) {
        int width = modulusBits / 8;
        MaskStream mask = MASK_STREAMS.get();
        try {
            mask.aes.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(key, "AES"), new IvParameterSpec(new byte[16]));
        } catch (GeneralSecurityException invalid) { // a 32-byte key and a 16-byte IV always fit AES-256-CTR
            throw new IllegalStateException(invalid);
        }
        int perChunk = MASK_CHUNK_BYTES / width;
        for (int start = 0; start < into.length; start += perChunk) {
            int count = Math.min(perChunk, into.length - start);
            try {
                mask.aes.update(mask.zeros, 0, count * width, mask.stream, 0);
            } catch (GeneralSecurityException impossible) { // the output buffer is large enough
                throw new IllegalStateException(impossible);
            }
            if (width == 4) {
                for (int i = 0; i < count; i++) {
                    into[start + i] += sign * mask.littleEndian.getInt(i * 4);
                }
            } else {
                for (int i = 0; i < count; i++) {
                    into[start + i] += sign * (mask.littleEndian.getShort(i * 2) & 0xffff);
                }
            }
        }
    }

    /**
     * A thread's AES-CTR cipher and the chunk buffers a mask streams through, kept for the thread's next mask: a
     * device adds k + 1 masks a round, and a new cipher and buffers for each cost about a tenth of the stage.
     */
    private static final class MaskStream {
        final Cipher aes;
        final byte[] zeros = new byte[MASK_CHUNK_BYTES];
        final byte[] stream = new byte[MASK_CHUNK_BYTES];
        final ByteBuffer littleEndian = ByteBuffer.wrap(stream).order(ByteOrder.LITTLE_ENDIAN); // getInt: one load

        MaskStream() {
            try {
                aes = Cipher.getInstance("AES/CTR/NoPadding");
            } catch (GeneralSecurityException unavailable) {
                throw new IllegalStateException("AES/CTR is part of every Java and Android platform", unavailable);
            }
        }
    }

    private static final ThreadLocal<MaskStream> MASK_STREAMS = new ThreadLocal<MaskStream>() {
        @Override
        protected MaskStream initialValue() {
            return new MaskStream();
        }
    };

    /** SHA-256 over length-prefixed parts, its first {@code size} bytes in base64: binds a value without revealing it. */
    public static String commitment(int size, byte[]... parts) {
        MessageDigest digest = sha256Digest();
        digest.update("fedzoo-secagg/v1/commitment".getBytes(SecAggConfig.UTF8));
        for (byte[] part : parts) {
            digest.update(SecAggConfig.u32(part.length));
            digest.update(part);
        }
        byte[] full = digest.digest();
        byte[] kept = new byte[size];
        System.arraycopy(full, 0, kept, 0, size);
        return Base64.toBase64String(kept);
    }

    /** SHA-256 of {@code data}. */
    public static byte[] sha256(byte[] data) {
        return sha256Digest().digest(data);
    }

    private static MessageDigest sha256Digest() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException unavailable) {
            throw new IllegalStateException("SHA-256 is part of every Java and Android platform", unavailable);
        }
    }
}
