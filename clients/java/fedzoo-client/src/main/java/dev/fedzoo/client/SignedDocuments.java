package dev.fedzoo.client;

import java.util.Map;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.bouncycastle.crypto.signers.Ed25519Signer;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONException;
import org.json.JSONObject;
import org.json.JSONTokener;

/**
 * The envelope of a document the operator signs offline and devices verify against their pinned operator keys, as
 * {@code fedzoo.signed_documents}: {@code {"key_id", "algorithm", "payload", "signature"}}, the signature over a
 * purpose label ({@code domain}) + the payload bytes. Used by {@link RevocationList} and {@link PrivacyTerms}.
 */
final class SignedDocuments {
    private static final String[] ENVELOPE = {"key_id", "algorithm", "payload", "signature"};

    private SignedDocuments() {
    }

    /**
     * The decoded payload once one of {@code keys} is seen to have signed {@code domain + payload};
     * {@link CardSignatureException} ({@code field_mismatch}, {@code unknown_key}, {@code bad_signature}) otherwise.
     */
    static Object open(JSONObject document, Map<String, Ed25519PublicKeyParameters> keys, byte[] domain, String what) {
        String keyId = document.opt("key_id") instanceof String ? document.optString("key_id") : null;
        String payloadText = document.opt("payload") instanceof String ? document.optString("payload") : null;
        String signatureText = document.opt("signature") instanceof String ? document.optString("signature") : null;
        if (keyId == null || payloadText == null || signatureText == null) {
            throw new CardSignatureException("a " + what + " is {\"key_id\", \"algorithm\", \"payload\", \"signature\"}",
                    "field_mismatch");
        }
        Ed25519PublicKeyParameters key = keys.get(keyId);
        if (key == null) {
            throw new CardSignatureException("the " + what + " is signed by key " + keyId
                    + ", which is not among the operator keys " + keys.keySet(), "unknown_key");
        }
        byte[] raw = strictBase64(payloadText);
        byte[] signature = strictBase64(signatureText);
        try {
            if (raw == null || signature == null) {
                throw new JSONException("not base64");
            }
            Ed25519Signer signer = new Ed25519Signer();
            signer.init(false, key);
            signer.update(domain, 0, domain.length);
            signer.update(raw, 0, raw.length);
            if (!signer.verifySignature(signature)) {
                throw new JSONException("the signature does not verify");
            }
            return new JSONTokener(new String(raw, FedzooHttp.UTF8)).nextValue();
        } catch (JSONException | IllegalArgumentException unverified) {
            throw new CardSignatureException("the " + what + "'s signature does not verify", "bad_signature");
        }
    }

    /** The payload of a document the device stored after verifying it, without checking the signature again. */
    static JSONObject readHeld(JSONObject document) throws JSONException {
        return new JSONObject(new String(Base64.decode(document.getString("payload")), FedzooHttp.UTF8));
    }

    /** The document as stored and served: its envelope fields only. */
    static JSONObject envelope(JSONObject document) {
        JSONObject stored = new JSONObject();
        try {
            for (String name : ENVELOPE) {
                if (document.has(name)) {
                    stored.put(name, document.opt(name));
                }
            }
        } catch (JSONException unreachable) { // putting a value read from a JSONObject cannot fail
            throw new CardSignatureException(unreachable.getMessage(), "field_mismatch");
        }
        return stored;
    }

    /** {@code rollback} for a version older than the held one, {@code version_reused} for another document under it. */
    static void refuseOlder(int version, JSONObject document, Integer heldVersion, JSONObject heldDocument,
            String what) {
        if (heldVersion == null || heldDocument == null) {
            return;
        }
        if (version < heldVersion) {
            throw new CardSignatureException(what + " version " + version + " is older than version " + heldVersion
                    + ", already held (rollback refused)", "rollback");
        }
        if (version == heldVersion && !document.optString("payload").equals(heldDocument.optString("payload"))) {
            throw new CardSignatureException("a different " + what + " under version " + heldVersion
                    + ", already held", "version_reused");
        }
    }

    /** Strict base64 (as Python's {@code b64decode(validate=True)}), or null when it is not. */
    private static byte[] strictBase64(String text) {
        if (!text.matches("[A-Za-z0-9+/]*={0,2}") || text.length() % 4 != 0) {
            return null;
        }
        return Base64.decode(text);
    }
}
