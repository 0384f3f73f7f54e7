package dev.fedzoo.secagg;

import java.io.ByteArrayOutputStream;
import java.security.SecureRandom;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.bouncycastle.crypto.signers.Ed25519Signer;

/**
 * What a device signs with its long-term Ed25519 key in a SecAgg+ round (v3), byte for byte as
 * {@code fedzoo.secagg.signatures}: its advertised X25519 keys and fresh nonce (stage 1), so the server cannot put its
 * own keys in a neighbour's place, and the survivor set it was shown (stage 4), so the server cannot tell neighbours
 * different stories about who dropped out. Every message is {@code fedzoo-secagg/v3/<label> 0x00} then
 * length-prefixed parts, bound to the round's context and configuration digest; the survivor-set signature also names
 * the signer's stage-1 keys and nonce and the graph seed, so a signature from another run of the round never verifies.
 * Ed25519 is BouncyCastle's (the platform's from API 33 only).
 */
public final class Signatures {
    public static final int SIGNING_KEY_BYTES = 32;
    public static final int SIGNATURE_BYTES = 64;
    public static final int NONCE_BYTES = 32;
    private static final SecureRandom RANDOM = new SecureRandom();

    private Signatures() {
    }

    /** The bytes a signature covers: the label, then each part as u32 length (big-endian) and bytes. */
    public static byte[] signedMessage(String label, byte[]... parts) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] head = ("fedzoo-secagg/v3/" + label).getBytes(SecAggConfig.UTF8);
        out.write(head, 0, head.length);
        out.write(0);
        for (byte[] part : parts) {
            out.write(SecAggConfig.u32(part.length), 0, 4);
            out.write(part, 0, part.length);
        }
        return out.toByteArray();
    }

    /** What stage 1's signature covers: this client's two X25519 public keys and its nonce in this round. */
    public static byte[] advertisePayload(SecAggConfig config, byte[] configDigest, int client, byte[] cipherPublicKey,
                                          byte[] maskPublicKey, byte[] nonce) {
        return signedMessage("advertise_keys", config.context(), configDigest, SecAggConfig.u32(client), cipherPublicKey,
                maskPublicKey, nonce);
    }

    /**
     * What stage 4's signature covers: the signer's stage-1 keys and nonce, the graph seed, and the survivor set this
     * client was shown, as ascending u32s.
     */
    public static byte[] consistencyPayload(SecAggConfig config, byte[] configDigest, int client, byte[] cipherPublicKey,
                                            byte[] maskPublicKey, byte[] nonce, byte[] graphSeed,
                                            int[] sortedSurvivors) {
        byte[] survivors = new byte[4 * sortedSurvivors.length];
        for (int i = 0; i < sortedSurvivors.length; i++) {
            System.arraycopy(SecAggConfig.u32(sortedSurvivors[i]), 0, survivors, 4 * i, 4);
        }
        return signedMessage("consistency_check", config.context(), configDigest, SecAggConfig.u32(client),
                cipherPublicKey, maskPublicKey, nonce, graphSeed, survivors);
    }

    /** A device's long-term key: made once at registration, its public half sent to the server. */
    public static Ed25519PrivateKeyParameters newSigningKey() {
        return new Ed25519PrivateKeyParameters(RANDOM);
    }

    /** The raw 32-byte public key of a signing key. */
    public static byte[] publicBytes(Ed25519PrivateKeyParameters key) {
        return key.generatePublicKey().getEncoded();
    }

    /** The Ed25519 signature (RFC 8032, pure) of {@code message}. */
    public static byte[] sign(Ed25519PrivateKeyParameters key, byte[] message) {
        Ed25519Signer signer = new Ed25519Signer();
        signer.init(true, key);
        signer.update(message, 0, message.length);
        return signer.generateSignature();
    }

    /** Whether {@code signature} is the holder of {@code publicKey}'s signature on {@code message}. */
    public static boolean verify(byte[] publicKey, byte[] signature, byte[] message) {
        if (publicKey.length != SIGNING_KEY_BYTES || signature.length != SIGNATURE_BYTES) {
            return false;
        }
        try {
            Ed25519Signer verifier = new Ed25519Signer();
            verifier.init(false, new Ed25519PublicKeyParameters(publicKey, 0));
            verifier.update(message, 0, message.length);
            return verifier.verifySignature(signature);
        } catch (RuntimeException notAPoint) {
            return false;
        }
    }
}
