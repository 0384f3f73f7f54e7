// The Java half of bench/java_client.py (compiled by it, then run as java -cp <classes and SDK classpath> JavaTrainingStep):
// the fedzoo Java SDK's Trainer on the same model, training graph, batch and optimizer as the Python trainer.
//   time   FOLDER ROUNDS STEPS  -> {"step_ms": [median per round...]} after 5 warm-up steps
//   memory FOLDER STEPS         -> {"peak_rss_mb": VmHWM} after STEPS steps over the shard (as the Python client)

import java.io.File;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

import dev.fedzoo.codec.Npy;
import dev.fedzoo.codec.Npz;
import dev.fedzoo.edge.FloatTensor;
import dev.fedzoo.edge.Sgd;
import dev.fedzoo.edge.Trainer;

public class JavaTrainingStep {
    static final int BATCH_SIZE = 32;

    public static void main(String[] args) throws Exception {
        File folder = new File(args[1]);
        Map<String, Npy.Array> shard = Npz.read(Files.readAllBytes(new File(folder, "shard.npz").toPath()));
        float[] x = shard.get("x").floats();
        long[] y = shard.get("y").longs();
        long[] shape = shard.get("x").shape;
        int row = x.length / (int) shape[0];
        Trainer trainer = Trainer.fromInferenceModel(Files.readAllBytes(new File(folder, "train.onnx").toPath()),
                Files.readAllBytes(new File(folder, "model.onnx").toPath()), new Sgd(0.01, 0.9), 1);
        if (args[0].equals("time")) {
            FloatTensor batch = batch(x, shape, row, 0);
            long[] labels = Arrays.copyOfRange(y, 0, BATCH_SIZE);
            for (int i = 0; i < 5; i++) {
                trainer.step(batch, labels);
            }
            List<Double> medians = new ArrayList<Double>();
            for (int round = 0; round < Integer.parseInt(args[2]); round++) {
                double[] times = new double[Integer.parseInt(args[3])];
                for (int i = 0; i < times.length; i++) {
                    long start = System.nanoTime();
                    trainer.step(batch, labels);
                    times[i] = (System.nanoTime() - start) / 1e6;
                }
                Arrays.sort(times);
                medians.add(times[times.length / 2]);
            }
            System.out.println("{\"step_ms\": " + medians + "}");
        } else {
            int steps = Integer.parseInt(args[2]);
            for (int step = 0; step < steps; step++) {
                int start = step * BATCH_SIZE % (int) shape[0];
                int end = Math.min(start + BATCH_SIZE, (int) shape[0]);
                trainer.step(batch(x, shape, row, start, end), Arrays.copyOfRange(y, start, end));
            }
            for (String line : Files.readAllLines(new File("/proc/self/status").toPath())) {
                if (line.startsWith("VmHWM:")) {
                    System.out.println("{\"peak_rss_mb\": " + Long.parseLong(line.replaceAll("\\D", "")) / 1024.0 + "}");
                }
            }
        }
        trainer.close();
    }

    static FloatTensor batch(float[] x, long[] shape, int row, int start) {
        return batch(x, shape, row, start, start + BATCH_SIZE);
    }

    static FloatTensor batch(float[] x, long[] shape, int row, int start, int end) {
        long[] batchShape = shape.clone();
        batchShape[0] = end - start;
        return new FloatTensor(batchShape, Arrays.copyOfRange(x, start * row, end * row));
    }
}
