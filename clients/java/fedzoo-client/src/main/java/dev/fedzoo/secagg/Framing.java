package dev.fedzoo.secagg;

import java.io.ByteArrayOutputStream;

import org.json.JSONArray;
import org.json.JSONObject;
import org.bouncycastle.util.encoders.Base64;

/**
 * The compact binary framing of the two share-carrying replies, as {@code fedzoo.secagg.framing} (what the REST
 * endpoints take as {@code application/octet-stream}); integers big-endian, client numbers 16-bit:
 *
 * <pre>
 * share_keys: seed_commitment (32) | count (u16) | count x [holder (u16) | ciphertext length (u8) | ciphertext |
 *             self_mask_commitment (16) | mask_key_commitment (16)]
 * unmask:     count (u16) | count x [owner (u16) | kind (u8: 0 self_mask, 1 mask_key) | value (33)] |
 *             undecryptable count (u16) | undecryptable x owner (u16)
 * </pre>
 */
public final class Framing {
    private Framing() {
    }

    /** The share_keys reply ({@link SecAggClient#shareKeys}) as bytes. */
    public static byte[] encodeShareKeys(JSONObject reply) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        write(out, Base64.decode(reply.optString("self_mask_seed_commitment")));
        JSONArray shares = reply.optJSONArray("shares");
        u16(out, shares.length());
        for (int i = 0; i < shares.length(); i++) {
            JSONObject share = shares.optJSONObject(i);
            byte[] ciphertext = Base64.decode(share.optString("ciphertext"));
            u16(out, share.optInt("holder"));
            out.write(ciphertext.length);
            write(out, ciphertext);
            write(out, Base64.decode(share.optString("self_mask_commitment")));
            write(out, Base64.decode(share.optString("mask_key_commitment")));
        }
        return out.toByteArray();
    }

    /** The unmask reply ({@link SecAggClient#unmask}) as bytes. */
    public static byte[] encodeUnmask(JSONObject reply) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        JSONArray shares = reply.optJSONArray("shares");
        u16(out, shares.length());
        for (int i = 0; i < shares.length(); i++) {
            JSONObject share = shares.optJSONObject(i);
            u16(out, share.optInt("owner"));
            out.write(SecAggClient.MASK_KEY.equals(share.optString("kind")) ? 1 : 0);
            write(out, Base64.decode(share.optString("value")));
        }
        JSONArray undecryptable = reply.optJSONArray("undecryptable");
        u16(out, undecryptable.length());
        for (int i = 0; i < undecryptable.length(); i++) {
            u16(out, undecryptable.optInt(i));
        }
        return out.toByteArray();
    }

    private static void u16(ByteArrayOutputStream out, int value) {
        out.write(value >>> 8 & 0xff);
        out.write(value & 0xff);
    }

    private static void write(ByteArrayOutputStream out, byte[] bytes) {
        out.write(bytes, 0, bytes.length);
    }
}
