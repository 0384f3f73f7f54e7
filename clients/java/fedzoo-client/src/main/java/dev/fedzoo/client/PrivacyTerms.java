package dev.fedzoo.client;

import java.util.Collections;
import java.util.Iterator;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Pattern;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.json.JSONException;
import org.json.JSONObject;


/**
 * The operator's signed privacy terms, as {@code fedzoo.privacy_terms}: the model lines a device trains on only
 * under distributed DP, and the least noise multiplier it accepts there ({@code "*"}: every line the terms do not
 * name). The operator signs them offline ({@code fedzoo keys sign-privacy-terms}), the server relays them
 * ({@code GET /v1/privacy-terms}), and the device verifies them against its pinned operator keys, keeps the newest
 * in its {@link StateStore} (refusing an older version or another document under the held one) and applies them as
 * its {@code DistributedNoise.Policy} on every covered line ({@code DistributedNoise.policyFor}), whatever the
 * server says. The
 * signature covers {@code "fedzoo-privacy-terms-v1\n" + payload}. Decided exactly as Python decides the shared
 * vectors ({@code tests/vectors/privacy_terms.json}).
 */
public final class PrivacyTerms {
    private static final byte[] DOMAIN = "fedzoo-privacy-terms-v1\n".getBytes(FedzooHttp.UTF8);
    private static final String PURPOSE = "privacy_terms";
    private static final String WHAT = "privacy terms";
    private static final int CONTRACT = 1;
    private static final int MAX_LINES = 10_000;
    public static final String EVERY_LINE = "*";
    private static final Pattern IDENTIFIER = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,127}");

    private final int version;
    private final Map<String, Double> minimumNoiseMultipliers; // line (or EVERY_LINE) -> z_min, mode "distributed"
    private final JSONObject document;

    private PrivacyTerms(int version, Map<String, Double> minimumNoiseMultipliers, JSONObject document) {
        this.version = version;
        this.minimumNoiseMultipliers = Collections.unmodifiableMap(minimumNoiseMultipliers);
        this.document = document;
    }

    /** The terms' version. */
    public int version() {
        return version;
    }

    /** The lines covered (with {@link #EVERY_LINE} where the terms cover every line), each with its floor on z. */
    public Map<String, Double> minimumNoiseMultipliers() {
        return minimumNoiseMultipliers;
    }

    /** The signed document, as served and stored. */
    public JSONObject document() {
        return document;
    }

    /**
     * The floor on z the terms set for {@code lineId}: its own, else every line's ({@link #EVERY_LINE}), else null
     * (the line is not covered), as Python's {@code for_line}.
     */
    public Double minimumNoiseMultiplierFor(String lineId) {
        return minimumNoiseMultipliers.containsKey(lineId) ? minimumNoiseMultipliers.get(lineId)
                : minimumNoiseMultipliers.get(EVERY_LINE);
    }

    /**
     * The terms in {@code document} once one of {@code keys} (the pinned operator keys) is seen to have signed them;
     * {@link CardSignatureException} ({@code unknown_key}, {@code bad_signature}, {@code field_mismatch},
     * {@code rollback}: older than {@code held}, {@code version_reused}) otherwise.
     */
    public static PrivacyTerms verify(JSONObject document, Map<String, Ed25519PublicKeyParameters> keys,
            PrivacyTerms held) {
        Object payload = SignedDocuments.open(document, keys, DOMAIN, WHAT);
        if (!(payload instanceof JSONObject)) {
            throw malformed("the payload is not a JSON object");
        }
        PrivacyTerms terms = fromPayload((JSONObject) payload, document.optString("key_id"), document);
        SignedDocuments.refuseOlder(terms.version, terms.document, held != null ? held.version : null,
                held != null ? held.document : null, WHAT);
        return terms;
    }

    /** Terms the device stored after verifying them, read without checking the signature again. */
    public static PrivacyTerms held(JSONObject document) {
        try {
            return fromPayload(SignedDocuments.readHeld(document), document.getString("key_id"), document);
        } catch (JSONException | IllegalArgumentException unreadable) {
            throw malformed("the stored terms are unreadable: " + unreadable.getMessage());
        }
    }

    private static PrivacyTerms fromPayload(JSONObject payload, String keyId, JSONObject document) {
        Object version = payload.opt("version");
        Object contract = payload.opt("contract");
        JSONObject lines = payload.optJSONObject("lines");
        if (!PURPOSE.equals(payload.opt("purpose")) || !(contract instanceof Integer) || (Integer) contract != CONTRACT
                || !(version instanceof Integer) || (Integer) version < 1 || !(payload.opt("issued_at") instanceof String)
                || !(payload.opt("key_id") instanceof String) || lines == null || lines.length() < 1
                || lines.length() > MAX_LINES) {
            throw malformed("the payload is not contract-" + CONTRACT + " " + PURPOSE);
        }
        if (!keyId.equals(payload.optString("key_id"))) {
            throw malformed("the privacy terms' key_id is not the signed one");
        }
        Map<String, Double> floors = new TreeMap<String, Double>();
        for (Iterator<String> names = lines.keys(); names.hasNext();) {
            String line = names.next();
            JSONObject terms = lines.optJSONObject(line);
            if (!line.equals(EVERY_LINE) && !IDENTIFIER.matcher(line).matches()) {
                throw malformed("lines: '" + line + "' is neither a line id nor '" + EVERY_LINE + "'");
            }
            if (terms == null || terms.length() != 2 || !"distributed".equals(terms.opt("mode"))) {
                throw malformed("lines." + line + " must be {\"mode\": \"distributed\", \"minimum_noise_multiplier\"}");
            }
            Object floor = terms.opt("minimum_noise_multiplier");
            if (!(floor instanceof Number) || floor instanceof Boolean || !(((Number) floor).doubleValue() > 0)
                    || Double.isInfinite(((Number) floor).doubleValue())) {
                throw malformed("lines." + line + ".minimum_noise_multiplier must be a positive number");
            }
            floors.put(line, ((Number) floor).doubleValue());
        }
        return new PrivacyTerms((Integer) version, floors, SignedDocuments.envelope(document));
    }

    private static CardSignatureException malformed(String problem) {
        return new CardSignatureException("the signed privacy terms are malformed: " + problem, "field_mismatch");
    }
}
