package dev.fedzoo.secagg;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.io.File;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TimeZone;
import java.util.TreeMap;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.bouncycastle.util.encoders.Hex;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;

/**
 * Device certificates: every case of the shared vectors ({@code tests/vectors/device_certificates.json}, written by
 * Python) decided as Python decides it, and a lying server's Sybils and key substitutions refused by the real
 * {@link SecAggClient}: each attack first lands on a client without certificates, then is refused with them.
 */
class DeviceCertificatesTest {
    private static final SecAggConfig CONFIG = new SecAggConfig("round-certified", 5, 4, 4, 5, 1.0, 127, 4);

    private static JSONObject vectors() throws Exception {
        return new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/device_certificates.json")), TestSupport.UTF8));
    }

    private static long millis(String timestamp) throws Exception {
        java.text.SimpleDateFormat format = new java.text.SimpleDateFormat("yyyy-MM-dd'T'HH:mm:ss'Z'");
        format.setTimeZone(TimeZone.getTimeZone("UTC"));
        return format.parse(timestamp).getTime();
    }

    @Test
    void everyCertificateVectorIsDecidedAsPythonDecidesIt() throws Exception {
        JSONObject vectors = vectors();
        DeviceCertificates operator = DeviceCertificates.fromJson(vectors.getJSONObject("operator_keys"));
        JSONArray cases = vectors.getJSONArray("certificates");
        Set<String> reasons = new HashSet<String>();
        for (int i = 0; i < cases.length(); i++) {
            JSONObject vector = cases.getJSONObject(i);
            Set<String> revoked = new HashSet<String>();
            for (int k = 0; k < vector.getJSONArray("revoked_keys").length(); k++) {
                revoked.add(vector.getJSONArray("revoked_keys").getString(k));
            }
            String verdict = "ok";
            try {
                operator.withRevoked(revoked).verify(vector.opt("certificate"), vector.getString("device_id"),
                        Base64.decode(vector.getString("signing_public_key")), millis(vector.getString("now")));
            } catch (DeviceCertificateException refused) {
                verdict = refused.reason();
            }
            assertEquals(vector.getString("expect"), verdict, vector.getString("name"));
            reasons.add(verdict);
        }
        assertEquals(9, reasons.size(), "ok and every refusal reason");
    }

    @Test
    void theSignedBytesAreTheLabelAndThePayloadPythonSigns() throws Exception {
        JSONObject vectors = vectors();
        JSONObject valid = vectors.getJSONArray("certificates").getJSONObject(0);
        byte[] payload = Base64.decode(valid.getJSONObject("certificate").getString("payload"));
        byte[] signed = new byte[DeviceCertificates.CERTIFICATE_DOMAIN.length + payload.length];
        System.arraycopy(DeviceCertificates.CERTIFICATE_DOMAIN, 0, signed, 0, DeviceCertificates.CERTIFICATE_DOMAIN.length);
        System.arraycopy(payload, 0, signed, DeviceCertificates.CERTIFICATE_DOMAIN.length, payload.length);
        assertEquals(vectors.getString("signed_bytes_hex"), Hex.toHexString(signed));
    }

    /** CONFIG's clients as enrolled devices (k = n - 1: every client neighbours every other), and an operator. */
    private static final class Fleet {
        final Ed25519PrivateKeyParameters operator = Signatures.newSigningKey();
        final Map<Integer, Ed25519PrivateKeyParameters> keys = new LinkedHashMap<Integer, Ed25519PrivateKeyParameters>();

        Fleet() {
            for (int client = 0; client < CONFIG.numClients; client++) {
                keys.put(client, Signatures.newSigningKey());
            }
        }

        DeviceCertificates policy(Set<String> revoked) throws Exception {
            JSONObject entry = new JSONObject().put("public_key", Base64.toBase64String(Signatures.publicBytes(operator)));
            return DeviceCertificates.fromJson(new JSONObject().put("keys", new JSONArray().put(entry))).withRevoked(revoked);
        }

        /**
         * The victim's (client 0's) share_keys request: each neighbour's stage-1 reply, key and certificate, and the
         * neighbours' advertised nonces ({@link #refusal} adds the victim's own, which fixes the graph under v3).
         */
        JSONObject request(Map<Integer, Ed25519PrivateKeyParameters> relayedKeys, Map<Integer, JSONObject> certificates) throws Exception {
            JSONArray entries = new JSONArray();
            TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
            for (int client = 1; client < CONFIG.numClients; client++) {
                JSONObject advertised = new SecAggClient(CONFIG, client, relayedKeys.get(client), new SecAggBounds(), null)
                        .advertiseKeys();
                nonces.put(client, Base64.decode(advertised.getString("nonce")));
                entries.put(new JSONObject().put("client", client)
                        .put("cipher_public_key", advertised.get("cipher_public_key"))
                        .put("mask_public_key", advertised.get("mask_public_key"))
                        .put("signature", advertised.get("signature"))
                        .put("signing_public_key", Base64.toBase64String(Signatures.publicBytes(relayedKeys.get(client))))
                        .put("device_id", "phone-" + client).put("certificate", certificates.get(client)));
            }
            return new JSONObject().put("stage", "share_keys").put("public_keys", entries)
                    .put("advertised", Base64.toBase64String(Graph.advertisedBytes(nonces)));
        }

        Map<Integer, JSONObject> certificates(Ed25519PrivateKeyParameters signer) throws Exception {
            Map<Integer, JSONObject> certificates = new LinkedHashMap<Integer, JSONObject>();
            for (Map.Entry<Integer, Ed25519PrivateKeyParameters> device : keys.entrySet()) {
                certificates.put(device.getKey(), certificate("phone-" + device.getKey(), device.getValue(), signer));
            }
            return certificates;
        }

        String refusal(JSONObject request, DeviceCertificates policy) throws Exception {
            SecAggClient victim = new SecAggClient(CONFIG, 0, keys.get(0), new SecAggBounds(), null, new SignedRounds(),
                    policy);
            JSONObject advertised = victim.advertiseKeys();
            TreeMap<Integer, byte[]> nonces = Graph.readAdvertised(Base64.decode(request.getString("advertised")),
                    CONFIG.numClients);
            nonces.put(0, Base64.decode(advertised.getString("nonce")));
            try {
                victim.shareKeys(new JSONObject(request.toString())
                        .put("advertised", Base64.toBase64String(Graph.advertisedBytes(nonces))));
                return null;
            } catch (ProtocolViolation refused) {
                return refused.reason();
            }
        }
    }

    /** What {@code fedzoo devices certify} writes, made here with the test's own operator key. */
    static JSONObject certificate(String deviceId, Ed25519PrivateKeyParameters device, Ed25519PrivateKeyParameters signer)
            throws Exception {
        String keyId = Hex.toHexString(sha256(Signatures.publicBytes(signer))).substring(0, 16);
        byte[] payload = new JSONObject().put("purpose", "device_certificate").put("device_id", deviceId)
                .put("signing_public_key", Base64.toBase64String(Signatures.publicBytes(device)))
                .put("issued_at", "2026-01-01T00:00:00Z").put("expires_at", "2099-01-01T00:00:00Z").put("key_id", keyId)
                .toString().getBytes(SecAggConfig.UTF8);
        byte[] signed = new byte[DeviceCertificates.CERTIFICATE_DOMAIN.length + payload.length];
        System.arraycopy(DeviceCertificates.CERTIFICATE_DOMAIN, 0, signed, 0, DeviceCertificates.CERTIFICATE_DOMAIN.length);
        System.arraycopy(payload, 0, signed, DeviceCertificates.CERTIFICATE_DOMAIN.length, payload.length);
        return new JSONObject().put("key_id", keyId).put("payload", Base64.toBase64String(payload))
                .put("signature", Base64.toBase64String(Signatures.sign(signer, signed)));
    }

    private static byte[] sha256(byte[] data) {
        try {
            return java.security.MessageDigest.getInstance("SHA-256").digest(data);
        } catch (java.security.NoSuchAlgorithmException impossible) {
            throw new IllegalStateException(impossible);
        }
    }

    @Test
    void certifiedNeighboursAreAccepted() throws Exception {
        Fleet fleet = new Fleet();
        assertNull(fleet.refusal(fleet.request(fleet.keys, fleet.certificates(fleet.operator)),
                fleet.policy(Collections.<String>emptySet())));
    }

    @Test
    void sybilsTheServerMadeAndCertifiedWithItsOwnKeyAreRefused() throws Exception {
        Fleet fleet = new Fleet();
        Map<Integer, Ed25519PrivateKeyParameters> sybils = new LinkedHashMap<Integer, Ed25519PrivateKeyParameters>();
        Map<Integer, JSONObject> forged = new LinkedHashMap<Integer, JSONObject>();
        Ed25519PrivateKeyParameters serverKey = Signatures.newSigningKey();
        for (int client = 0; client < CONFIG.numClients; client++) {
            sybils.put(client, Signatures.newSigningKey());
            forged.put(client, certificate("phone-" + client, sybils.get(client), serverKey));
        }
        assertNull(fleet.refusal(fleet.request(sybils, forged), null), "without certificates the Sybils are accepted");
        assertEquals("uncertified_key", fleet.refusal(fleet.request(sybils, forged), fleet.policy(Collections.<String>emptySet())));
        assertEquals("uncertified_key", fleet.refusal(fleet.request(sybils, new LinkedHashMap<Integer, JSONObject>()),
                fleet.policy(Collections.<String>emptySet())));
    }

    @Test
    void aServerSubstitutingOneDevicesKeyIsRefused() throws Exception {
        Fleet fleet = new Fleet();
        Map<Integer, Ed25519PrivateKeyParameters> substituted = new LinkedHashMap<Integer, Ed25519PrivateKeyParameters>(fleet.keys);
        substituted.put(1, Signatures.newSigningKey()); // device 1's own certificate is still relayed
        JSONObject request = fleet.request(substituted, fleet.certificates(fleet.operator));
        assertNull(fleet.refusal(request, null), "without certificates the substituted key is accepted");
        assertEquals("uncertified_key", fleet.refusal(request, fleet.policy(Collections.<String>emptySet())));
    }

    @Test
    void aRevokedDeviceIsRefused() throws Exception {
        Fleet fleet = new Fleet();
        JSONObject request = fleet.request(fleet.keys, fleet.certificates(fleet.operator));
        Set<String> revoked = Collections.singleton(DeviceCertificates.keyFingerprint(Signatures.publicBytes(fleet.keys.get(1))));
        assertEquals("revoked_key", fleet.refusal(request, fleet.policy(revoked)));
    }

    @Test
    void oneDeviceSeatedTwiceUnderTwoCertifiedKeysIsRefused() throws Exception {
        Fleet fleet = new Fleet();
        Map<Integer, JSONObject> certificates = fleet.certificates(fleet.operator);
        JSONObject request = fleet.request(fleet.keys, certificates);
        JSONObject second = request.getJSONArray("public_keys").getJSONObject(1); // client 2, certified as phone-1
        second.put("device_id", "phone-1").put("certificate", certificate("phone-1", fleet.keys.get(2), fleet.operator));
        assertEquals("uncertified_key", fleet.refusal(request, fleet.policy(Collections.<String>emptySet())));
    }
}
