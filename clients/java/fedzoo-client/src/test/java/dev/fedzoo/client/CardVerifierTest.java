package dev.fedzoo.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.File;
import java.util.Collections;

import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.jupiter.api.Test;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.ModelCard;
import dev.fedzoo.TestSupport;

/** Signed cards: every case of the shared vectors ({@code tests/vectors/card_signatures.json}) as Python decides it. */
class CardVerifierTest {
    private static JSONObject vectors() throws Exception {
        File file = new File(TestSupport.repository(), "tests/vectors/card_signatures.json");
        return new JSONObject(new String(TestSupport.read(file), TestSupport.UTF8));
    }

    @Test
    void everySharedVectorIsDecidedAsPythonDecidesIt() throws Exception {
        JSONObject vectors = vectors();
        CardVerifier verifier = CardVerifier.fromJson(vectors.getJSONObject("trusted_keys"));
        JSONArray cases = vectors.getJSONArray("cases");
        assertEquals(true, cases.length() >= 10, "the vectors hold every refusal reason");
        for (int i = 0; i < cases.length(); i++) {
            JSONObject vector = cases.getJSONObject(i);
            ModelCard card = new ModelCard(vector.getJSONObject("card"));
            long now = Timestamps.parseMillis(vector.getString("now"));
            Integer last = vector.isNull("last_accepted_version") ? null : vector.getInt("last_accepted_version");
            String lastCardId = vector.isNull("last_accepted_card_id") ? null : vector.getString("last_accepted_card_id");
            String reason = null;
            try {
                verifier.verify(card, now, last, lastCardId);
                if (!vector.isNull("revocation_list")) {
                    RevocationList.verify(vector.getJSONObject("revocation_list"), verifier.keys(), null)
                            .refuseRevoked(card);
                }
            } catch (CardSignatureException refused) {
                reason = refused.reason();
            }
            String expected = vector.getString("expect");
            if (expected.equals("ok")) {
                assertNull(reason, vector.getString("name"));
            } else {
                assertEquals(expected, reason, vector.getString("name"));
            }
        }
    }

    @Test
    void everyRevocationListVectorIsDecidedAsPythonDecidesIt() throws Exception {
        JSONObject vectors = new JSONObject(new String(TestSupport.read(new File(TestSupport.repository(),
                "tests/vectors/revocation_lists.json")), TestSupport.UTF8));
        CardVerifier verifier = CardVerifier.fromJson(vectors.getJSONObject("trusted_keys"));
        JSONArray cases = vectors.getJSONArray("cases");
        assertTrue(cases.length() >= 10, "the vectors hold every refusal reason");
        for (int i = 0; i < cases.length(); i++) {
            JSONObject vector = cases.getJSONObject(i);
            String name = vector.getString("name");
            RevocationList held = vector.isNull("held") ? null
                    : RevocationList.verify(vector.getJSONObject("held"), verifier.keys(), null);
            try {
                RevocationList listed = RevocationList.verify(vector.getJSONObject("document"), verifier.keys(), held);
                assertEquals("ok", vector.getString("expect"), name);
                assertEquals(vector.getInt("version"), listed.version(), name);
                assertEquals(vector.getJSONArray("device_key_fingerprints").toString(),
                        new JSONArray(listed.deviceKeyFingerprints()).toString(), name);
            } catch (CardSignatureException refused) {
                assertEquals(vector.getString("expect"), refused.reason(), name + ": " + refused.getMessage());
            }
        }
    }

    @Test
    void aSecondCardForAnAcceptedLineAndVersionIsRefusedByTheStoreToo() throws Exception {
        StateStore state = new StateStore(TestSupport.workDirectory("line-cards"));
        state.acceptCard("digits-mlp-v1", 2, "digits-v2-r1");
        state.acceptCard("digits-mlp-v1", 2, "digits-v2-r1"); // the same card again is fine
        CardSignatureException refused = assertThrows(CardSignatureException.class,
                () -> new StateStore(state.directory()).acceptCard("digits-mlp-v1", 2, "digits-v2-r2"));
        assertEquals("version_reused", refused.reason());
        assertEquals("digits-v2-r1", state.acceptedCardId("digits-mlp-v1"));
        state.acceptCard("digits-mlp-v1", 3, "digits-v3-r4");
        assertEquals("digits-v3-r4", state.acceptedCardId("digits-mlp-v1"));
    }

    @Test
    void aRecordedVersionThatIsNotAWholeNumberIsRefusedNotReadAsNothingAccepted() throws Exception {
        // as Python's test of the same name: {"line": "9"} would read as 9 (optInt) and other text as 0
        for (String recorded : new String[] {"\"9\"", "\"nine\"", "null", "9.5", "true", "0", "-3"}) {
            StateStore state = new StateStore(TestSupport.workDirectory("recorded-version"));
            String written = "{\"accepted_line_versions\": {\"digits-mlp-v1\": " + recorded + "}}";
            state.save(new JSONObject(written));
            InvalidInputException read = assertThrows(InvalidInputException.class, () -> state.acceptedVersion("digits-mlp-v1"),
                    recorded);
            assertEquals("state", read.field());
            assertTrue(read.getMessage().contains("line 'digits-mlp-v1' is ") && read.getMessage().contains("not a whole number"),
                    read.getMessage());
            assertThrows(InvalidInputException.class, () -> state.acceptCard("digits-mlp-v1", 1, "digits-v1"), recorded);
            assertEquals(new JSONObject(written).toString(), state.load().toString(), "nothing is rewritten: " + recorded);
        }
        for (String section : new String[] {"accepted_line_versions", "accepted_line_cards"}) {
            StateStore state = new StateStore(TestSupport.workDirectory("recorded-section"));
            state.save(new JSONObject("{\"" + section + "\": [3]}"));
            InvalidInputException read = assertThrows(InvalidInputException.class,
                    () -> state.acceptCard("digits-mlp-v1", 1, "digits-v1"), section);
            assertTrue(read.getMessage().endsWith(section + " is not a JSON object"), read.getMessage());
            assertEquals("[3]", state.load().get(section).toString(), "nothing is rewritten: " + section);
        }
    }

    @Test
    void aKeySetWhoseIdDoesNotMatchItsKeyIsRefused() throws Exception {
        JSONObject keys = vectors().getJSONObject("trusted_keys");
        keys.getJSONArray("keys").getJSONObject(0).put("key_id", "0000000000000000");
        assertThrows(InvalidInputException.class, () -> CardVerifier.fromJson(keys));
    }

    @Test
    void aRolledBackCardIsRefusedAfterTheNewerOneWasAcceptedAndRemembered() throws Exception {
        JSONObject vectors = vectors();
        CardVerifier verifier = CardVerifier.fromJson(vectors.getJSONObject("trusted_keys"));
        JSONObject valid = null;
        for (int i = 0; i < vectors.getJSONArray("cases").length(); i++) {
            JSONObject vector = vectors.getJSONArray("cases").getJSONObject(i);
            if (vector.getString("name").equals("valid")) {
                valid = vector;
            }
        }
        if (valid == null) {
            fail("no 'valid' vector");
        }
        StateStore state = new StateStore(TestSupport.workDirectory("verifier-state"));
        ModelCard card = new ModelCard(valid.getJSONObject("card"));
        long now = Timestamps.parseMillis(valid.getString("now"));
        verifier.verify(card, now, state.acceptedVersion(card.lineId()));
        state.acceptVersion(card.lineId(), card.version() + 1); // a newer version arrived since
        StateStore reopened = new StateStore(state.directory());
        CardSignatureException refused = assertThrows(CardSignatureException.class,
                () -> verifier.verify(card, now, reopened.acceptedVersion(card.lineId())));
        assertEquals("rollback", refused.reason());
        CardSignatureException stale = assertThrows(CardSignatureException.class,
                () -> reopened.acceptVersion(card.lineId(), card.version())); // the compare-and-swap refuses it too
        assertEquals("rollback", stale.reason());
        assertEquals(Integer.valueOf(card.version() + 1), reopened.acceptedVersion(card.lineId()));
        assertNull(reopened.acceptedVersion(card.family()), "versions are kept per line, not per family");
    }

    @Test
    void everyFieldADeviceActsOnIsSignedAndOnlyTheUnsignedMeasurementsMayChange() throws Exception {
        JSONArray cases = vectors().getJSONArray("cases");
        int edited = 0;
        for (int i = 0; i < cases.length(); i++) {
            JSONObject vector = cases.getJSONObject(i);
            String name = vector.getString("name");
            if (name.endsWith("_edited") || name.equals("field_left_unsigned")) {
                assertEquals("field_mismatch", vector.getString("expect"), name);
                edited++;
            }
        }
        assertTrue(edited >= 9, "the vectors edit normalisation, labels, precision, metrics, latency, lineage, the "
                + "privacy claim and leave a field unsigned");
    }

    /** A server that edits the signed card's creation time, to another instant or to no instant at all. */
    @Test
    void aCreationTimeEditedAfterSigningIsRefused() throws Exception {
        JSONObject vectors = vectors();
        CardVerifier verifier = CardVerifier.fromJson(vectors.getJSONObject("trusted_keys"));
        JSONArray cases = vectors.getJSONArray("cases");
        JSONObject valid = null;
        for (int i = 0; i < cases.length() && valid == null; i++) {
            valid = cases.getJSONObject(i).getString("name").equals("valid") ? cases.getJSONObject(i) : null;
        }
        if (valid == null) {
            fail("no 'valid' vector");
        }
        final long now = Timestamps.parseMillis(valid.getString("now"));
        String keyId = vectors.getJSONObject("trusted_keys").getJSONArray("keys").getJSONObject(0).getString("key_id");
        assertEquals(Collections.singleton(keyId), verifier.keyIds());
        verifier.verify(new ModelCard(valid.getJSONObject("card")), now, null);
        for (String edited : new String[] {"2026-12-01T12:00:01Z", "not a time"}) {
            final ModelCard card = new ModelCard(new JSONObject(valid.getJSONObject("card").toString())
                    .put("created_at", edited));
            CardSignatureException refused = assertThrows(CardSignatureException.class,
                    () -> verifier.verify(card, now, null), edited);
            assertEquals("field_mismatch", refused.reason(), edited);
        }
    }

    /** The field comparison: numbers by value, objects by keys, arrays in order, null only equal to null. */
    @Test
    void signedAndReceivedValuesAreComparedAsJson() throws Exception {
        assertTrue(CardVerifier.sameJson(360, 360.0));
        assertFalse(CardVerifier.sameJson(360, 361));
        assertTrue(CardVerifier.sameJson(new JSONArray("[1, [2, 3]]"), new JSONArray("[1.0, [2, 3]]")));
        assertFalse(CardVerifier.sameJson(new JSONArray("[1, 2]"), new JSONArray("[2, 1]")));
        assertFalse(CardVerifier.sameJson(new JSONArray("[1, 2]"), new JSONArray("[1, 2, 3]")));
        assertFalse(CardVerifier.sameJson(new JSONArray("[1, 2]"), new JSONObject("{\"0\": 1, \"1\": 2}")));
        assertTrue(CardVerifier.sameJson(new JSONObject("{\"a\": 1}"), new JSONObject("{\"a\": 1.0}")));
        assertFalse(CardVerifier.sameJson(new JSONObject("{\"a\": 1}"), new JSONObject("{\"b\": 1}")));
        assertFalse(CardVerifier.sameJson(new JSONObject("{\"a\": 1}"), new JSONObject("{\"a\": 1, \"b\": 2}")));
        assertTrue(CardVerifier.sameJson(null, JSONObject.NULL));
        assertFalse(CardVerifier.sameJson(JSONObject.NULL, "x"));
        assertFalse(CardVerifier.sameJson("x", null));
        assertFalse(CardVerifier.sameJson("360", 360));
    }
}
