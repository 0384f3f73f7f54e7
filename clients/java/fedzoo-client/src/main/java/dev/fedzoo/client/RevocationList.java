package dev.fedzoo.client;

import java.util.Collections;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Pattern;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

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
    private static final String WHAT = "revocation list";
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
        Object payload = SignedDocuments.open(document, keys, DOMAIN, WHAT);
        if (!(payload instanceof JSONObject)) {
            throw malformed("the payload is not a JSON object");
        }
        RevocationList listed = fromPayload((JSONObject) payload, document.optString("key_id"), document);
        SignedDocuments.refuseOlder(listed.version, listed.document, held != null ? held.version : null,
                held != null ? held.document : null, WHAT);
        return listed;
    }

    /**
     * The list a device stored after verifying it (its {@link StateStore}, as trusted as the versions it accepted),
     * read without checking the signature again: a pinned key retired since must not make the device forget it.
     */
    public static RevocationList held(JSONObject document) {
        try {
            return fromPayload(SignedDocuments.readHeld(document), document.getString("key_id"), document);
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
        JSONObject stored = SignedDocuments.envelope(document);
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
}
