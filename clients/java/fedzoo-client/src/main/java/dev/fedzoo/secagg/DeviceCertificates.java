package dev.fedzoo.secagg;

import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.text.ParseException;
import java.text.SimpleDateFormat;
import java.util.Collections;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TimeZone;
import java.util.TreeMap;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.bouncycastle.crypto.signers.Ed25519Signer;
import org.bouncycastle.util.encoders.Base64;
import org.bouncycastle.util.encoders.Hex;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.InvalidInputException;

/**
 * The operator's certificates of devices' SecAgg+ signing keys, checked as {@code fedzoo.device_certificates} does: a
 * neighbour's key counts only when a pinned operator key signed {@code "fedzoo-device-certificate-v1\n" + payload},
 * the payload ({@code {"purpose": "device_certificate", "device_id", "signing_public_key", "issued_at",
 * "expires_at", "key_id"}}, carried base64) names the device the server seats and this very key, it has not expired
 * and the key is not revoked. The label keeps card signatures ({@code "fedzoo-card-v2\n"}) from passing as
 * certificates. Pin the operator's key set ({@code fedzoo keys export-public}), never the fleet set
 * {@code GET /v1/keys}: that one holds the server's own key, with which a server could certify its own Sybils.
 */
public final class DeviceCertificates {
    static final byte[] CERTIFICATE_DOMAIN = "fedzoo-device-certificate-v1\n".getBytes(SecAggConfig.UTF8);
    static final String CERTIFICATE_PURPOSE = "device_certificate";
    private static final String TIMESTAMP = "yyyy-MM-dd'T'HH:mm:ss'Z'";

    private final Map<String, Ed25519PublicKeyParameters> operatorKeys;
    private final Set<String> revokedFingerprints;

    private DeviceCertificates(Map<String, Ed25519PublicKeyParameters> operatorKeys, Set<String> revokedFingerprints) {
        this.operatorKeys = operatorKeys;
        this.revokedFingerprints = Collections.unmodifiableSet(new HashSet<String>(revokedFingerprints));
    }

    /** The operator key set {@code {"keys": [{"key_id", "algorithm", "public_key"}]}}, nothing revoked yet. */
    public static DeviceCertificates fromJson(JSONObject keySet) {
        JSONArray entries = keySet.optJSONArray("keys");
        if (entries == null) {
            throw new InvalidInputException("a key set is {\"keys\": [...]}", "keys");
        }
        Map<String, Ed25519PublicKeyParameters> keys = new TreeMap<String, Ed25519PublicKeyParameters>();
        for (int i = 0; i < entries.length(); i++) {
            JSONObject entry = entries.optJSONObject(i);
            byte[] raw = entry == null ? null : decode(entry.optString("public_key", null));
            if (raw == null || raw.length != 32) {
                throw new InvalidInputException("keys[" + i + "].public_key must be base64 of 32 bytes", "keys[" + i + "].public_key");
            }
            String keyId = Hex.toHexString(sha256(raw)).substring(0, 16);
            if (!entry.optString("key_id", keyId).equals(keyId)) {
                throw new InvalidInputException("keys[" + i + "]: key_id is not this key's (" + keyId + ")", "keys[" + i + "].key_id");
            }
            keys.put(keyId, new Ed25519PublicKeyParameters(raw, 0));
        }
        return new DeviceCertificates(keys, Collections.<String>emptySet());
    }

    /** The pinned operator keys by key id (what the operator's revocation list must verify against). */
    public Map<String, Ed25519PublicKeyParameters> operatorKeys() {
        return Collections.unmodifiableMap(operatorKeys);
    }

    /** The same operator keys, refusing also the keys whose fingerprints ({@link #keyFingerprint}) are given. */
    public DeviceCertificates withRevoked(Set<String> fingerprints) {
        return new DeviceCertificates(operatorKeys, fingerprints);
    }

    /** How revocation lists name a device key: the hex sha256 of its 32 raw bytes. */
    public static String keyFingerprint(byte[] signingPublicKey) {
        return Hex.toHexString(sha256(signingPublicKey));
    }

    /**
     * Returns the certified device id, or throws {@link DeviceCertificateException} unless an operator key certified
     * {@code signingPublicKey} as the key of {@code deviceId} (a non-string never matches), unexpired at
     * {@code nowMillis}, and not revoked.
     */
    public String verify(Object certificate, Object deviceId, byte[] signingPublicKey, long nowMillis) {
        JSONObject fields = openSealed(certificate, CERTIFICATE_DOMAIN, CERTIFICATE_PURPOSE);
        String certified = fields.opt("device_id") instanceof String ? fields.optString("device_id") : null;
        byte[] key = decode(fields.opt("signing_public_key") instanceof String ? fields.optString("signing_public_key") : null);
        Long issuedAt = millis(fields.opt("issued_at"));
        Long expiresAt = millis(fields.opt("expires_at"));
        if (certified == null || key == null || key.length != 32 || issuedAt == null || expiresAt == null) {
            throw new DeviceCertificateException("the certificate's signed fields are incomplete or malformed", "malformed");
        }
        if (!certified.equals(deviceId instanceof String ? deviceId : "")) {
            throw new DeviceCertificateException("the certificate is device '" + certified + "''s, not '" + deviceId + "''s",
                    "wrong_device");
        }
        if (!java.util.Arrays.equals(key, signingPublicKey)) {
            throw new DeviceCertificateException("the certificate of device '" + certified + "' certifies another signing key",
                    "wrong_key");
        }
        if (nowMillis >= expiresAt) {
            throw new DeviceCertificateException("the certificate of device '" + certified + "' expired at "
                    + fields.optString("expires_at"), "expired");
        }
        if (revokedFingerprints.contains(keyFingerprint(signingPublicKey))) {
            throw new DeviceCertificateException("the operator revoked device '" + certified + "''s signing key", "revoked");
        }
        return certified;
    }

    /**
     * The fields of an operator-signed document {@code {"key_id", "payload", "signature"}} made for {@code purpose},
     * once a pinned key is shown to have signed exactly {@code domain + payload}.
     */
    JSONObject openSealed(Object document, byte[] domain, String purpose) {
        if (document == null || document == JSONObject.NULL) {
            throw new DeviceCertificateException("no " + purpose + " was given", "uncertified");
        }
        JSONObject sealed = document instanceof JSONObject ? (JSONObject) document : null;
        if (sealed == null || !(sealed.opt("key_id") instanceof String) || !(sealed.opt("payload") instanceof String)
                || !(sealed.opt("signature") instanceof String)) {
            throw new DeviceCertificateException("a " + purpose + " is {\"key_id\", \"payload\", \"signature\"} (strings)",
                    "malformed");
        }
        String keyId = sealed.optString("key_id");
        Ed25519PublicKeyParameters key = operatorKeys.get(keyId);
        if (key == null) {
            throw new DeviceCertificateException("the " + purpose + " is signed by key " + keyId
                    + ", not one of the operator keys " + operatorKeys.keySet(), "unknown_key");
        }
        byte[] payload = decode(sealed.optString("payload"));
        byte[] signature = decode(sealed.optString("signature"));
        boolean verified = false;
        if (payload != null && signature != null && signature.length == Signatures.SIGNATURE_BYTES) {
            Ed25519Signer verifier = new Ed25519Signer();
            verifier.init(false, key);
            verifier.update(domain, 0, domain.length);
            verifier.update(payload, 0, payload.length);
            verified = verifier.verifySignature(signature);
        }
        if (!verified) {
            throw new DeviceCertificateException("the " + purpose + "'s signature does not verify: not an operator-signed "
                    + purpose, "bad_signature");
        }
        JSONObject fields;
        try {
            fields = new JSONObject(new String(payload, SecAggConfig.UTF8));
        } catch (JSONException notJson) {
            throw new DeviceCertificateException("the " + purpose + "'s payload is not JSON", "malformed");
        }
        if (!purpose.equals(fields.opt("purpose")) || !keyId.equals(fields.opt("key_id"))) {
            throw new DeviceCertificateException("the signed payload is not a " + purpose, "bad_signature");
        }
        return fields;
    }

    private static Long millis(Object text) {
        if (!(text instanceof String)) {
            return null;
        }
        SimpleDateFormat format = new SimpleDateFormat(TIMESTAMP, Locale.ROOT);
        format.setTimeZone(TimeZone.getTimeZone("UTC"));
        format.setLenient(false);
        try {
            return format.parse((String) text).getTime();
        } catch (ParseException malformed) {
            return null;
        }
    }

    private static byte[] decode(String text) {
        if (text == null || !text.matches("[A-Za-z0-9+/]*={0,2}") || text.length() % 4 != 0) {
            return null;
        }
        return Base64.decode(text);
    }

    private static byte[] sha256(byte[] data) {
        try {
            return MessageDigest.getInstance("SHA-256").digest(data);
        } catch (NoSuchAlgorithmException impossible) {
            throw new IllegalStateException(impossible);
        }
    }
}
