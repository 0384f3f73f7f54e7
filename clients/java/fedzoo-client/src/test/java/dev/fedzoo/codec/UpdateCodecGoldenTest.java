package dev.fedzoo.codec;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

import org.junit.jupiter.api.Test;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.TestSupport;
import dev.fedzoo.edge.FloatTensor;

/** The delta codec against Python's: Python's archives decode here, and Java's archives decode in Python. */
class UpdateCodecGoldenTest {
    private static Map<String, FloatTensor> delta() {
        Map<String, FloatTensor> delta = new LinkedHashMap<String, FloatTensor>();
        for (Map.Entry<String, Npy.Array> entry : TestSupport.npz(new File(TestSupport.vectors(), "codec_delta.npz")).entrySet()) {
            delta.put(entry.getKey(), TestSupport.tensor(entry.getValue()));
        }
        return delta;
    }

    @Test
    void pythonFp32ArchiveDecodesToTheDeltaExactly() {
        UpdateCodec.Decoded decoded = UpdateCodec.decode(TestSupport.read(new File(TestSupport.vectors(), "codec_fp32.npz")));
        assertEquals(UpdateCodec.Encoding.FP32, decoded.encoding);
        Map<String, FloatTensor> expected = delta();
        assertEquals(expected.keySet(), decoded.delta.keySet());
        for (String name : expected.keySet()) {
            TestSupport.assertBitExact(expected.get(name), decoded.delta.get(name), name);
        }
    }

    @Test
    void javaInt8ArraysEqualPythonsByteForByte() {
        Map<String, Npy.Array> python = TestSupport.npz(new File(TestSupport.vectors(), "codec_int8.npz"));
        Map<String, Npy.Array> java = Npz.read(UpdateCodec.encode(delta(), UpdateCodec.Encoding.INT8));
        assertEquals(python.keySet(), java.keySet());
        for (String key : python.keySet()) {
            assertEquals(python.get(key).descr, java.get(key).descr, key);
            assertArrayEquals(python.get(key).shape, java.get(key).shape, key);
            assertArrayEquals(python.get(key).data, java.get(key).data, key + " values");
        }
        UpdateCodec.Decoded decoded = UpdateCodec.decode(TestSupport.read(new File(TestSupport.vectors(), "codec_int8.npz")));
        assertEquals(UpdateCodec.Encoding.INT8, decoded.encoding);
        for (Map.Entry<String, FloatTensor> entry : delta().entrySet()) {
            float[] original = entry.getValue().data();
            float[] restored = decoded.delta.get(entry.getKey()).data();
            float largest = 0;
            for (float v : original) {
                largest = Math.max(largest, Math.abs(v));
            }
            for (int i = 0; i < original.length; i++) {
                // each element is off by at most half a quantisation step
                assertEquals(original[i], restored[i], largest / 127.0 / 2 * 1.0001, entry.getKey() + "[" + i + "]");
            }
        }
    }

    @Test
    void javaArchivesDecodeInPython() throws IOException {
        File out = TestSupport.workDirectory("java-archives");
        for (UpdateCodec.Encoding encoding : UpdateCodec.Encoding.values()) {
            FileOutputStream stream = new FileOutputStream(new File(out, encoding.wireName() + ".npz"));
            stream.write(UpdateCodec.encode(delta(), encoding));
            stream.close();
        }
        Map<String, String> environment = new HashMap<String, String>();
        environment.put("FEDZOO_JAVA_ARCHIVES", out.getPath());
        environment.put("FEDZOO_JAVA_VECTORS", TestSupport.vectors().getPath());
        // the module needs no pytest plugin; loading the installed ones (hypothesis, schemathesis) took 5 of its 6 s.
        // xdist only because pyproject's addopts name its --dist
        environment.put("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1");
        String output = TestSupport.runPython(environment, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "-p", "xdist.plugin", "tests/clients/test_java_archives.py");
        assertEquals(true, output.contains("2 passed"), output);
    }

    @Test
    void reservedNamesAndEmptyDeltasAreRefused() {
        Map<String, FloatTensor> reserved = new HashMap<String, FloatTensor>();
        reserved.put("@values", FloatTensor.zeros(2));
        assertThrows(InvalidInputException.class, () -> UpdateCodec.encode(reserved, UpdateCodec.Encoding.INT8));
        assertThrows(InvalidInputException.class,
                () -> UpdateCodec.encode(new HashMap<String, FloatTensor>(), UpdateCodec.Encoding.FP32));
    }

    @Test
    void anAllZeroTensorQuantisesWithScaleOne() {
        UpdateCodec.Quantized quantized = UpdateCodec.quantizeInt8(new float[] {0f, -0f, 0f});
        assertEquals(1.0f, quantized.scale);
        assertArrayEquals(new byte[3], quantized.values);
    }
}
