package dev.fedzoo.edge;

import java.io.BufferedReader;
import java.io.File;
import java.io.FileReader;
import java.io.IOException;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import ai.onnxruntime.NodeInfo;
import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import ai.onnxruntime.TensorInfo;
import dev.fedzoo.FedzooException;
import dev.fedzoo.InvalidInputException;

/**
 * This device's profile as sent at registration ({@code fedzoo.device.DeviceProfile}): CPU model and usable cores,
 * memory, ONNX Runtime version and threads, and the timings of the calibration models, from which the server's
 * latency predictor adapts itself to this device ({@code fedzoo.edge.device_profile}).
 */
public final class DeviceProfile {
    public static final int CALIBRATION_WARMUP_RUNS = 10;
    public static final int CALIBRATION_TIMED_RUNS = 60;

    /** One calibration model's batch-1 timing. */
    public static final class CalibrationBenchmark {
        public final String model;
        public final double medianMs;
        public final double p90Ms;

        /** Model {@code model} ran in a median {@code medianMs} and a 90th percentile of {@code p90Ms} milliseconds. */
        public CalibrationBenchmark(String model, double medianMs, double p90Ms) {
            this.model = model;
            this.medianMs = medianMs;
            this.p90Ms = p90Ms;
        }
    }

    public final String deviceId;
    public final String platform;
    public final String deviceClass;
    public final String cpuModel;
    public final int cores;
    public final long memoryMb;
    public final String onnxruntimeVersion;
    public final int threads;
    public final List<CalibrationBenchmark> benchmarks;

    /** A profile from known values ({@link #collect} measures them); {@code deviceClass} may be null. */
    public DeviceProfile(String deviceId, String platform, String deviceClass, String cpuModel, int cores, long memoryMb,
                         String onnxruntimeVersion, int threads, List<CalibrationBenchmark> benchmarks) {
        this.deviceId = deviceId;
        this.platform = platform;
        this.deviceClass = deviceClass;
        this.cpuModel = cpuModel;
        this.cores = cores;
        this.memoryMb = memoryMb;
        this.onnxruntimeVersion = onnxruntimeVersion;
        this.threads = threads;
        this.benchmarks = Collections.unmodifiableList(new ArrayList<CalibrationBenchmark>(benchmarks));
    }

    /**
     * The profile of this device, timing each of {@code calibrationModels} (name → ONNX bytes, e.g. shipped in the
     * app or downloaded; none: no timings) with {@code threads} intra-op threads. {@code deviceClass} may be null.
     */
    public static DeviceProfile collect(String deviceId, int threads, String deviceClass, Map<String, byte[]> calibrationModels) {
        List<CalibrationBenchmark> benchmarks = new ArrayList<CalibrationBenchmark>();
        if (calibrationModels != null) {
            for (Map.Entry<String, byte[]> model : calibrationModels.entrySet()) {
                double[] timings = time(model.getValue(), threads, CALIBRATION_WARMUP_RUNS, CALIBRATION_TIMED_RUNS);
                benchmarks.add(new CalibrationBenchmark(model.getKey(), percentile(timings, 50), percentile(timings, 90)));
            }
        }
        String os = System.getProperty("java.vendor", "").toLowerCase(Locale.ROOT).contains("android") ? "android"
                : System.getProperty("os.name", "unknown").toLowerCase(Locale.ROOT).replace(' ', '-');
        String platform = os + "-" + System.getProperty("os.arch", "unknown").toLowerCase(Locale.ROOT);
        return new DeviceProfile(deviceId, platform, deviceClass, cpuModel(new File("/proc/cpuinfo")),
                Runtime.getRuntime().availableProcessors(), memoryMb(new File("/proc/meminfo")),
                OrtEnvironment.getEnvironment().getVersion(), threads, benchmarks);
    }

    /** The body of {@code POST /v1/devices}. */
    public JSONObject toJson() {
        try {
            JSONArray timings = new JSONArray();
            for (CalibrationBenchmark benchmark : benchmarks) {
                timings.put(new JSONObject().put("model", benchmark.model).put("median_ms", benchmark.medianMs)
                        .put("p90_ms", benchmark.p90Ms));
            }
            JSONObject profile = new JSONObject().put("device_id", deviceId).put("platform", platform)
                    .put("cpu", new JSONObject().put("model", cpuModel).put("cores", cores)).put("memory_mb", memoryMb)
                    .put("runtime", new JSONObject().put("onnxruntime", onnxruntimeVersion).put("threads", threads))
                    .put("benchmarks", timings);
            if (deviceClass != null) {
                profile.put("device_class", deviceClass);
            }
            return profile;
        } catch (JSONException error) {
            throw new InvalidInputException("device profile is not serialisable: " + error.getMessage(), "profile");
        }
    }

    /** Milliseconds of each of {@code timedRuns} batch-1 runs of {@code model} on random input, after warm-up runs. */
    public static double[] time(byte[] model, int threads, int warmupRuns, int timedRuns) {
        OrtEnvironment environment = OrtEnvironment.getEnvironment();
        OrtSession session = EdgeSession.createSession(model, threads);
        try {
            Map.Entry<String, NodeInfo> input = session.getInputInfo().entrySet().iterator().next();
            long[] shape = ((TensorInfo) input.getValue().getInfo()).getShape();
            for (int i = 0; i < shape.length; i++) {
                shape[i] = shape[i] < 0 ? 1 : shape[i]; // symbolic dimensions: batch 1
            }
            float[] values = new float[(int) FloatTensor.elementCount(shape)];
            Random random = new Random(0);
            for (int i = 0; i < values.length; i++) {
                values[i] = (float) random.nextGaussian();
            }
            OnnxTensor tensor = OnnxTensor.createTensor(environment, FloatBuffer.wrap(values), shape);
            try {
                double[] timings = new double[timedRuns];
                for (int run = -warmupRuns; run < timedRuns; run++) {
                    long start = System.nanoTime();
                    session.run(Collections.singletonMap(input.getKey(), tensor)).close();
                    if (run >= 0) {
                        timings[run] = (System.nanoTime() - start) / 1e6;
                    }
                }
                return timings;
            } finally {
                tensor.close();
            }
        } catch (OrtException error) {
            throw new FedzooException("onnxruntime failed timing a model: " + error.getMessage(), error);
        } finally {
            EdgeSession.closeSession(session);
        }
    }

    /** numpy's default (linear) percentile. */
    public static double percentile(double[] values, double percent) {
        double[] sorted = values.clone();
        Arrays.sort(sorted);
        double position = percent / 100.0 * (sorted.length - 1);
        int below = (int) Math.floor(position);
        int above = Math.min(below + 1, sorted.length - 1);
        return sorted[below] + (sorted[above] - sorted[below]) * (position - below);
    }

    static String cpuModel(File cpuinfo) {
        try {
            BufferedReader reader = new BufferedReader(new FileReader(cpuinfo));
            try {
                for (String line = reader.readLine(); line != null; line = reader.readLine()) {
                    int colon = line.indexOf(':');
                    if (colon < 0) {
                        continue;
                    }
                    String key = line.substring(0, colon).trim();
                    String value = line.substring(colon + 1).trim();
                    if ((key.equals("model name") || key.equals("Hardware") || key.equals("Processor")) && !value.isEmpty()) {
                        return value.substring(0, Math.min(200, value.length()));
                    }
                }
            } finally {
                reader.close();
            }
        } catch (IOException unreadable) {
            // not Linux, or a sandbox hiding /proc: fall through to the architecture
        }
        return System.getProperty("os.arch", "unknown");
    }

    static long memoryMb(File meminfo) {
        try {
            BufferedReader reader = new BufferedReader(new FileReader(meminfo));
            try {
                for (String line = reader.readLine(); line != null; line = reader.readLine()) {
                    if (line.startsWith("MemTotal:")) {
                        return Math.max(1, Long.parseLong(line.split("\\s+")[1]) / 1024);
                    }
                }
            } finally {
                reader.close();
            }
        } catch (IOException | NumberFormatException | ArrayIndexOutOfBoundsException unreadable) {
            // fall through to what the JVM may use
        }
        return Math.max(1, Runtime.getRuntime().maxMemory() / (1024 * 1024));
    }
}
