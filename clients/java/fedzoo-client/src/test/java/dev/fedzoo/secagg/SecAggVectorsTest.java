package dev.fedzoo.secagg;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.File;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.crypto.params.X25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.bouncycastle.util.encoders.Hex;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;
import dev.fedzoo.fl.SecureParticipation;

/**
 * The shared SecAgg+ v3 vectors ({@code tests/vectors/secagg_vectors.json}, written by Python's
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
        JSONObject nonceHex = graph.getJSONObject("nonces");
        TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
        for (int client = 0; client < config.numClients; client++) {
            if (nonceHex.has(Integer.toString(client))) {
                nonces.put(client, Hex.decode(nonceHex.getString(Integer.toString(client))));
            }
        }
        assertArrayEquals(hex(graph, "advertised"), Graph.advertisedBytes(nonces));
        assertEquals(nonces.keySet(), Graph.readAdvertised(hex(graph, "advertised"), config.numClients).keySet());
        byte[] seed = Graph.graphSeed(config, nonces);
        assertArrayEquals(hex(graph, "seed"), seed);
        for (int client = 0; client < config.numClients; client++) {
            JSONArray expected = graph.getJSONObject("neighbours").getJSONArray(Integer.toString(client));
            int[] neighbours = Graph.neighbours(config, seed, client);
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

        JSONArray unclipped = vectors.getJSONArray("unclipped_bit");
        for (int c = 0; c < unclipped.length(); c++) {
            JSONObject bitCase = unclipped.getJSONObject(c);
            JSONArray delta = bitCase.getJSONArray("vector");
            double[] deltaValues = new double[delta.length()];
            for (int i = 0; i < deltaValues.length; i++) {
                deltaValues[i] = delta.getDouble(i);
            }
            int[] withBit = Encoding.quantise(SecureParticipation.withUnclippedBit(deltaValues,
                    bitCase.getBoolean("within"), config.clipRange), config, bitCase.getDouble("weight"), new Random(3));
            JSONArray expectedWithBit = bitCase.getJSONArray("ring");
            assertEquals(expectedWithBit.length(), withBit.length);
            for (int i = 0; i < withBit.length; i++) {
                assertEquals(expectedWithBit.getInt(i), withBit[i]);
            }
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
        byte[] cipherPublic = hex(advertise, "cipher_public_key");
        byte[] maskPublic = hex(advertise, "mask_public_key");
        byte[] nonce = hex(advertise, "nonce");
        byte[] payload = Signatures.advertisePayload(config, digest, advertise.getInt("client"), cipherPublic, maskPublic,
                nonce);
        assertArrayEquals(hex(advertise, "payload"), payload);
        assertArrayEquals(hex(advertise, "signature"), Signatures.sign(key, payload)); // Ed25519 is deterministic
        JSONObject consistency = signing.getJSONObject("consistency");
        JSONArray survivors = consistency.getJSONArray("survivors");
        int[] sorted = new int[survivors.length()];
        for (int i = 0; i < sorted.length; i++) {
            sorted[i] = survivors.getInt(i);
        }
        byte[] signed = Signatures.consistencyPayload(config, digest, consistency.getInt("client"), cipherPublic,
                maskPublic, nonce, hex(consistency, "graph_seed"), sorted);
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

    private static byte[] lastGraphSeed;
    /** Each device's self-mask seed commitment in the last round {@link #roundThroughMaskedInput} ran. */
    private static String[] lastSeedCommitments;

    /** An honest round of the vectors' configuration in this process, taken through stage 3 ({@link #lastGraphSeed}). */
    private static SecAggClient[] roundThroughMaskedInput() throws Exception {
        return roundThroughMaskedInput(null);
    }

    /** The same with the devices' long-term keys {@code longTermKeys} (fresh ones where null). */
    private static SecAggClient[] roundThroughMaskedInput(Ed25519PrivateKeyParameters[] longTermKeys) throws Exception {
        int n = config.numClients;
        SecAggClient[] clients = new SecAggClient[n];
        JSONObject[] adverts = new JSONObject[n];
        byte[][] signingKeys = new byte[n][];
        for (int c = 0; c < n; c++) {
            Ed25519PrivateKeyParameters key = longTermKeys != null ? longTermKeys[c] : Signatures.newSigningKey();
            signingKeys[c] = Signatures.publicBytes(key);
            clients[c] = new SecAggClient(config, c, key, new SecAggBounds(), null);
            adverts[c] = clients[c].advertiseKeys();
        }
        KeySharingRelay relay = new KeySharingRelay(config, clients, adverts, signingKeys);
        lastGraphSeed = relay.graphSeed;
        String[] commitments = new String[n];
        for (int c = 0; c < n; c++) {
            commitments[c] = relay.replies[c].getString("self_mask_seed_commitment");
        }
        List<List<JSONObject>> inbox = relay.inbox;
        lastSeedCommitments = commitments;
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
            final JSONObject request = resolved(refusal.getJSONObject("request"), refusal.getInt("client"));
            ProtocolViolation violation;
            if (refusal.isNull("signed_survivors")) {
                violation = assertThrows(ProtocolViolation.class,
                        () -> device.consistencyCheck(request), refusal.toString());
            } else {
                device.consistencyCheck(new JSONObject().put("stage", "consistency_check")
                        .put("survivors", refusal.getJSONArray("signed_survivors")));
                violation = assertThrows(ProtocolViolation.class, () -> device.unmask(request), refusal.toString());
            }
            assertEquals(refusal.getString("reason"), violation.reason(), refusal.toString());
        }
    }

    /** The request with "neighbour" / "stranger" signers replaced by one of the client's neighbours / another client. */
    private static JSONObject resolved(JSONObject request, int client) throws Exception {
        JSONArray signed = request.optJSONArray("signatures");
        if (signed == null) {
            return request;
        }
        int[] around = Graph.neighbours(config, lastGraphSeed, client);
        int stranger = -1;
        for (int c = config.numClients - 1; c >= 0; c--) {
            if (c != client && Arrays.binarySearch(around, c) < 0) {
                stranger = c;
            }
        }
        JSONArray out = new JSONArray();
        for (int i = 0; i < signed.length(); i++) {
            JSONObject entry = new JSONObject(signed.getJSONObject(i).toString());
            Object signer = entry.opt("client");
            if ("neighbour".equals(signer)) {
                entry.put("client", around[0]);
            } else if ("stranger".equals(signer)) {
                entry.put("client", stranger);
            }
            out.put(entry);
        }
        return new JSONObject(request.toString()).put("signatures", out);
    }

    @Test
    void aSurvivorSetSignatureFromAnotherRunOfTheRoundIsRefused() throws Exception {
        Ed25519PrivateKeyParameters[] keys = new Ed25519PrivateKeyParameters[config.numClients];
        for (int c = 0; c < keys.length; c++) {
            keys[c] = Signatures.newSigningKey();
        }
        JSONArray everyone = new JSONArray();
        for (int c = 0; c < config.numClients; c++) {
            everyone.put(c);
        }
        JSONObject show = new JSONObject().put("stage", "consistency_check").put("survivors", everyone);
        SecAggClient[] earlier = roundThroughMaskedInput(keys);
        SecAggClient[] clients = roundThroughMaskedInput(keys); // the same devices, round id and parameters
        int neighbour = Graph.neighbours(config, lastGraphSeed, 0)[0]; // client 0's neighbour in this run's graph
        Object earlierSignature = earlier[neighbour].consistencyCheck(show).get("signature");
        JSONArray signed = new JSONArray();
        for (int peer : Graph.neighbours(config, lastGraphSeed, 0)) {
            signed.put(new JSONObject().put("client", peer).put("signature", clients[peer].consistencyCheck(show)
                    .get("signature")));
        }
        clients[0].consistencyCheck(show);
        final JSONObject honest = new JSONObject().put("stage", "unmask").put("survivors", everyone).put("signatures",
                signed);
        JSONArray replayedSignatures = new JSONArray(signed.toString());
        for (int i = 0; i < replayedSignatures.length(); i++) {
            if (replayedSignatures.getJSONObject(i).getInt("client") == neighbour) {
                replayedSignatures.getJSONObject(i).put("signature", earlierSignature);
            }
        }
        final JSONObject replayed = new JSONObject(honest.toString()).put("signatures", replayedSignatures);
        assertEquals("bad_signature", assertThrows(ProtocolViolation.class, () -> clients[0].unmask(replayed)).reason());
        assertEquals(true, clients[0].unmask(honest).getJSONArray("shares").length() > 0);
    }

    @Test
    void aDeviceTakesPartInARoundIdOnceAndRemembersItInItsStateStore() throws Exception {
        File directory = TestSupport.workDirectory("signed-rounds");
        Ed25519PrivateKeyParameters key = Signatures.newSigningKey();
        dev.fedzoo.client.StateStore store = new dev.fedzoo.client.StateStore(directory);
        store.put("server", "https://fl.example");
        new SecAggClient(config, 1, key, new SecAggBounds(), null, signedRoundsOf(store)).advertiseKeys();
        final SecAggClient again = new SecAggClient(config, 1, key, new SecAggBounds(), null,
                signedRoundsOf(new dev.fedzoo.client.StateStore(directory))); // a restarted app
        assertEquals("round_replayed", assertThrows(ProtocolViolation.class, () -> again.advertiseKeys()).reason());
        store.put("server", "https://other.example"); // another server's round of the same name is another round
        new SecAggClient(config, 1, key, new SecAggBounds(), null, signedRoundsOf(store)).advertiseKeys();
    }

    @Test
    void aDeviceTakesPartInOneCohortOfARound() {
        // a zoo-wide round's cohorts share the round's key: a second cohort of round 7 is a replay, round 70 is not
        SignedRounds memory = new SignedRounds();
        memory.claim("fl-round-7/subnet-0");
        assertEquals("round_replayed",
                assertThrows(ProtocolViolation.class, () -> memory.claim("fl-round-7/subnet-1")).reason());
        assertEquals("round_replayed", assertThrows(ProtocolViolation.class, () -> memory.claim("fl-round-7")).reason());
        memory.claim("fl-round-70/subnet-0");
        assertEquals(SignedRounds.roundKey("fl-round-7"), SignedRounds.roundKey("fl-round-7/subnet-3"));
    }

    private static SignedRounds signedRoundsOf(dev.fedzoo.client.StateStore store) {
        return new dev.fedzoo.client.FedzooClient("http://127.0.0.1:9", null, TestSupport.workDirectory("cache"))
                .keepStateIn(store).signedRounds();
    }

    @Test
    void aGraphWithoutTheDevicesNonceOrWithNeighboursTheServerChoseIsRefused() throws Exception {
        SecAggClient device = new SecAggClient(config, 0, Signatures.newSigningKey(), new SecAggBounds(), null);
        JSONObject advert = device.advertiseKeys();
        TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
        for (int c = 0; c < config.numClients; c++) {
            nonces.put(c, c == 0 ? Base64.decode(advert.getString("nonce")) : Hex.decode(String.format("%064x", c)));
        }
        TreeMap<Integer, byte[]> withoutIt = new TreeMap<Integer, byte[]>(nonces);
        withoutIt.put(0, new byte[Signatures.NONCE_BYTES]);
        final JSONObject missing = new JSONObject().put("stage", "share_keys").put("public_keys", new JSONArray())
                .put("advertised", Base64.toBase64String(Graph.advertisedBytes(withoutIt)));
        assertEquals("malformed", assertThrows(ProtocolViolation.class, () -> device.shareKeys(missing)).reason());
        int[] around = Graph.neighbours(config, Graph.graphSeed(config, nonces), 0);
        int chosen = -1;
        for (int c = 1; c < config.numClients && chosen < 0; c++) {
            chosen = Arrays.binarySearch(around, c) < 0 ? c : -1;
        }
        JSONArray keys = new JSONArray().put(new JSONObject().put("client", chosen));
        final JSONObject seated = new JSONObject().put("stage", "share_keys").put("public_keys", keys)
                .put("advertised", Base64.toBase64String(Graph.advertisedBytes(nonces)));
        assertEquals("malformed", assertThrows(ProtocolViolation.class, () -> device.shareKeys(seated)).reason());
    }

    private static JSONObject staged() throws Exception {
        return vectors.getJSONObject("staged_refusals");
    }

    /**
     * A staged step as the server sends it in a run where client 0 advertised {@code nonces.get(0)}, as Python's
     * {@code _in_this_run}: a share_keys step with the advertised list, an unmask step with each listed signature
     * made in this run by the client {@code signed_by} names.
     */
    private static JSONObject inThisRun(SecAggConfig round, JSONObject request, TreeMap<Integer, byte[]> nonces)
            throws Exception {
        String stage = request.getString("stage");
        if (stage.equals("share_keys")) {
            return new JSONObject(request.toString()).put("advertised",
                    Base64.toBase64String(Graph.advertisedBytes(nonces)));
        }
        if (!stage.equals("unmask")) {
            return request;
        }
        byte[] seed = Graph.graphSeed(round, nonces);
        JSONArray shown = request.getJSONArray("survivors");
        int[] survivors = new int[shown.length()];
        for (int i = 0; i < survivors.length; i++) {
            survivors[i] = shown.getInt(i);
        }
        JSONArray neighbours = staged().getJSONArray("neighbours");
        JSONArray listed = request.getJSONArray("signatures");
        JSONArray signed = new JSONArray();
        for (int i = 0; i < listed.length(); i++) {
            int signer = listed.getJSONObject(i).getInt("signed_by");
            for (int n = 0; n < neighbours.length(); n++) {
                JSONObject neighbour = neighbours.getJSONObject(n);
                if (neighbour.getInt("client") == signer) {
                    byte[] payload = Signatures.consistencyPayload(round, round.digest(), signer,
                            hex(neighbour, "cipher_public_key"), hex(neighbour, "mask_public_key"),
                            hex(neighbour, "nonce"), seed, survivors);
                    Ed25519PrivateKeyParameters key = new Ed25519PrivateKeyParameters(
                            hex(neighbour, "signing_private_key"), 0);
                    signed.put(new JSONObject().put("client", listed.getJSONObject(i).getInt("client"))
                            .put("signature", Base64.toBase64String(Signatures.sign(key, payload))));
                }
            }
        }
        return new JSONObject(request.toString()).put("signatures", signed);
    }

    private static void answer(SecAggClient device, JSONObject request) throws Exception {
        String stage = request.getString("stage");
        if (stage.equals("share_keys")) {
            device.shareKeys(request);
        } else if (stage.equals("masked_input")) {
            device.maskedInput(request, new int[device.config().vectorLength + 1]);
        } else if (stage.equals("consistency_check")) {
            device.consistencyCheck(request);
        } else {
            device.unmask(request);
        }
    }

    /** The server's lies about relayed keys and signatures: every step but the last is answered, the last refused. */
    @Test
    void relayedKeysAndSignaturesTheServerAlteredAreRefusedForThePythonReason() throws Exception {
        SecAggConfig round = SecAggConfig.fromJson(staged().getJSONObject("config"));
        JSONArray neighbours = staged().getJSONArray("neighbours");
        JSONArray cases = staged().getJSONArray("cases");
        for (int i = 0; i < cases.length(); i++) {
            final JSONObject refusal = cases.getJSONObject(i);
            final SecAggClient device = new SecAggClient(round, refusal.getInt("client"), Signatures.newSigningKey(),
                    new SecAggBounds(), null);
            TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
            for (int n = 0; n < neighbours.length(); n++) {
                nonces.put(neighbours.getJSONObject(n).getInt("client"), hex(neighbours.getJSONObject(n), "nonce"));
            }
            nonces.put(refusal.getInt("client"), Base64.decode(device.advertiseKeys().getString("nonce")));
            JSONArray steps = refusal.getJSONArray("steps");
            for (int step = 0; step < steps.length() - 1; step++) {
                answer(device, inThisRun(round, steps.getJSONObject(step), nonces));
            }
            final JSONObject last = inThisRun(round, steps.getJSONObject(steps.length() - 1), nonces);
            ProtocolViolation violation = assertThrows(ProtocolViolation.class, () -> answer(device, last),
                    refusal.getString("name"));
            assertEquals(refusal.getString("reason"), violation.reason(), refusal.getString("name"));
        }
    }

    @Test
    void aSeatOutsideTheRoundOrAConfigurationOutsideTheDevicesBoundsIsRefusedWhenTheClientIsMade() throws Exception {
        for (final int seat : new int[] {-1, config.numClients}) {
            assertEquals("malformed", assertThrows(ProtocolViolation.class, () -> new SecAggClient(config, seat,
                    Signatures.newSigningKey(), new SecAggBounds(), null)).reason(), "seat " + seat);
        }
        new SecAggClient(config, config.numClients - 1, Signatures.newSigningKey(), new SecAggBounds(), null);
        final SecAggConfig outside = SecAggConfig.fromJson(vectors.getJSONArray("bounds_refusals").getJSONObject(0));
        assertEquals("config_out_of_bounds", assertThrows(ProtocolViolation.class, () -> new SecAggClient(outside, 0,
                Signatures.newSigningKey(), new SecAggBounds(), null)).reason());
    }

    @Test
    void aStageTheServerAsksForOutOfOrderIsRefused() throws Exception {
        final SecAggClient device = new SecAggClient(config, 0, Signatures.newSigningKey(), new SecAggBounds(), null);
        final JSONObject shareKeys = new JSONObject().put("stage", "share_keys");
        assertEquals("wrong_stage", assertThrows(ProtocolViolation.class, () -> device.shareKeys(shareKeys)).reason());
        device.advertiseKeys();
        assertEquals("wrong_stage", assertThrows(ProtocolViolation.class, device::advertiseKeys).reason());
        final JSONObject masked = new JSONObject().put("stage", "masked_input")
                .put("encrypted_shares", new JSONArray());
        assertEquals("wrong_stage", assertThrows(ProtocolViolation.class,
                () -> device.maskedInput(masked, new int[config.vectorLength + 1])).reason());
        final JSONObject unmask = new JSONObject().put("stage", "unmask").put("survivors", new JSONArray())
                .put("signatures", new JSONArray());
        assertEquals("wrong_stage", assertThrows(ProtocolViolation.class, () -> device.unmask(unmask)).reason());
    }

    /**
     * Client 0's reply to share_keys in a fresh honest round of the vectors' configuration, pinning every other
     * device's long-term key or ({@code pinNeighbours} false) only its own.
     */
    private static JSONObject clientZeroSharesKeys(boolean pinNeighbours) throws Exception {
        int n = config.numClients;
        Ed25519PrivateKeyParameters[] keys = new Ed25519PrivateKeyParameters[n];
        Set<String> pinned = new HashSet<String>();
        for (int c = 0; c < n; c++) {
            keys[c] = Signatures.newSigningKey();
            if (c == 0 || pinNeighbours) {
                pinned.add(Base64.toBase64String(Signatures.publicBytes(keys[c])));
            }
        }
        SecAggClient device = new SecAggClient(config, 0, keys[0], new SecAggBounds(), pinned);
        JSONObject[] adverts = new JSONObject[n];
        TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
        for (int c = 0; c < n; c++) {
            adverts[c] = c == 0 ? device.advertiseKeys()
                    : new SecAggClient(config, c, keys[c], new SecAggBounds(), null).advertiseKeys();
            nonces.put(c, Base64.decode(adverts[c].getString("nonce")));
        }
        JSONArray relayed = new JSONArray();
        for (int peer : Graph.neighbours(config, Graph.graphSeed(config, nonces), 0)) {
            relayed.put(new JSONObject().put("client", peer)
                    .put("cipher_public_key", adverts[peer].get("cipher_public_key"))
                    .put("mask_public_key", adverts[peer].get("mask_public_key"))
                    .put("signing_public_key", Base64.toBase64String(Signatures.publicBytes(keys[peer])))
                    .put("signature", adverts[peer].get("signature")));
        }
        return device.shareKeys(new JSONObject().put("stage", "share_keys").put("public_keys", relayed)
                .put("advertised", Base64.toBase64String(Graph.advertisedBytes(nonces))));
    }

    /**
     * With the enrolled keys pinned, a neighbour's key outside them is refused even under a valid signature (the
     * server made both up); each round's self-mask seed is fresh, so no two rounds share one.
     */
    @Test
    void aRelayedKeyOutsideThePinnedKeysIsRefusedAndEachRoundDrawsAFreshSelfMaskSeed() throws Exception {
        JSONObject first = clientZeroSharesKeys(true);
        JSONObject second = clientZeroSharesKeys(true);
        assertEquals(config.neighbourCount, first.getJSONArray("shares").length());
        assertNotEquals(first.getString("self_mask_seed_commitment"), second.getString("self_mask_seed_commitment"));
        assertEquals("bad_signature", assertThrows(ProtocolViolation.class, () -> clientZeroSharesKeys(false))
                .reason());
    }

    @Test
    void eachAdvertisementCarriesAFreshNonce() throws Exception {
        JSONObject first = new SecAggClient(config, 0, Signatures.newSigningKey(), new SecAggBounds(), null)
                .advertiseKeys();
        JSONObject second = new SecAggClient(config, 0, Signatures.newSigningKey(), new SecAggBounds(), null)
                .advertiseKeys();
        assertNotEquals(first.getString("nonce"), second.getString("nonce"));
        assertEquals(Signatures.NONCE_BYTES, Base64.decode(first.getString("nonce")).length);
    }

    @Test
    void aSurvivorSetOfExactlyTheMinimumIsSignedAndOneSmallerIsRefused() throws Exception {
        SecAggClient[] clients = roundThroughMaskedInput();
        JSONArray least = new JSONArray();
        for (int c = 0; c < config.minimumSurvivors; c++) {
            least.put(c);
        }
        JSONObject signed = clients[0].consistencyCheck(new JSONObject().put("stage", "consistency_check")
                .put("survivors", least));
        assertEquals(64, Base64.decode(signed.getString("signature")).length);
        least.remove(least.length() - 1);
        final JSONObject tooFew = new JSONObject().put("stage", "consistency_check").put("survivors", least);
        assertEquals("too_few_survivors", assertThrows(ProtocolViolation.class,
                () -> clients[1].consistencyCheck(tooFew)).reason());
    }

    /**
     * Everyone survived: the t shares a device's neighbours reveal for it are distinct shares of its self-mask seed
     * (the seed its stage-2 commitment names), never of its mask key, and none is the seed itself.
     */
    @Test
    void theSharesRevealedForASurvivorRebuildItsCommittedSelfMaskSeed() throws Exception {
        SecAggClient[] clients = roundThroughMaskedInput();
        JSONArray everyone = new JSONArray();
        for (int c = 0; c < config.numClients; c++) {
            everyone.put(c);
        }
        JSONObject show = new JSONObject().put("stage", "consistency_check").put("survivors", everyone);
        Object[] signatures = new Object[config.numClients];
        for (int c = 0; c < config.numClients; c++) {
            signatures[c] = clients[c].consistencyCheck(show).get("signature");
        }
        int owner = 0;
        int[] holders = Graph.neighbours(config, lastGraphSeed, owner);
        int[] xs = new int[holders.length];
        BigInteger[] values = new BigInteger[holders.length];
        for (int h = 0; h < holders.length; h++) {
            JSONArray signed = new JSONArray();
            for (int peer : Graph.neighbours(config, lastGraphSeed, holders[h])) {
                signed.put(new JSONObject().put("client", peer).put("signature", signatures[peer]));
            }
            JSONArray shares = clients[holders[h]].unmask(new JSONObject().put("stage", "unmask")
                    .put("survivors", everyone).put("signatures", signed)).getJSONArray("shares");
            for (int i = 0; i < shares.length(); i++) {
                JSONObject share = shares.getJSONObject(i);
                if (share.getInt("owner") == owner) {
                    assertEquals("self_mask", share.getString("kind"));
                    xs[h] = holders[h] + 1;
                    values[h] = new BigInteger(1, Base64.decode(share.getString("value")));
                }
            }
        }
        assertEquals(holders.length, new HashSet<BigInteger>(Arrays.asList(values)).size(),
                "no two holders hold one share");
        byte[] seed = Shamir.combine(xs, values, config.threshold);
        assertEquals(false, Arrays.asList(values).contains(new BigInteger(1, seed)), "no share is the seed itself");
        assertEquals(lastSeedCommitments[owner], Crypto.commitment(32, config.context(),
                "self_mask_seed".getBytes(SecAggConfig.UTF8), SecAggConfig.u32(owner), seed));
    }
}
