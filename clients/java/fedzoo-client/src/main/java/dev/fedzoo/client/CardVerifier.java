package dev.fedzoo.client;

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
 * {@code fedzoo.signing.verify_card}: the signature covers {@code "fedzoo-card-v1\n" + payload}, where the payload
 * (carried base64 in the card) is JSON binding id, version, family, task, every blob's sha256, the model's size
 * and a validity window. The verifier checks the signature over those very bytes, then parses them and
 * requires each field to equal the card's, so no JSON canonicalisation has to agree across languages. A card
 * older than the last version accepted for its family is refused (no rollback to a known-bad model).
 * Ed25519 comes from BouncyCastle: Android's own provider has it only from API 33.
 */
public final class CardVerifier {
    private static final byte[] DOMAIN = "fedzoo-card-v1\n".getBytes(FedzooHttp.UTF8);
    private static final String[] SIGNED_FIELDS =
            {"id", "version", "family", "task", "blobs", "size_bytes", "created_at", "expires_at", "key_id"};

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

    /**
     * Returns normally only if a trusted key signed this very card, it has not expired at {@code nowMillis}, and
     * its version is not below {@code lastAcceptedVersion} (null: nothing accepted yet for its family).
     */
    public void verify(ModelCard card, long nowMillis, Integer lastAcceptedVersion) {
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
        String expiresAt = fields.optString("expires_at", null);
        if (expiresAt == null || !expiresAt.matches("\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z")) {
            throw new CardSignatureException("card '" + card.id() + "': the signed payload has no valid expires_at",
                    "field_mismatch");
        }
        TreeSet<String> differing = differingFields(card, keyId, fields);
        if (!differing.isEmpty()) {
            throw new CardSignatureException("card '" + card.id() + "': the signed fields differ from the card's: "
                    + differing, "field_mismatch");
        }
        if (nowMillis >= Timestamps.parseMillis(expiresAt)) {
            throw new CardSignatureException("card '" + card.id() + "': the signature expired at " + expiresAt, "expired");
        }
        if (lastAcceptedVersion != null && card.version() < lastAcceptedVersion) {
            throw new CardSignatureException("card '" + card.id() + "': version " + card.version() + " of family '"
                    + card.family() + "' is older than version " + lastAcceptedVersion
                    + ", already accepted (rollback refused)", "rollback");
        }
    }

    /** Every blob the card references, by role: {@code model}, {@code training_graph}, {@code artifact.<kind>}. */
    public static Map<String, String> cardBlobs(ModelCard card) {
        Map<String, String> blobs = new TreeMap<String, String>();
        blobs.put("model", card.sha256());
        if (card.trainingGraph() != null && !card.trainingGraph().isEmpty()) {
            blobs.put("training_graph", card.trainingGraph());
        }
        for (Map.Entry<String, String> artifact : card.artifacts().entrySet()) {
            blobs.put("artifact." + artifact.getKey(), artifact.getValue());
        }
        return blobs;
    }

    private static TreeSet<String> differingFields(ModelCard card, String keyId, JSONObject fields) {
        Map<String, Object> expected = new TreeMap<String, Object>();
        expected.put("id", card.id());
        expected.put("version", (long) card.version());
        expected.put("family", card.family());
        expected.put("task", card.task());
        expected.put("size_bytes", card.sizeBytes());
        expected.put("created_at", Timestamps.formatSeconds(Timestamps.parseMillis(card.json().optString("created_at"))));
        expected.put("expires_at", fields.optString("expires_at"));
        expected.put("key_id", keyId);
        TreeSet<String> differing = new TreeSet<String>();
        for (Iterator<String> names = fields.keys(); names.hasNext();) {
            String name = names.next();
            if (!Arrays.asList(SIGNED_FIELDS).contains(name)) {
                differing.add(name);
            }
        }
        for (Map.Entry<String, Object> field : expected.entrySet()) {
            Object signed = fields.opt(field.getKey());
            Object value = signed instanceof Number && !(signed instanceof Double || signed instanceof Float)
                    ? (Object) ((Number) signed).longValue() : signed;
            if (!field.getValue().equals(value)) {
                differing.add(field.getKey());
            }
        }
        JSONObject signedBlobs = fields.optJSONObject("blobs");
        Map<String, String> blobs = new TreeMap<String, String>();
        if (signedBlobs != null) {
            for (Iterator<String> roles = signedBlobs.keys(); roles.hasNext();) {
                String role = roles.next();
                blobs.put(role, String.valueOf(signedBlobs.opt(role)));
            }
        }
        if (signedBlobs == null || !blobs.equals(cardBlobs(card))) {
            differing.add("blobs");
        }
        return differing;
    }

    private static byte[] decodeBase64(String text, String field) {
        if (text == null || !text.matches("[A-Za-z0-9+/]*={0,2}") || text.length() % 4 != 0) {
            throw new InvalidInputException(field + " must be base64, got '" + text + "'", field);
        }
        return Base64.decode(text);
    }
}
