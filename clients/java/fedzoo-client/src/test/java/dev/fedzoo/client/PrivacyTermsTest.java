package dev.fedzoo.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.util.Map;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;
import dev.fedzoo.dp.DistributedNoise;
import dev.fedzoo.secagg.DeviceCertificates;
import dev.fedzoo.secagg.ProtocolViolation;

/**
 * The operator's signed privacy terms on a Java device, from the shared vectors
 * ({@code tests/vectors/privacy_terms.json}, which Python's {@code tests/dp/test_privacy_terms.py} decides the same
 * way): every verdict and per-line policy, the newest terms kept across a restart with an older version refused, and
 * the task check before training.
 */
class PrivacyTermsTest {
    private static JSONObject vectors() throws Exception {
        return new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/privacy_terms.json")), TestSupport.UTF8));
    }

    private static Map<String, Ed25519PublicKeyParameters> operatorKeys(JSONObject vectors) throws Exception {
        return DeviceCertificates.fromJson(vectors.getJSONObject("trusted_keys")).operatorKeys();
    }

    @Test
    void everyPrivacyTermsVectorIsDecidedAsPythonDecidesIt() throws Exception {
        JSONObject vectors = vectors();
        Map<String, Ed25519PublicKeyParameters> keys = operatorKeys(vectors);
        JSONArray lines = vectors.getJSONArray("lines");
        JSONArray cases = vectors.getJSONArray("cases");
        assertTrue(cases.length() >= 15, "the vectors hold every refusal reason");
        for (int i = 0; i < cases.length(); i++) {
            JSONObject vector = cases.getJSONObject(i);
            String name = vector.getString("name");
            PrivacyTerms held = vector.isNull("held") ? null : PrivacyTerms.verify(vector.getJSONObject("held"), keys, null);
            try {
                PrivacyTerms terms = PrivacyTerms.verify(vector.getJSONObject("document"), keys, held);
                assertEquals("ok", vector.getString("expect"), name);
                assertEquals(vector.getInt("version"), terms.version(), name);
                for (int j = 0; j < lines.length(); j++) {
                    String line = lines.getString(j);
                    DistributedNoise.Policy policy = DistributedNoise.policyFor(terms, line,
                            DistributedNoise.Policy.permissive());
                    JSONObject expected = vector.getJSONObject("policies").optJSONObject(line);
                    if (expected == null) {
                        assertFalse(policy.requireDistributed, name + " " + line);
                        assertNull(policy.minimumNoiseMultiplier, name + " " + line);
                    } else {
                        assertEquals(expected.getBoolean("require_distributed"), policy.requireDistributed, name);
                        assertEquals(expected.getDouble("minimum_noise_multiplier"), policy.minimumNoiseMultiplier,
                                1e-12, name + " " + line);
                    }
                }
            } catch (CardSignatureException refused) {
                assertEquals(vector.getString("expect"), refused.reason(), name + ": " + refused.getMessage());
            }
        }
    }

    @Test
    void theNewestTermsAreKeptAcrossRestartsAndAnOlderVersionIsRefused() throws Exception {
        JSONObject vectors = vectors();
        JSONObject newer = null;
        for (int i = 0; i < vectors.getJSONArray("cases").length(); i++) {
            if (vectors.getJSONArray("cases").getJSONObject(i).getString("name").equals("newer_than_held")) {
                newer = vectors.getJSONArray("cases").getJSONObject(i);
            }
        }
        File directory = TestSupport.workDirectory("privacy-terms");
        StateStore state = new StateStore(directory);
        state.holdPrivacyTerms(operatorKeys(vectors), newer.getJSONObject("held"));
        state.holdPrivacyTerms(operatorKeys(vectors), newer.getJSONObject("document"));
        StateStore restarted = new StateStore(directory);
        assertEquals(3, restarted.privacyTerms().version());
        final JSONObject older = newer.getJSONObject("held");
        CardSignatureException rollback = assertThrows(CardSignatureException.class,
                () -> restarted.holdPrivacyTerms(operatorKeys(vectors), older));
        assertEquals("rollback", rollback.reason());
        assertEquals(3, restarted.privacyTerms().version());
    }

    @Test
    void aTaskThatCannotCarryTheDevicesNoiseIsRefusedWhereTheTermsRequireIt() throws Exception {
        DistributedNoise.Policy required = new DistributedNoise.Policy(true, 1.0);
        JSONObject secure = new JSONObject().put("stage", "selection");
        JSONObject[] refused = {null, new JSONObject().put("clip_norm", JSONObject.NULL).put("secure_aggregation", secure),
            new JSONObject().put("clip_norm", 0.5).put("secure_aggregation", JSONObject.NULL)};
        for (JSONObject privacy : refused) {
            assertEquals("noise_not_distributed", assertThrows(ProtocolViolation.class,
                    () -> DistributedNoise.checkTaskPrivacy(privacy, required)).reason(), String.valueOf(privacy));
            DistributedNoise.checkTaskPrivacy(privacy, DistributedNoise.Policy.permissive());
        }
        DistributedNoise.checkTaskPrivacy(new JSONObject().put("clip_norm", 0.5).put("secure_aggregation", secure), required);
    }
}
