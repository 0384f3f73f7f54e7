package dev.fedzoo.edge;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

import dev.fedzoo.InvalidInputException;

/**
 * Reads and replaces the float initializers of an ONNX model without the {@code onnx} library, as
 * {@code fedzoo.edge.onnx_initializers} does: the protobuf wire format is walked by hand (model.graph = 7,
 * graph.initializer = 5; tensor dims = 1, data_type = 2, float_data = 4, name = 8, raw_data = 9,
 * data_location = 14) and every other byte is copied through unchanged.
 */
public final class OnnxInitializers {
    private static final int MODEL_GRAPH = 7;
    private static final int GRAPH_INITIALIZER = 5;
    private static final int TENSOR_DIMS = 1;
    private static final int TENSOR_DATA_TYPE = 2;
    private static final int TENSOR_FLOAT_DATA = 4;
    private static final int TENSOR_NAME = 8;
    private static final int TENSOR_RAW_DATA = 9;
    private static final int TENSOR_DATA_LOCATION = 14;
    private static final int FLOAT = 1;
    private static final int VARINT = 0;
    private static final int FIXED64 = 1;
    private static final int LENGTH_DELIMITED = 2;
    private static final int FIXED32 = 5;
    private static final Charset UTF8 = Charset.forName("UTF-8");

    private OnnxInitializers() {
    }

    /** One protobuf field: its number, wire type, the whole field's byte range and its payload. */
    private static final class Field {
        final int number;
        final int wireType;
        final int start;
        final int end;
        final int payloadStart;
        final long varint;

        Field(int number, int wireType, int start, int end, int payloadStart, long varint) {
            this.number = number;
            this.wireType = wireType;
            this.start = start;
            this.end = end;
            this.payloadStart = payloadStart;
            this.varint = varint;
        }

        byte[] payload(byte[] data) {
            return copy(data, payloadStart, end);
        }
    }

    /** Every float initializer stored inside the model, by name, in file order. */
    public static Map<String, FloatTensor> readFloat(byte[] model) {
        Map<String, FloatTensor> arrays = new LinkedHashMap<String, FloatTensor>();
        byte[] graph = graphBytes(model);
        for (Field field : fields(graph)) {
            if (field.number == GRAPH_INITIALIZER && field.wireType == LENGTH_DELIMITED) {
                Tensor tensor = decodeTensor(field.payload(graph));
                if (tensor.value != null) {
                    arrays.put(tensor.name, tensor.value);
                }
            }
        }
        return arrays;
    }

    /** The model with the named float initializers replaced by {@code parameters} (same shapes); all else unchanged. */
    public static byte[] replace(byte[] model, Map<String, FloatTensor> parameters) {
        Map<String, FloatTensor> remaining = new LinkedHashMap<String, FloatTensor>(parameters);
        byte[] graph = graphBytes(model);
        ByteArrayOutputStream newGraph = new ByteArrayOutputStream(graph.length);
        for (Field field : fields(graph)) {
            if (field.number == GRAPH_INITIALIZER && field.wireType == LENGTH_DELIMITED) {
                Tensor current = decodeTensor(field.payload(graph));
                FloatTensor replacement = remaining.remove(current.name);
                if (replacement != null) {
                    if (current.value == null || !Arrays.equals(current.value.shape(), replacement.shape())) {
                        String old = current.value == null ? "not a float tensor"
                                : "shape " + Arrays.toString(current.value.shape());
                        throw new InvalidInputException("parameter '" + current.name + "' has shape "
                                + Arrays.toString(replacement.shape()) + " but the model's initializer is " + old,
                                current.name);
                    }
                    writeBytes(newGraph, lengthDelimited(GRAPH_INITIALIZER, encodeTensor(current.name, replacement)));
                    continue;
                }
            }
            newGraph.write(graph, field.start, field.end - field.start);
        }
        if (!remaining.isEmpty()) {
            TreeSet<String> names = new TreeSet<String>(remaining.keySet());
            throw new InvalidInputException("parameters " + names + " are not initializers of the model", names.first());
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream(model.length);
        for (Field field : fields(model)) {
            if (field.number == MODEL_GRAPH) {
                writeBytes(out, lengthDelimited(MODEL_GRAPH, newGraph.toByteArray()));
            } else {
                out.write(model, field.start, field.end - field.start);
            }
        }
        return out.toByteArray();
    }

    private static final class Tensor {
        final String name;
        final FloatTensor value;

        Tensor(String name, FloatTensor value) {
            this.name = name;
            this.value = value;
        }
    }

    private static Tensor decodeTensor(byte[] tensor) {
        String name = "";
        List<Long> dims = new ArrayList<Long>();
        long dataType = 0;
        byte[] raw = null;
        ByteArrayOutputStream floats = new ByteArrayOutputStream();
        boolean external = false;
        for (Field field : fields(tensor)) {
            switch (field.number) {
                case TENSOR_NAME:
                    name = new String(field.payload(tensor), UTF8);
                    break;
                case TENSOR_DIMS:
                    if (field.wireType == VARINT) {
                        dims.add(field.varint);
                    } else {
                        byte[] packed = field.payload(tensor);
                        int[] position = {0};
                        while (position[0] < packed.length) {
                            dims.add(readVarint(packed, position));
                        }
                    }
                    break;
                case TENSOR_DATA_TYPE:
                    dataType = field.varint;
                    break;
                case TENSOR_RAW_DATA:
                    raw = field.payload(tensor);
                    break;
                case TENSOR_FLOAT_DATA:
                    writeBytes(floats, field.payload(tensor)); // packed or one fixed32: little-endian floats either way
                    break;
                case TENSOR_DATA_LOCATION:
                    external = field.varint == 1;
                    break;
                default:
                    break;
            }
        }
        if (dataType != FLOAT || external) {
            return new Tensor(name, null);
        }
        byte[] data = raw != null ? raw : floats.toByteArray();
        float[] values = new float[data.length / 4];
        ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(values);
        long[] shape = new long[dims.size()];
        for (int i = 0; i < shape.length; i++) {
            shape[i] = dims.get(i);
        }
        return new Tensor(name, new FloatTensor(shape, values));
    }

    private static byte[] encodeTensor(String name, FloatTensor array) {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        long[] shape = array.shape();
        if (shape.length > 0) {
            ByteArrayOutputStream dims = new ByteArrayOutputStream();
            for (long dim : shape) {
                writeBytes(dims, varint(dim));
            }
            writeBytes(body, lengthDelimited(TENSOR_DIMS, dims.toByteArray()));
        }
        writeBytes(body, varint(TENSOR_DATA_TYPE << 3 | VARINT));
        writeBytes(body, varint(FLOAT));
        writeBytes(body, lengthDelimited(TENSOR_NAME, name.getBytes(UTF8)));
        ByteBuffer raw = ByteBuffer.allocate(array.size() * 4).order(ByteOrder.LITTLE_ENDIAN);
        raw.asFloatBuffer().put(array.data());
        writeBytes(body, lengthDelimited(TENSOR_RAW_DATA, raw.array()));
        return body.toByteArray();
    }

    private static byte[] graphBytes(byte[] model) {
        for (Field field : fields(model)) {
            if (field.number == MODEL_GRAPH && field.wireType == LENGTH_DELIMITED) {
                return field.payload(model);
            }
        }
        throw new InvalidInputException("the ONNX model has no graph", "model");
    }

    private static List<Field> fields(byte[] data) {
        List<Field> fields = new ArrayList<Field>();
        int[] position = {0};
        while (position[0] < data.length) {
            int start = position[0];
            long tag = readVarint(data, position);
            int number = (int) (tag >>> 3);
            int wireType = (int) (tag & 7);
            long varint = 0;
            int payloadStart;
            if (wireType == VARINT) {
                payloadStart = position[0];
                varint = readVarint(data, position);
            } else if (wireType == LENGTH_DELIMITED) {
                long length = readVarint(data, position);
                payloadStart = position[0];
                position[0] += (int) length;
            } else if (wireType == FIXED64) {
                payloadStart = position[0];
                position[0] += 8;
            } else if (wireType == FIXED32) {
                payloadStart = position[0];
                position[0] += 4;
            } else {
                throw new InvalidInputException("the ONNX model uses protobuf wire type " + wireType + ", which is not supported", "model");
            }
            if (position[0] > data.length || position[0] < payloadStart) {
                throw new InvalidInputException("the ONNX model is truncated", "model");
            }
            fields.add(new Field(number, wireType, start, position[0], payloadStart, varint));
        }
        return fields;
    }

    private static long readVarint(byte[] data, int[] position) {
        long result = 0;
        int shift = 0;
        while (true) {
            if (position[0] >= data.length) {
                throw new InvalidInputException("the ONNX model is truncated (a varint runs past the end)", "model");
            }
            int b = data[position[0]++] & 0xFF;
            result |= (long) (b & 0x7F) << shift;
            if ((b & 0x80) == 0) {
                return result;
            }
            shift += 7;
        }
    }

    private static byte[] varint(long value) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(10);
        while (true) {
            int b = (int) (value & 0x7F);
            value >>>= 7;
            if (value != 0) {
                out.write(b | 0x80);
            } else {
                out.write(b);
                return out.toByteArray();
            }
        }
    }

    private static byte[] lengthDelimited(int number, byte[] payload) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(payload.length + 12);
        writeBytes(out, varint((long) number << 3 | LENGTH_DELIMITED));
        writeBytes(out, varint(payload.length));
        writeBytes(out, payload);
        return out.toByteArray();
    }

    private static void writeBytes(ByteArrayOutputStream out, byte[] bytes) {
        out.write(bytes, 0, bytes.length);
    }

    private static byte[] copy(byte[] data, int from, int to) {
        byte[] out = new byte[to - from];
        System.arraycopy(data, from, out, 0, out.length);
        return out;
    }
}
