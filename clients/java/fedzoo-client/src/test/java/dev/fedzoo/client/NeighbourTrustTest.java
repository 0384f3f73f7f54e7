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
 * The one revocation list a Java device holds ({@code StateStore}, key {@code revocation_list}), as its SecAgg+
 * neighbour checks read it, from the shared vectors ({@code tests/vectors/revocation_lists.json}): the newest
 * verified list survives a restart and revokes its device keys, and an older one, another under the held version, or
 * one the operator did not sign is refused ({@code bad_revocations}).
 */
class NeighbourTrustTest {
    private static JSONObject vector(JSONObject vectors, String name) throws Exception {
        JSONArray cases = vectors.getJSONArray("cases");
        for (int i = 0; i < cases.length(); i++) {
            if (cases.getJSONObject(i).getString("name").equals(name)) {
                return cases.getJSONObject(i);
            }
        }
        throw new IllegalArgumentException(name);
    }

    @Test
    void theNewestListIsKeptAcrossRestartsAndAnOlderOneIsRefused() throws Exception {
        JSONObject vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/revocation_lists.json")), TestSupport.UTF8));
        DeviceCertificates operator = DeviceCertificates.fromJson(vectors.getJSONObject("trusted_keys"));
        JSONObject newer = vector(vectors, "newer_than_held"); // version 3 over the held version 2
        File directory = TestSupport.workDirectory("neighbour-trust");
        NeighbourTrust trust = new NeighbourTrust(operator, new StateStore(directory));
        trust.policy(newer.getJSONObject("held"));
        trust.policy(newer.getJSONObject("document"));
        NeighbourTrust restarted = new NeighbourTrust(operator, new StateStore(directory));
        assertEquals(3, restarted.heldRevocations().version());
        assertEquals(newer.getJSONArray("device_key_fingerprints").toString(),
                new JSONArray(restarted.heldRevocations().deviceKeyFingerprints()).toString());
        ProtocolViolation older = assertThrows(ProtocolViolation.class,
                () -> restarted.policy(newer.getJSONObject("held")));
        assertEquals("bad_revocations", older.reason());
        assertTrue(older.getMessage().contains("rollback"), older.getMessage());
        for (String refused : new String[] {"unknown_key", "a_device_certificate_as_a_list"}) {
            assertEquals("bad_revocations", assertThrows(ProtocolViolation.class,
                    () -> restarted.policy(vector(vectors, refused).getJSONObject("document"))).reason(), refused);
        }
        restarted.policy(null); // a server withholding the list: the held one still holds
        assertEquals(3, restarted.heldRevocations().version());
    }
}
