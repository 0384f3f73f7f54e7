package dev.fedzoo.secagg;

import java.util.Collections;
import java.util.Set;
import java.util.TreeSet;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * The operator's signed list of revoked device keys, checked as {@code fedzoo.device_revocations}: signed by a pinned
 * operator key under {@code "fedzoo-device-revocations-v1\n"}, payload {@code {"purpose": "device_revocations",
 * "version", "revoked_keys", "issued_at", "key_id"}}, and refused ({@code rollback}) when older than the list the
 * device kept (its {@code StateStore}, key {@code device_revocations}).
 */
public final class DeviceRevocations {
    static final byte[] REVOCATIONS_DOMAIN = "fedzoo-device-revocations-v1\n".getBytes(SecAggConfig.UTF8);
    public final int version;
    public final Set<String> revokedKeys;

    public DeviceRevocations(int version, Set<String> revokedKeys) {
        this.version = version;
        this.revokedKeys = Collections.unmodifiableSet(new TreeSet<String>(revokedKeys));
    }

    /** The list a device kept ({@code {"version", "revoked_keys"}}; none kept: version 0, nothing revoked). */
    public static DeviceRevocations fromState(JSONObject state) {
        Set<String> revoked = new TreeSet<String>();
        JSONArray keys = state == null ? null : state.optJSONArray("revoked_keys");
        for (int i = 0; keys != null && i < keys.length(); i++) {
            revoked.add(keys.optString(i));
        }
        return new DeviceRevocations(state == null ? 0 : state.optInt("version", 0), revoked);
    }

    /** What the state keeps of this list. */
    public JSONObject toState() {
        try {
            return new JSONObject().put("version", version).put("revoked_keys", new JSONArray(revokedKeys));
        } catch (JSONException impossible) {
            throw new IllegalStateException(impossible);
        }
    }

    /** The served list once an operator key of {@code operatorKeys} signed it and it is not older than {@code kept}. */
    public static DeviceRevocations verify(Object document, DeviceCertificates operatorKeys, DeviceRevocations kept) {
        JSONObject fields = operatorKeys.openSealed(document, REVOCATIONS_DOMAIN, "device_revocations");
        Object version = fields.opt("version");
        JSONArray keys = fields.optJSONArray("revoked_keys");
        Set<String> revoked = new TreeSet<String>();
        for (int i = 0; keys != null && i < keys.length(); i++) {
            Object key = keys.opt(i);
            if (!(key instanceof String) || !((String) key).matches("[0-9a-f]{64}")) {
                keys = null;
                break;
            }
            revoked.add((String) key);
        }
        if (!(version instanceof Integer) || (Integer) version < 1 || keys == null) {
            throw new DeviceCertificateException("the revocation list's signed fields are incomplete or malformed",
                    "malformed");
        }
        if ((Integer) version < kept.version) {
            throw new DeviceCertificateException("revocation list version " + version + " is older than version "
                    + kept.version + ", already accepted (rollback refused)", "rollback");
        }
        return new DeviceRevocations((Integer) version, revoked);
    }
}
