package dev.fedzoo.client;

import java.util.Collections;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Pattern;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.bouncycastle.crypto.signers.Ed25519Signer;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;
import org.json.JSONTokener;

import dev.fedzoo.ModelCard;

/**
 * The operator's one signed revocation list, as {@code fedzoo.revocation}: cards (by id or model sha256) no device
 * may load any more, and device signing keys (by fingerprint, {@code DeviceCertificates.keyFingerprint}) no device
 * accepts as a SecAgg+ neighbour. The document carries its signed bytes
 * ({@code {"key_id", "algorithm", "payload", "signature"}}); the signature covers
 * {@code "fedzoo-revocation-list-v1\n" + payload}, a purpose label no card signature or certificate shares. Its
 * version only grows, one counter for both sections: {@link StateStore} keeps the newest list verified and refuses
 * an older one or another list under the held version. Decided exactly as Python decides the shared vectors
 * ({@code tests/vectors/revocation_lists.json}).
 */
public final class RevocationList {
    private static final byte[] DOMAIN = "fedzoo-revocation-list-v1\n".getBytes(FedzooHttp.UTF8);
    private static final String PURPOSE = "revocation_list";
    private static final int CONTRACT = 1;
    private static final int MAX_ENTRIES = 100_000;
    private static final Pattern IDENTIFIER = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,127}");
    private static final Pattern SHA256 = Pattern.compile("[0-9a-f]{64}");

    private final int version;
    private final Set<String> cardIds;
    private final Set<String> cardSha256s;
    private final Set<String> deviceKeyFingerprints;
    private final JSONObject document;

    private RevocationList(int version, Set<String> cardIds, Set<String> cardSha256s, Set<String> deviceKeyFingerprints,
            JSONObject document) {
        this.version = version;
        this.cardIds = Collections.unmodifiableSet(cardIds);
        this.cardSha256s = Collections.unmodifiableSet(cardSha256s);
        this.deviceKeyFingerprints = Collections.unmodifiableSet(deviceKeyFingerprints);
        this.document = document;
    }

    /** The list's version. */
    public int version() {
        return version;
    }

    /** The fingerprints (hex sha256 of the raw key) of the revoked device signing keys. */
    public Set<String> deviceKeyFingerprints() {
        return deviceKeyFingerprints;
    }

    /** The signed document, as served and stored. */
    public JSONObject document() {
        return document;
    }

    /** Throws {@link CardSignatureException} ({@code revoked}) when this list revokes the card or its model bytes. */
    public void refuseRevoked(ModelCard card) {
        boolean byId = cardIds.contains(card.id());
        if (byId || cardSha256s.contains(card.sha256())) {
            throw new CardSignatureException("card '" + card.id() + "' is revoked by the operator's revocation list version "
                    + version + " (by its " + (byId ? "id" : "model sha256 " + card.sha256()) + ")", "revoked");
        }
    }

    /**
     * The list in {@code document} once one of {@code keys} (the pinned operator keys, by key id) is seen to have
     * signed it; a
     * {@link CardSignatureException} ({@code unknown_key}, {@code bad_signature}, {@code field_mismatch},
     * {@code rollback}: older than {@code held}, {@code version_reused}: another list under its version) otherwise.
     */
    public static RevocationList verify(JSONObject document, Map<String, Ed25519PublicKeyParameters> keys,
            RevocationList held) {
        String keyId = document.opt("key_id") instanceof String ? document.optString("key_id") : null;
        String payloadText = document.opt("payload") instanceof String ? document.optString("payload") : null;
        String signatureText = document.opt("signature") instanceof String ? document.optString("signature") : null;
        if (keyId == null || payloadText == null || signatureText == null) {
            throw new CardSignatureException("a revocation list is {\"key_id\", \"algorithm\", \"payload\", \"signature\"}",
                    "field_mismatch");
        }
        Ed25519PublicKeyParameters key = keys.get(keyId);
        if (key == null) {
            throw new CardSignatureException("the revocation list is signed by key " + keyId
                    + ", which is not among the operator keys " + keys.keySet(), "unknown_key");
        }
        byte[] raw = strictBase64(payloadText);
        byte[] signature = strictBase64(signatureText);
        Object payload;
        try {
            if (raw == null || signature == null) {
                throw new JSONException("not base64");
            }
            Ed25519Signer signer = new Ed25519Signer();
            signer.init(false, key);
            signer.update(DOMAIN, 0, DOMAIN.length);
            signer.update(raw, 0, raw.length);
            if (!signer.verifySignature(signature)) {
                throw new JSONException("the signature does not verify");
            }
            payload = new JSONTokener(new String(raw, FedzooHttp.UTF8)).nextValue();
        } catch (JSONException | IllegalArgumentException unverified) {
            throw new CardSignatureException("the revocation list's signature does not verify", "bad_signature");
        }
        if (!(payload instanceof JSONObject)) {
            throw malformed("the payload is not a JSON object");
        }
        RevocationList listed = fromPayload((JSONObject) payload, keyId, document);
        if (held != null && listed.version < held.version) {
            throw new CardSignatureException("revocation list version " + listed.version + " is older than version "
                    + held.version + ", already held (rollback refused)", "rollback");
        }
        if (held != null && listed.version == held.version
                && !payloadText.equals(held.document.optString("payload"))) {
            throw new CardSignatureException("a different revocation list under version " + held.version
                    + ", already held", "version_reused");
        }
        return listed;
    }

    /**
     * The list a device stored after verifying it (its {@link StateStore}, as trusted as the versions it accepted),
     * read without checking the signature again: a pinned key retired since must not make the device forget it.
     */
    public static RevocationList held(JSONObject document) {
        try {
            return fromPayload(new JSONObject(new String(Base64.decode(document.getString("payload")), FedzooHttp.UTF8)),
                    document.getString("key_id"), document);
        } catch (JSONException | IllegalArgumentException unreadable) {
            throw malformed("the stored list is unreadable: " + unreadable.getMessage());
        }
    }

    private static RevocationList fromPayload(JSONObject payload, String keyId, JSONObject document) {
        Object version = payload.opt("version");
        Object contract = payload.opt("contract");
        JSONObject cards = payload.optJSONObject("revoked_cards");
        if (!PURPOSE.equals(payload.opt("purpose")) || !(contract instanceof Integer) || (Integer) contract != CONTRACT
                || !(version instanceof Integer) || (Integer) version < 1 || !(payload.opt("issued_at") instanceof String)
                || !(payload.opt("key_id") instanceof String) || cards == null || cards.length() != 2
                || !cards.has("ids") || !cards.has("sha256s")) {
            throw malformed("the payload is not a contract-" + CONTRACT + " " + PURPOSE);
        }
        if (!keyId.equals(payload.optString("key_id"))) {
            throw malformed("the revocation list's key_id is not the signed one");
        }
        JSONObject stored = new JSONObject();
        try {
            for (String name : new String[] {"key_id", "algorithm", "payload", "signature"}) {
                if (document.has(name)) {
                    stored.put(name, document.opt(name));
                }
            }
        } catch (JSONException unreachable) { // putting a value read from a JSONObject cannot fail
            throw malformed(unreachable.getMessage());
        }
        return new RevocationList((Integer) version, strings(cards.opt("ids"), IDENTIFIER, "revoked_cards.ids"),
                strings(cards.opt("sha256s"), SHA256, "revoked_cards.sha256s"),
                strings(payload.opt("revoked_device_keys"), SHA256, "revoked_device_keys"), stored);
    }

    private static Set<String> strings(Object values, Pattern pattern, String field) {
        if (!(values instanceof JSONArray) || ((JSONArray) values).length() > MAX_ENTRIES) {
            throw malformed(field + " must be a list of at most " + MAX_ENTRIES);
        }
        Set<String> set = new TreeSet<String>();
        JSONArray array = (JSONArray) values;
        for (int i = 0; i < array.length(); i++) {
            Object value = array.opt(i);
            if (!(value instanceof String) || !pattern.matcher((String) value).matches()) {
                throw malformed(field + ": " + value + " does not match " + pattern);
            }
            set.add((String) value);
        }
        return set;
    }

    private static CardSignatureException malformed(String problem) {
        return new CardSignatureException("the signed revocation list is malformed: " + problem, "field_mismatch");
    }

    /** Strict base64 (as Python's {@code b64decode(validate=True)}), or null when it is not. */
    private static byte[] strictBase64(String text) {
        if (!text.matches("[A-Za-z0-9+/]*={0,2}") || text.length() % 4 != 0) {
            return null;
        }
        return Base64.decode(text);
    }
}
