package dev.fedzoo;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

import dev.fedzoo.codec.Npy;
import dev.fedzoo.codec.Npz;
import dev.fedzoo.edge.FloatTensor;

/**
 * Paths and helpers the tests share. The Python side comes from {@code $FEDZOO_PYTHON} (default: the
 * repository's {@code .venv/bin/python}, else {@code python3}); the golden vectors are written once per test
 * run by {@code tests/clients/java_vectors.py}, so they always match the Python code of this checkout.
 */
public final class TestSupport {
    public static final Charset UTF8 = Charset.forName("UTF-8");
    private static File vectors;

    private TestSupport() {
    }

    public static File repository() {
        try {
            return new File(System.getProperty("fedzoo.repository", "../../..")).getCanonicalFile();
        } catch (IOException error) {
            throw new IllegalStateException(error);
        }
    }

    /** A fresh directory under the build's test work folder. */
    public static File workDirectory(String name) {
        File directory = new File(System.getProperty("fedzoo.work", "target/fedzoo-test"), name + "-" + System.nanoTime());
        if (!directory.mkdirs()) {
            throw new IllegalStateException("cannot create " + directory);
        }
        return directory.getAbsoluteFile();
    }

    public static String python() {
        String configured = System.getenv("FEDZOO_PYTHON");
        if (configured != null && !configured.isEmpty()) {
            return new File(configured).isAbsolute() || !configured.contains("/") ? configured
                    : new File(repository(), configured).getPath();
        }
        File venv = new File(repository(), ".venv/bin/python");
        return venv.canExecute() ? venv.getPath() : "python3";
    }

    /** The golden vectors directory, written by Python on first use. */
    public static synchronized File vectors() {
        if (vectors == null) {
            File out = workDirectory("vectors");
            runPython(null, "tests/clients/java_vectors.py", "--out", out.getPath());
            vectors = out;
        }
        return vectors;
    }

    /** Runs a Python script of the repository to completion; fails the test with its output unless it exits 0. */
    public static String runPython(Map<String, String> environment, String... arguments) {
        List<String> command = new ArrayList<String>();
        command.add(python());
        command.addAll(Arrays.asList(arguments));
        ProcessBuilder builder = new ProcessBuilder(command).directory(repository()).redirectErrorStream(true);
        if (environment != null) {
            builder.environment().putAll(environment);
        }
        try {
            Process process = builder.start();
            String output = new String(readAll(process.getInputStream()), UTF8);
            int status = process.waitFor();
            if (status != 0) {
                fail(command + " exited with " + status + ":\n" + output);
            }
            return output;
        } catch (IOException | InterruptedException error) {
            throw new IllegalStateException("cannot run " + command + ": " + error, error);
        }
    }

    public static byte[] read(File file) {
        try {
            return readAll(new FileInputStream(file));
        } catch (IOException error) {
            throw new IllegalStateException(error);
        }
    }

    public static byte[] readAll(InputStream in) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] chunk = new byte[1 << 16];
        for (int n = in.read(chunk); n > 0; n = in.read(chunk)) {
            out.write(chunk, 0, n);
        }
        in.close();
        return out.toByteArray();
    }

    public static Map<String, Npy.Array> npz(File file) {
        return Npz.read(read(file));
    }

    public static FloatTensor tensor(Npy.Array array) {
        return new FloatTensor(array.shape, array.floats());
    }

    /** Every value bit for bit equal (NaNs included). */
    public static void assertBitExact(FloatTensor expected, FloatTensor actual, String what) {
        assertArrayEquals(expected.shape(), actual.shape(), what + ": shape");
        float[] e = expected.data();
        float[] a = actual.data();
        for (int i = 0; i < e.length; i++) {
            if (Float.floatToIntBits(e[i]) != Float.floatToIntBits(a[i])) {
                fail(what + "[" + i + "]: expected " + e[i] + " got " + a[i] + " (not bit-exact)");
            }
        }
    }

    /**
     * Each value within {@code relative} of the expected tensor's scale: |a - e| <= relative * max(|e_i|, max|e| * 1e-2),
     * so near-zero entries of a tensor are judged against the tensor's magnitude, not against themselves.
     */
    public static void assertClose(FloatTensor expected, FloatTensor actual, double relative, String what) {
        assertArrayEquals(expected.shape(), actual.shape(), what + ": shape");
        float[] e = expected.data();
        float[] a = actual.data();
        double scale = 0;
        for (float v : e) {
            scale = Math.max(scale, Math.abs(v));
        }
        for (int i = 0; i < e.length; i++) {
            double tolerance = relative * Math.max(Math.abs(e[i]), scale * 1e-2);
            if (!(Math.abs(a[i] - e[i]) <= tolerance)) {
                fail(what + "[" + i + "]: expected " + e[i] + " got " + a[i] + " (tolerance " + tolerance + ")");
            }
        }
        assertEquals(e.length, a.length);
    }
}
