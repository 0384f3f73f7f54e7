package dev.fedzoo.secagg;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.File;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.crypto.params.X25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.bouncycastle.util.encoders.Hex;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;

/**
 * The shared SecAgg+ v2 vectors ({@code tests/vectors/secagg_vectors.json}, written by Python's
 * {@code tests/vectors/secagg_vectors.py}): a Java device that reproduces every case speaks the Python device's
 * protocol, byte for byte.
 */
class SecAggVectorsTest {
    private static JSONObject vectors;
    private static SecAggConfig config;

    @BeforeAll
    static void read() throws Exception {
        vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/secagg_vectors.json")), TestSupport.UTF8));
        config = SecAggConfig.fromJson(vectors.getJSONObject("config"));
    }

    private static byte[] hex(JSONObject holder, String key) throws Exception {
        return Hex.decode(holder.getString(key));
    }

    @Test
    void theContextDigestAndGraphAreTheSame() throws Exception {
        assertEquals(vectors.getString("context"), new String(config.context(), TestSupport.UTF8));
        assertEquals(vectors.getInt("modulus_bits"), config.modulusBits());
        assertArrayEquals(hex(vectors.getJSONObject("signing"), "config_digest"), config.digest());
        JSONObject graph = vectors.getJSONObject("graph");
        for (int client = 0; client < config.numClients; client++) {
            JSONArray expected = graph.getJSONArray(Integer.toString(client));
            int[] neighbours = Graph.neighbours(config, client);
            assertEquals(expected.length(), neighbours.length);
            for (int i = 0; i < neighbours.length; i++) {
                assertEquals(expected.getInt(i), neighbours[i]);
            }
        }
    }

    @Test
    void keyAgreementKeyDerivationMasksAndShareDecryption() throws Exception {
        byte[] context = config.context();
        JSONObject hkdf = vectors.getJSONObject("hkdf");
        assertArrayEquals(hex(hkdf, "key"), Crypto.deriveKey(hex(hkdf, "secret"), hkdf.getString("purpose"), context));

        JSONObject x25519 = vectors.getJSONObject("x25519");
        X25519PrivateKeyParameters alice = new X25519PrivateKeyParameters(hex(x25519, "alice_private"), 0);
        X25519PrivateKeyParameters bob = new X25519PrivateKeyParameters(hex(x25519, "bob_private"), 0);
        assertArrayEquals(hex(x25519, "alice_public"), Crypto.publicBytes(alice));
        assertArrayEquals(hex(x25519, "key"), Crypto.agree(alice, hex(x25519, "bob_public"), x25519.getString("purpose"), context));
        assertArrayEquals(hex(x25519, "key"), Crypto.agree(bob, hex(x25519, "alice_public"), x25519.getString("purpose"), context));

        JSONObject mask = vectors.getJSONObject("mask");
        for (int bits : new int[] {16, 32}) {
            int[] values = Crypto.mask(hex(mask, "key"), mask.getInt("length"), bits);
            JSONArray first = mask.getJSONArray("first_" + bits + "bit");
            for (int i = 0; i < first.length(); i++) {
                assertEquals(first.getLong(i), values[i] & (bits == 16 ? 0xffffL : 0xffffffffL));
            }
            ByteBuffer bytes = ByteBuffer.allocate(values.length * bits / 8).order(ByteOrder.LITTLE_ENDIAN);
            for (int value : values) {
                if (bits == 16) {
                    bytes.putShort((short) value);
                } else {
                    bytes.putInt(value);
                }
            }
            assertArrayEquals(hex(mask, "sha256_" + bits + "bit"), Crypto.sha256(bytes.array()));
        }

        JSONObject share = vectors.getJSONObject("share_decryption");
        assertArrayEquals(hex(share, "plaintext"), Crypto.decrypt(hex(share, "key"), hex(share, "ciphertext"),
                hex(share, "associated_data")));
        assertArrayEquals(hex(share, "associated_data"), SecAggClient.shareAssociatedData(config, share.getInt("owner"),
                share.getInt("holder")));
        byte[] tampered = hex(share, "ciphertext");
        tampered[tampered.length - 1] ^= 1;
        assertNull(Crypto.decrypt(hex(share, "key"), tampered, hex(share, "associated_data")));
        byte[] roundTrip = Crypto.encrypt(hex(share, "key"), hex(share, "plaintext"), hex(share, "associated_data"));
        assertArrayEquals(hex(share, "plaintext"), Crypto.decrypt(hex(share, "key"), roundTrip, hex(share, "associated_data")));
    }

    @Test
    void shamirSharesReconstructFromAnyThresholdAndJavasOwnSharesToo() throws Exception {
        JSONObject shamir = vectors.getJSONObject("shamir");
        assertEquals(new BigInteger(shamir.getString("prime"), 16), Shamir.PRIME);
        int threshold = shamir.getInt("threshold");
        JSONArray shares = shamir.getJSONArray("shares");
        byte[] secret = hex(shamir, "secret");
        for (int skip = 0; skip < shares.length(); skip++) { // each subset of threshold of the threshold + 1 shares
            int[] xs = new int[threshold];
            BigInteger[] values = new BigInteger[threshold];
            for (int i = 0, used = 0; i < shares.length(); i++) {
                if (i != skip && used < threshold) {
                    xs[used] = shares.getJSONArray(i).getInt(0);
                    values[used++] = new BigInteger(shares.getJSONArray(i).getString(1), 16);
                }
            }
            assertArrayEquals(secret, Shamir.combine(xs, values, threshold));
        }
        int[] holders = {3, 9, 4, 11, 1};
        BigInteger[] mine = Shamir.split(secret, 3, holders);
        assertArrayEquals(secret, Shamir.combine(new int[] {11, 3, 1}, new BigInteger[] {mine[3], mine[0], mine[4]}, 3));
        assertEquals(33, Shamir.valueBytes(mine[0]).length);
    }

    @Test
    void commitmentsQuantisationAndFraming() throws Exception {
        JSONObject commitments = vectors.getJSONObject("commitments");
        JSONObject seed = commitments.getJSONObject("self_mask_seed");
        assertEquals(seed.getString("commitment"), Crypto.commitment(32, config.context(),
                "self_mask_seed".getBytes(TestSupport.UTF8), SecAggConfig.u32(seed.getInt("owner")), hex(seed, "seed")));
        for (String kind : new String[] {SecAggClient.SELF_MASK, SecAggClient.MASK_KEY}) {
            JSONObject share = commitments.getJSONObject(kind + "_share");
            assertEquals(share.getString("commitment"), SecAggClient.shareCommitment(config, kind, share.getInt("owner"),
                    share.getInt("holder"), Shamir.valueBytes(new BigInteger(share.getString("value"), 16))));
        }

        JSONObject quantise = vectors.getJSONObject("quantise");
        JSONArray vector = quantise.getJSONArray("vector");
        double[] values = new double[vector.length()];
        for (int i = 0; i < values.length; i++) {
            values[i] = vector.getDouble(i);
        }
        int[] ring = Encoding.quantise(values, config, quantise.getDouble("weight"), new Random(3));
        JSONArray expected = quantise.getJSONArray("ring");
        for (int i = 0; i < ring.length; i++) {
            assertEquals(expected.getInt(i), ring[i]);
        }

        JSONObject framing = vectors.getJSONObject("framing");
        assertArrayEquals(hex(framing.getJSONObject("share_keys"), "framed"),
                Framing.encodeShareKeys(framing.getJSONObject("share_keys").getJSONObject("reply")));
        assertArrayEquals(hex(framing.getJSONObject("unmask"), "framed"),
                Framing.encodeUnmask(framing.getJSONObject("unmask").getJSONObject("reply")));
    }

    @Test
    void signedPayloadsAndSignaturesAreByteForByteTheSame() throws Exception {
        JSONObject signing = vectors.getJSONObject("signing");
        Ed25519PrivateKeyParameters key = new Ed25519PrivateKeyParameters(hex(signing, "private_key"), 0);
        assertArrayEquals(hex(signing, "public_key"), Signatures.publicBytes(key));
        byte[] digest = config.digest();
        JSONObject advertise = signing.getJSONObject("advertise");
        byte[] payload = Signatures.advertisePayload(config, digest, advertise.getInt("client"),
                hex(advertise, "cipher_public_key"), hex(advertise, "mask_public_key"));
        assertArrayEquals(hex(advertise, "payload"), payload);
        assertArrayEquals(hex(advertise, "signature"), Signatures.sign(key, payload)); // Ed25519 is deterministic
        JSONObject consistency = signing.getJSONObject("consistency");
        JSONArray survivors = consistency.getJSONArray("survivors");
        int[] sorted = new int[survivors.length()];
        for (int i = 0; i < sorted.length; i++) {
            sorted[i] = survivors.getInt(i);
        }
        byte[] signed = Signatures.consistencyPayload(config, digest, consistency.getInt("client"), sorted);
        assertArrayEquals(hex(consistency, "payload"), signed);
        assertArrayEquals(hex(consistency, "signature"), Signatures.sign(key, signed));
        byte[] forged = hex(consistency, "signature");
        forged[0] ^= 1;
        assertEquals(false, Signatures.verify(hex(signing, "public_key"), forged, signed));
        assertEquals(true, Signatures.verify(hex(signing, "public_key"), hex(consistency, "signature"), signed));
    }

    @Test
    void configurationsOutsideTheDevicesBoundsAreRefused() throws Exception {
        JSONArray refused = vectors.getJSONArray("bounds_refusals");
        for (int i = 0; i < refused.length(); i++) {
            SecAggConfig outside = SecAggConfig.fromJson(refused.getJSONObject(i));
            assertEquals("config_out_of_bounds", assertThrows(ProtocolViolation.class,
                    () -> new SecAggBounds().check(outside)).reason(), refused.getJSONObject(i).toString());
        }
        new SecAggBounds().check(config);
    }

    /** An honest round of the vectors' configuration in this process, taken through stage 3. */
    private static SecAggClient[] roundThroughMaskedInput() throws Exception {
        int n = config.numClients;
        SecAggClient[] clients = new SecAggClient[n];
        JSONObject[] adverts = new JSONObject[n];
        byte[][] signingKeys = new byte[n][];
        for (int c = 0; c < n; c++) {
            Ed25519PrivateKeyParameters key = Signatures.newSigningKey();
            signingKeys[c] = Signatures.publicBytes(key);
            clients[c] = new SecAggClient(config, c, key, new SecAggBounds(), null);
            adverts[c] = clients[c].advertiseKeys();
        }
        List<List<JSONObject>> inbox = new ArrayList<List<JSONObject>>();
        for (int c = 0; c < n; c++) {
            inbox.add(new ArrayList<JSONObject>());
        }
        for (int c = 0; c < n; c++) {
            JSONArray keys = new JSONArray();
            for (int peer : Graph.neighbours(config, c)) {
                keys.put(new JSONObject().put("client", peer).put("cipher_public_key", adverts[peer].get("cipher_public_key"))
                        .put("mask_public_key", adverts[peer].get("mask_public_key"))
                        .put("signing_public_key", Base64.toBase64String(signingKeys[peer]))
                        .put("signature", adverts[peer].get("signature")));
            }
            JSONArray shares = clients[c].shareKeys(new JSONObject().put("stage", "share_keys").put("public_keys", keys))
                    .getJSONArray("shares");
            for (int i = 0; i < shares.length(); i++) {
                JSONObject share = shares.getJSONObject(i);
                inbox.get(share.getInt("holder")).add(new JSONObject().put("owner", c).put("ciphertext",
                        share.get("ciphertext")));
            }
        }
        for (int c = 0; c < n; c++) {
            clients[c].maskedInput(new JSONObject().put("stage", "masked_input").put("encrypted_shares",
                    new JSONArray(inbox.get(c))), new int[config.vectorLength + 1]);
        }
        return clients;
    }

    @Test
    void everyRequestAnHonestDeviceMustRefuseIsRefusedForThePythonReason() throws Exception {
        JSONArray refusals = vectors.getJSONArray("refusals");
        for (int i = 0; i < refusals.length(); i++) {
            final JSONObject refusal = refusals.getJSONObject(i);
            final SecAggClient device = roundThroughMaskedInput()[refusal.getInt("client")];
            ProtocolViolation violation;
            if (refusal.isNull("signed_survivors")) {
                violation = assertThrows(ProtocolViolation.class,
                        () -> device.consistencyCheck(refusal.getJSONObject("request")), refusal.toString());
            } else {
                device.consistencyCheck(new JSONObject().put("stage", "consistency_check")
                        .put("survivors", refusal.getJSONArray("signed_survivors")));
                violation = assertThrows(ProtocolViolation.class, () -> device.unmask(refusal.getJSONObject("request")),
                        refusal.toString());
            }
            assertEquals(refusal.getString("reason"), violation.reason(), refusal.toString());
        }
    }
    private static void answer(SecAggClient device, JSONObject request) throws Exception {
        String stage = request.getString("stage");
        if (stage.equals("share_keys")) {
            device.shareKeys(request);
        } else if (stage.equals("masked_input")) {
            device.maskedInput(request, new int[config.vectorLength + 1]);
        } else if (stage.equals("consistency_check")) {
            device.consistencyCheck(request);
        } else {
            device.unmask(request);
        }
    }

    /** The server's lies about relayed keys and signatures: every step but the last is answered, the last refused. */
    @Test
    void relayedKeysAndSignaturesTheServerAlteredAreRefusedForThePythonReason() throws Exception {
        JSONArray cases = vectors.getJSONArray("staged_refusals");
        for (int i = 0; i < cases.length(); i++) {
            final JSONObject refusal = cases.getJSONObject(i);
            final SecAggClient device = new SecAggClient(config, refusal.getInt("client"), Signatures.newSigningKey(),
                    new SecAggBounds(), null);
            device.advertiseKeys();
            JSONArray steps = refusal.getJSONArray("steps");
            for (int step = 0; step < steps.length() - 1; step++) {
                answer(device, steps.getJSONObject(step));
            }
            final JSONObject last = steps.getJSONObject(steps.length() - 1);
            ProtocolViolation violation = assertThrows(ProtocolViolation.class, () -> answer(device, last),
                    refusal.getString("name"));
            assertEquals(refusal.getString("reason"), violation.reason(), refusal.getString("name"));
        }
    }
}
