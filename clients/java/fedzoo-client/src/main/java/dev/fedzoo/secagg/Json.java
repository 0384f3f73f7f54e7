package dev.fedzoo.secagg;

import org.json.JSONException;
import org.json.JSONObject;

/** A JSON object built in one expression (Android's org.json declares a checked exception on every put). */
final class Json extends JSONObject {
    /** This object with {@code key} set to {@code value}. */
    Json with(String key, Object value) {
        try {
            put(key, value);
        } catch (JSONException nonFiniteNumber) {
            throw new IllegalArgumentException(nonFiniteNumber);
        }
        return this;
    }
}
