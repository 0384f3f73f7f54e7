package dev.fedzoo.codec;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.edge.FloatTensor;

/**
 * Weight deltas on the wire, exactly as {@code fedzoo.update_codec}: {@code .npz} archives keyed by
 * initializer name.
 * <ul>
 * <li>{@link Encoding#FP32}: one float32 array per parameter, stored (not compressed).</li>
 * <li>{@link Encoding#INT8}: deflated, three arrays: {@code @layout} (JSON {@code [[name, shape], ...]} as a 0-d
 * unicode string, names sorted), {@code @scales} (one float32 per entry) and {@code @values} (all int8 values,
 * concatenated in that order). The delta is {@code q * scale} with {@code scale = max|delta| / 127}.</li>
 * </ul>
 * Arithmetic follows numpy 2's: array operations in float32, scalars computed in double and then rounded to
 * float32, so Java and Python quantise a delta to identical bytes.
 */
public final class UpdateCodec {
    public static final String LAYOUT_KEY = "@layout";
    public static final String SCALES_KEY = "@scales";
    public static final String VALUES_KEY = "@values";
    public static final int INT8_LEVELS = 127;

    /** The two encodings the server accepts; {@link #wireName()} is how the task and receipts name them. */
    public enum Encoding {
        FP32("fp32"), INT8("int8");

        private final String wireName;

        Encoding(String wireName) {
            this.wireName = wireName;
        }

        /** The name the server uses: {@code fp32} or {@code int8}. */
        public String wireName() {
            return wireName;
        }

        /** The encoding the server calls {@code name}. */
        public static Encoding fromWireName(String name) {
            for (Encoding encoding : values()) {
                if (encoding.wireName.equals(name)) {
                    return encoding;
                }
            }
            throw new InvalidInputException("unknown update encoding '" + name + "'; use fp32 or int8", "encoding");
        }
    }

    /** A decoded archive: the float32 delta per parameter and which encoding carried it. */
    public static final class Decoded {
        public final Map<String, FloatTensor> delta;
        public final Encoding encoding;

        Decoded(Map<String, FloatTensor> delta, Encoding encoding) {
            this.delta = delta;
            this.encoding = encoding;
        }
    }

    /** Int8 values and the scale with {@code delta ≈ q * scale}. */
    public static final class Quantized {
        public final byte[] values;
        public final float scale;

        Quantized(byte[] values, float scale) {
            this.values = values;
            this.scale = scale;
        }
    }

    private UpdateCodec() {
    }

    /** Symmetric per-tensor int8, as Python's {@code quantize_int8}. */
    public static Quantized quantizeInt8(float[] delta) {
        float largest = 0f;
        for (float value : delta) {
            largest = Math.max(largest, Math.abs(value));
        }
        // the scale travels as float32: keep it a positive normal number even for all-but-zero deltas
        float scale = largest > 0 ? (float) Math.max(largest / (double) INT8_LEVELS, Float.MIN_NORMAL) : 1.0f;
        byte[] values = new byte[delta.length];
        for (int i = 0; i < delta.length; i++) {
            double rounded = Math.rint(delta[i] / scale);
            values[i] = (byte) Math.max(-INT8_LEVELS, Math.min(INT8_LEVELS, rounded));
        }
        return new Quantized(values, scale);
    }

    /** The {@code .npz} bytes of {@code delta} in {@code encoding}. */
    public static byte[] encode(Map<String, FloatTensor> delta, Encoding encoding) {
        if (delta.isEmpty()) {
            throw new InvalidInputException("an update needs at least one parameter delta", "delta");
        }
        for (String name : delta.keySet()) {
            if (name.startsWith("@")) {
                throw new InvalidInputException("parameter name '" + name + "' may not start with '@' (reserved)", "delta");
            }
        }
        Map<String, byte[]> members = new LinkedHashMap<String, byte[]>();
        if (encoding == Encoding.FP32) {
            for (Map.Entry<String, FloatTensor> entry : delta.entrySet()) {
                members.put(entry.getKey(), Npy.float32(entry.getValue().shape(), entry.getValue().data()));
            }
            return Npz.write(members, false);
        }
        Map<String, FloatTensor> sorted = new TreeMap<String, FloatTensor>(delta);
        StringBuilder layout = new StringBuilder("[");
        float[] scales = new float[sorted.size()];
        List<byte[]> quantized = new ArrayList<byte[]>();
        int total = 0;
        int index = 0;
        for (Map.Entry<String, FloatTensor> entry : sorted.entrySet()) {
            Quantized q = quantizeInt8(entry.getValue().data());
            scales[index] = q.scale;
            quantized.add(q.values);
            total += q.values.length;
            // json.dumps' default separators, so the layout string equals Python's
            layout.append(index == 0 ? "" : ", ").append("[").append(JSONObject.quote(entry.getKey())).append(", [");
            long[] shape = entry.getValue().shape();
            for (int d = 0; d < shape.length; d++) {
                layout.append(d == 0 ? "" : ", ").append(shape[d]);
            }
            layout.append("]]");
            index++;
        }
        layout.append("]");
        byte[] values = new byte[total];
        int offset = 0;
        for (byte[] part : quantized) {
            System.arraycopy(part, 0, values, offset, part.length);
            offset += part.length;
        }
        members.put(LAYOUT_KEY, Npy.string(layout.toString()));
        members.put(SCALES_KEY, Npy.float32(new long[] {scales.length}, scales));
        members.put(VALUES_KEY, Npy.int8(new long[] {values.length}, values));
        return Npz.write(members, true);
    }

    /** The delta an archive holds (either encoding); an {@link InvalidInputException} for a malformed one. */
    public static Decoded decode(byte[] archive) {
        Map<String, Npy.Array> arrays = Npz.read(archive);
        if (arrays.containsKey(LAYOUT_KEY) || arrays.containsKey(SCALES_KEY) || arrays.containsKey(VALUES_KEY)) {
            return new Decoded(dequantize(arrays), Encoding.INT8);
        }
        Map<String, FloatTensor> delta = new LinkedHashMap<String, FloatTensor>();
        for (Map.Entry<String, Npy.Array> entry : arrays.entrySet()) {
            delta.put(entry.getKey(), new FloatTensor(entry.getValue().shape, entry.getValue().floats()));
        }
        return new Decoded(delta, Encoding.FP32);
    }

    private static Map<String, FloatTensor> dequantize(Map<String, Npy.Array> arrays) {
        if (arrays.size() != 3 || !arrays.containsKey(LAYOUT_KEY) || !arrays.containsKey(SCALES_KEY)
                || !arrays.containsKey(VALUES_KEY)) {
            throw new InvalidInputException("an int8 update holds exactly @layout, @scales and @values, got "
                    + arrays.keySet(), "delta");
        }
        float[] scales = arrays.get(SCALES_KEY).floats();
        byte[] values = arrays.get(VALUES_KEY).int8s();
        Map<String, FloatTensor> delta = new LinkedHashMap<String, FloatTensor>();
        try {
            JSONArray layout = new JSONArray(arrays.get(LAYOUT_KEY).string());
            if (layout.length() != scales.length) {
                throw new InvalidInputException("@scales must hold one scale per @layout entry", "delta");
            }
            int start = 0;
            for (int i = 0; i < layout.length(); i++) {
                JSONArray entry = layout.getJSONArray(i);
                JSONArray dims = entry.getJSONArray(1);
                long[] shape = new long[dims.length()];
                for (int d = 0; d < shape.length; d++) {
                    shape[d] = dims.getLong(d);
                }
                int size = (int) FloatTensor.elementCount(shape);
                if (start + size > values.length) {
                    throw new InvalidInputException("@values holds fewer values than @layout needs", "delta");
                }
                float[] data = new float[size];
                for (int k = 0; k < size; k++) {
                    data[k] = values[start + k] * scales[i];
                }
                delta.put(entry.getString(0), new FloatTensor(shape, data));
                start += size;
            }
            if (start != values.length) {
                throw new InvalidInputException("@values holds more values than @layout names", "delta");
            }
        } catch (JSONException error) {
            throw new InvalidInputException("@layout must be a JSON list of [name, shape] pairs: " + error.getMessage(), "delta");
        }
        return delta;
    }
}
