package dev.fedzoo.codec;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import dev.fedzoo.InvalidInputException;

/**
 * numpy's {@code .npy} format, version 1.0, for the few dtypes fedzoo exchanges: {@code <f4}, {@code <i8},
 * {@code |i1} and a 0-d unicode string {@code <U n} (the int8 update's layout). Written byte for byte as numpy
 * writes it: magic, version, a little-endian header length, a Python-dict header padded with spaces to a
 * multiple of 64 bytes and ended by a newline, then the raw little-endian values.
 */
public final class Npy {
    public static final String FLOAT32 = "<f4";
    public static final String INT64 = "<i8";
    public static final String INT8 = "|i1";

    private static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
    private static final int ALIGNMENT = 64;
    private static final Charset LATIN1 = Charset.forName("ISO-8859-1");
    private static final Charset UTF32LE = Charset.forName("UTF-32LE");
    private static final Pattern DESCR = Pattern.compile("'descr':\\s*'([^']+)'");
    private static final Pattern FORTRAN = Pattern.compile("'fortran_order':\\s*(True|False)");
    private static final Pattern SHAPE = Pattern.compile("'shape':\\s*\\(([^)]*)\\)");

    private Npy() {
    }

    /** One array as read from a {@code .npy} file: its dtype string, shape and raw little-endian values. */
    public static final class Array {
        public final String descr;
        public final long[] shape;
        public final byte[] data;

        /** An array of dtype {@code descr} and {@code shape} with raw little-endian {@code data}. */
        public Array(String descr, long[] shape, byte[] data) {
            this.descr = descr;
            this.shape = shape;
            this.data = data;
        }

        /** The values of a {@code <f4} array. */
        public float[] floats() {
            require(FLOAT32);
            float[] values = new float[data.length / 4];
            ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(values);
            return values;
        }

        /** The values of an {@code <i8} array. */
        public long[] longs() {
            require(INT64);
            long[] values = new long[data.length / 8];
            ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().get(values);
            return values;
        }

        /** The values of an {@code |i1} array (a copy). */
        public byte[] int8s() {
            require(INT8);
            return data.clone();
        }

        /** The value of a 0-d unicode array (numpy stores UTF-32LE, zero-padded to the dtype's length). */
        public String string() {
            if (!descr.startsWith("<U") || shape.length != 0) {
                throw new InvalidInputException("expected a 0-d unicode array, got " + descr + " of rank " + shape.length);
            }
            String text = new String(data, UTF32LE);
            int end = text.indexOf('\0');
            return end < 0 ? text : text.substring(0, end);
        }

        private void require(String wanted) {
            if (!descr.equals(wanted)) {
                throw new InvalidInputException("array has dtype " + descr + ", expected " + wanted);
            }
        }
    }

    /** The {@code .npy} bytes of a float32 array. */
    public static byte[] float32(long[] shape, float[] values) {
        ByteBuffer buffer = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        buffer.asFloatBuffer().put(values);
        return write(FLOAT32, shape, buffer.array());
    }

    /** The {@code .npy} bytes of an int64 array. */
    public static byte[] int64(long[] shape, long[] values) {
        ByteBuffer buffer = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        buffer.asLongBuffer().put(values);
        return write(INT64, shape, buffer.array());
    }

    /** The {@code .npy} bytes of an int8 array. */
    public static byte[] int8(long[] shape, byte[] values) {
        return write(INT8, shape, values);
    }

    /** A 0-d unicode array holding {@code text}, as {@code np.array(text, dtype=np.str_)}. */
    public static byte[] string(String text) {
        int codePoints = text.codePointCount(0, text.length());
        return write("<U" + Math.max(codePoints, 1), new long[0], text.isEmpty() ? new byte[4] : text.getBytes(UTF32LE));
    }

    /** The {@code .npy} bytes of raw values {@code data} with dtype {@code descr} and {@code shape}. */
    public static byte[] write(String descr, long[] shape, byte[] data) {
        StringBuilder dims = new StringBuilder();
        for (int i = 0; i < shape.length; i++) {
            dims.append(i == 0 ? "" : ", ").append(shape[i]);
        }
        if (shape.length == 1) {
            dims.append(',');
        }
        String header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
        int unpadded = MAGIC.length + 2 + 2 + header.length() + 1;
        int padding = (ALIGNMENT - unpadded % ALIGNMENT) % ALIGNMENT;
        StringBuilder padded = new StringBuilder(header);
        for (int i = 0; i < padding; i++) {
            padded.append(' ');
        }
        byte[] headerBytes = padded.append('\n').toString().getBytes(LATIN1);
        ByteBuffer out = ByteBuffer.allocate(MAGIC.length + 4 + headerBytes.length + data.length).order(ByteOrder.LITTLE_ENDIAN);
        out.put(MAGIC).put((byte) 1).put((byte) 0).putShort((short) headerBytes.length).put(headerBytes).put(data);
        return out.array();
    }

    /** Parses {@code .npy} bytes (format versions 1.x and 2.x, C order only). */
    public static Array read(byte[] bytes) {
        ByteBuffer in = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
        for (byte expected : MAGIC) {
            if (!in.hasRemaining() || in.get() != expected) {
                throw new InvalidInputException("not a .npy array (bad magic)");
            }
        }
        int major = in.get();
        in.get();
        int headerLength = major == 1 ? in.getShort() & 0xFFFF : in.getInt();
        byte[] headerBytes = new byte[headerLength];
        in.get(headerBytes);
        String header = new String(headerBytes, LATIN1);
        Matcher descr = DESCR.matcher(header);
        Matcher fortran = FORTRAN.matcher(header);
        Matcher shape = SHAPE.matcher(header);
        if (!descr.find() || !fortran.find() || !shape.find()) {
            throw new InvalidInputException("unreadable .npy header: " + header.trim());
        }
        if (fortran.group(1).equals("True")) {
            throw new InvalidInputException("Fortran-ordered .npy arrays are not supported");
        }
        List<Long> dims = new ArrayList<Long>();
        for (String part : shape.group(1).split(",")) {
            if (!part.trim().isEmpty()) {
                dims.add(Long.parseLong(part.trim()));
            }
        }
        long[] dimensions = new long[dims.size()];
        for (int i = 0; i < dimensions.length; i++) {
            dimensions[i] = dims.get(i);
        }
        byte[] data = new byte[in.remaining()];
        in.get(data);
        return new Array(descr.group(1), dimensions, data);
    }
}
