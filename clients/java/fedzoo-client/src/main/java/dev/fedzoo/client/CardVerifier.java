package dev.fedzoo.client;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.bouncycastle.crypto.signers.Ed25519Signer;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.ModelCard;

/**
 * Checks a card's ed25519 signature against pinned keys before any of its bytes reach ONNX Runtime, exactly as
 * {@code fedzoo.signing.verify_card} (contract 2): the signature covers {@code "fedzoo-card-v2\n" + payload},
 * where the payload (carried base64 in the card) is {@code {"contract": 2, "card": ..., "expires_at", "key_id"}}
 * and {@code card} is the whole card but {@code signature} and {@code unsigned}. The verifier checks the signature
 * over those very bytes, then requires the card it received, field by field, to equal the signed one: a field
 * changed, added or left out of the payload is refused, so no JSON canonicalisation has to agree across
 * languages. Only {@code unsigned} (the server's measurements, which no device acts on) may differ. A card older
 * than the last version accepted for its line is refused (no rollback to a known-bad model), and so is a second
 * card for a line and version already accepted.
 * Ed25519 comes from BouncyCastle: Android's own provider has it only from API 33.
 */
public final class CardVerifier {
    private static final byte[] DOMAIN = "fedzoo-card-v2\n".getBytes(FedzooHttp.UTF8);
    private static final int CONTRACT = 2;
    /** The only parts of a card outside its signature. */
    static final List<String> UNSIGNED_FIELDS = Arrays.asList("signature", "unsigned");

    private final Map<String, Ed25519PublicKeyParameters> keys = new TreeMap<String, Ed25519PublicKeyParameters>();

    /** A verifier trusting these raw 32-byte ed25519 public keys, filed by their key ids. */
    public CardVerifier(Iterable<byte[]> publicKeysRaw) {
        for (byte[] raw : publicKeysRaw) {
            if (raw.length != 32) {
                throw new InvalidInputException("an ed25519 public key has 32 bytes, got " + raw.length, "public_key");
            }
            keys.put(keyIdOf(raw), new Ed25519PublicKeyParameters(raw, 0));
        }
    }

    /** A verifier from a key set {@code {"keys": [{"key_id", "algorithm", "public_key"}]}} (what servers publish). */
    public static CardVerifier fromJson(JSONObject keySet) {
        JSONArray entries = keySet.optJSONArray("keys");
        if (entries == null) {
            throw new InvalidInputException("a key set is {\"keys\": [...]}", "keys");
        }
        List<byte[]> raws = new ArrayList<byte[]>();
        for (int i = 0; i < entries.length(); i++) {
            JSONObject entry = entries.optJSONObject(i);
            byte[] raw = decodeBase64(entry == null ? null : entry.optString("public_key", null), "keys[" + i + "].public_key");
            String listed = entry.optString("key_id", null);
            if (listed != null && raw.length == 32 && !listed.equals(keyIdOf(raw))) {
                throw new InvalidInputException("keys[" + i + "]: key_id " + listed + " is not this key's (" + keyIdOf(raw)
                        + ")", "keys[" + i + "].key_id");
            }
            raws.add(raw);
        }
        return new CardVerifier(raws);
    }

    /** The id a key set files a public key under: 16 hex digits of the sha256 of its 32 raw bytes. */
    public static String keyIdOf(byte[] publicKeyRaw) {
        return BlobCache.sha256Of(publicKeyRaw).substring(0, 16);
    }

    /** The ids of the pinned keys. */
    public Set<String> keyIds() {
        return Collections.unmodifiableSet(keys.keySet());
    }

    /** The pinned keys by key id (what {@link RevocationList#verify} checks against without operator keys). */
    Map<String, Ed25519PublicKeyParameters> keys() {
        return Collections.unmodifiableMap(keys);
    }

    /**
     * Returns normally only if a trusted key signed this very card, it has not expired at {@code nowMillis}, and
     * its version is not below {@code lastAcceptedVersion} (null: nothing accepted yet for its line).
     */
    public void verify(ModelCard card, long nowMillis, Integer lastAcceptedVersion) {
        verify(card, nowMillis, lastAcceptedVersion, null);
    }

    /**
     * As {@link #verify(ModelCard, long, Integer)}, and at {@code lastAcceptedVersion} itself the card must be the
     * one accepted then, {@code lastAcceptedCardId} (one card per line and version: {@code version_reused}).
     */
    public void verify(ModelCard card, long nowMillis, Integer lastAcceptedVersion, String lastAcceptedCardId) {
        JSONObject block = card.signature();
        if (block == null) {
            throw new CardSignatureException("card '" + card.id() + "' is not signed", "unsigned");
        }
        String keyId = block.optString("key_id");
        Ed25519PublicKeyParameters key = keys.get(keyId);
        if (key == null) {
            throw new CardSignatureException("card '" + card.id() + "' is signed by key " + keyId
                    + ", which is not among the trusted keys " + keys.keySet(), "unknown_key");
        }
        JSONObject fields;
        try {
            byte[] payload = decodeBase64(block.optString("payload", null), "signature.payload");
            byte[] signature = decodeBase64(block.optString("signature", null), "signature.signature");
            Ed25519Signer signer = new Ed25519Signer();
            signer.init(false, key);
            signer.update(DOMAIN, 0, DOMAIN.length);
            signer.update(payload, 0, payload.length);
            if (!signer.verifySignature(signature)) {
                throw new CardSignatureException("card '" + card.id() + "': the signature does not verify", "bad_signature");
            }
            fields = new JSONObject(new String(payload, FedzooHttp.UTF8));
        } catch (InvalidInputException | JSONException malformed) {
            throw new CardSignatureException("card '" + card.id() + "': the signature does not verify", "bad_signature");
        }
        JSONObject signedCard = fields.optJSONObject("card");
        String expiresAt = fields.optString("expires_at", null);
        if (fields.optInt("contract", 0) != CONTRACT || signedCard == null || !keyId.equals(fields.optString("key_id"))
                || expiresAt == null || !expiresAt.matches("\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z")) {
            throw new CardSignatureException("card '" + card.id() + "': the signed payload is not a contract-" + CONTRACT
                    + " card payload", "field_mismatch");
        }
        TreeSet<String> differing = differingFields(signedCard, card.json());
        if (!differing.isEmpty()) {
            throw new CardSignatureException("card '" + card.id() + "': fields differ from the signed card: "
                    + differing, "field_mismatch");
        }
        if (nowMillis >= Timestamps.parseMillis(expiresAt)) {
            throw new CardSignatureException("card '" + card.id() + "': the signature expired at " + expiresAt, "expired");
        }
        if (lastAcceptedVersion != null && card.version() < lastAcceptedVersion) {
            throw new CardSignatureException("card '" + card.id() + "': version " + card.version() + " of line '"
                    + card.lineId() + "' is older than version " + lastAcceptedVersion
                    + ", already accepted (rollback refused)", "rollback");
        }
        if (lastAcceptedVersion != null && lastAcceptedCardId != null && card.version() == lastAcceptedVersion
                && !card.id().equals(lastAcceptedCardId)) {
            throw new CardSignatureException("card '" + card.id() + "': version " + card.version() + " of line '"
                    + card.lineId() + "' was already accepted as card '" + lastAcceptedCardId
                    + "'; a second card for one line and version is refused", "version_reused");
        }
    }

    /** The card's top-level fields whose value is not the signed one, counting fields on one side only. */
    private static TreeSet<String> differingFields(JSONObject signed, JSONObject received) {
        TreeSet<String> names = new TreeSet<String>();
        for (Iterator<String> keys = signed.keys(); keys.hasNext();) {
            names.add(keys.next());
        }
        for (Iterator<String> keys = received.keys(); keys.hasNext();) {
            names.add(keys.next());
        }
        TreeSet<String> differing = new TreeSet<String>();
        for (String name : names) {
            if (UNSIGNED_FIELDS.contains(name)) {
                if (signed.has(name)) {
                    differing.add(name);
                }
                continue;
            }
            if (!signed.has(name) || !received.has(name)) {
                differing.add(name);
            } else if (name.equals("created_at")) {
                if (!sameInstant(signed.opt(name), received.opt(name))) {
                    differing.add(name);
                }
            } else if (!sameJson(signed.opt(name), received.opt(name))) {
                differing.add(name);
            }
        }
        return differing;
    }

    private static boolean sameInstant(Object signed, Object received) {
        try {
            return signed instanceof String && received instanceof String
                    && Timestamps.parseMillis((String) signed) == Timestamps.parseMillis((String) received);
        } catch (RuntimeException unparsable) {
            return false;
        }
    }

    /** JSON values equal as JSON: numbers by value (360 equals 360.0), objects by keys, arrays in order. */
    static boolean sameJson(Object a, Object b) {
        if (a instanceof Number && b instanceof Number) {
            return new BigDecimal(a.toString()).compareTo(new BigDecimal(b.toString())) == 0;
        }
        if (a instanceof JSONObject && b instanceof JSONObject) {
            JSONObject left = (JSONObject) a;
            JSONObject right = (JSONObject) b;
            if (left.length() != right.length()) {
                return false;
            }
            for (Iterator<String> keys = left.keys(); keys.hasNext();) {
                String key = keys.next();
                if (!right.has(key) || !sameJson(left.opt(key), right.opt(key))) {
                    return false;
                }
            }
            return true;
        }
        if (a instanceof JSONArray && b instanceof JSONArray) {
            JSONArray left = (JSONArray) a;
            JSONArray right = (JSONArray) b;
            if (left.length() != right.length()) {
                return false;
            }
            for (int i = 0; i < left.length(); i++) {
                if (!sameJson(left.opt(i), right.opt(i))) {
                    return false;
                }
            }
            return true;
        }
        if (a == null || b == null || a == JSONObject.NULL || b == JSONObject.NULL) {
            return (a == null || a == JSONObject.NULL) && (b == null || b == JSONObject.NULL);
        }
        return a.equals(b);
    }

    private static byte[] decodeBase64(String text, String field) {
        if (text == null || !text.matches("[A-Za-z0-9+/]*={0,2}") || text.length() % 4 != 0) {
            throw new InvalidInputException(field + " must be base64, got '" + text + "'", field);
        }
        return Base64.decode(text);
    }
}
