package dev.fedzoo.secagg;

import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONObject;

/**
 * The server's part of the key-sharing stage, in memory, for tests that run devices through a round without a server:
 * each device gets its neighbours' advertised keys (signed adverts relayed as the server relays them) and deals its
 * shares, which go to their holders' inboxes.
 */
final class KeySharingRelay {
    /** The round's graph seed, from every device's advertised nonce. */
    final byte[] graphSeed;
    /** Each device's share_keys reply, by client number. */
    final JSONObject[] replies;
    /** Each holder's encrypted shares, as the masked_input request carries them ({@code owner}, {@code ciphertext}). */
    final List<List<JSONObject>> inbox = new ArrayList<List<JSONObject>>();

    KeySharingRelay(SecAggConfig config, SecAggClient[] devices, JSONObject[] adverts, byte[][] signingKeys)
            throws Exception {
        int n = devices.length;
        TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
        for (int c = 0; c < n; c++) {
            nonces.put(c, Base64.decode(adverts[c].getString("nonce")));
            inbox.add(new ArrayList<JSONObject>());
        }
        graphSeed = Graph.graphSeed(config, nonces);
        String advertised = Base64.toBase64String(Graph.advertisedBytes(nonces));
        replies = new JSONObject[n];
        for (int c = 0; c < n; c++) {
            JSONArray keys = new JSONArray();
            for (int peer : Graph.neighbours(config, graphSeed, c)) {
                keys.put(new JSONObject().put("client", peer).put("cipher_public_key", adverts[peer].get("cipher_public_key"))
                        .put("mask_public_key", adverts[peer].get("mask_public_key"))
                        .put("signing_public_key", Base64.toBase64String(signingKeys[peer]))
                        .put("signature", adverts[peer].get("signature")));
            }
            replies[c] = devices[c].shareKeys(new JSONObject().put("stage", "share_keys")
                    .put("advertised", advertised).put("public_keys", keys));
            JSONArray shares = replies[c].getJSONArray("shares");
            for (int i = 0; i < shares.length(); i++) {
                JSONObject share = shares.getJSONObject(i);
                inbox.get(share.getInt("holder")).add(new JSONObject().put("owner", c)
                        .put("ciphertext", share.get("ciphertext")));
            }
        }
    }
}
