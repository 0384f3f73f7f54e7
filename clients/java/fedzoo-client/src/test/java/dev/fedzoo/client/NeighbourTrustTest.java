package dev.fedzoo.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;

import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.Test;

import dev.fedzoo.TestSupport;
import dev.fedzoo.secagg.DeviceCertificates;
import dev.fedzoo.secagg.ProtocolViolation;

/**
 * The device revocation list a Java device keeps ({@code StateStore}, key {@code device_revocations}), read from the
 * shared vectors ({@code tests/vectors/device_certificates.json}): the newest verified list survives a restart, and an
 * older one or one the operator did not sign is refused ({@code bad_revocations}).
 */
class NeighbourTrustTest {
    private static JSONObject list(JSONObject vectors, String name) throws Exception {
        JSONArray cases = vectors.getJSONArray("revocations");
        for (int i = 0; i < cases.length(); i++) {
            if (cases.getJSONObject(i).getString("name").equals(name)) {
                return cases.getJSONObject(i).getJSONObject("revocations");
            }
        }
        throw new IllegalArgumentException(name);
    }

    @Test
    void theNewestListIsKeptAcrossRestartsAndAnOlderOneIsRefused() throws Exception {
        JSONObject vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/device_certificates.json")), TestSupport.UTF8));
        DeviceCertificates operator = DeviceCertificates.fromJson(vectors.getJSONObject("operator_keys"));
        File directory = TestSupport.workDirectory("neighbour-trust");
        NeighbourTrust trust = new NeighbourTrust(operator, new StateStore(directory));
        trust.policy(list(vectors, "version_one_nothing_revoked"));
        trust.policy(list(vectors, "valid")); // version 2, one key revoked
        NeighbourTrust restarted = new NeighbourTrust(operator, new StateStore(directory));
        assertEquals(2, restarted.keptRevocations().version);
        assertEquals(1, restarted.keptRevocations().revokedKeys.size());
        ProtocolViolation older = assertThrows(ProtocolViolation.class,
                () -> restarted.policy(list(vectors, "version_one_nothing_revoked")));
        assertEquals("bad_revocations", older.reason());
        assertTrue(older.getMessage().contains("rollback"), older.getMessage());
        assertEquals("bad_revocations", assertThrows(ProtocolViolation.class,
                () -> restarted.policy(list(vectors, "signed_by_a_key_not_pinned"))).reason());
        restarted.policy(null); // a server withholding the list: the kept one still holds
        assertEquals(2, restarted.keptRevocations().version);
    }
}
