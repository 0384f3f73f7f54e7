package dev.fedzoo.edge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.util.LinkedHashMap;
import java.util.Map;

import org.json.JSONObject;
import org.junit.jupiter.api.Test;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.ModelCard;
import dev.fedzoo.TestSupport;
import dev.fedzoo.codec.Npy;
import dev.fedzoo.fl.LocalData;
import dev.fedzoo.fl.Participation;

/**
 * Java training against the Python SDK's own results on the same model and data: the initializer walk, the
 * optimizers (bit-exact from recorded gradients), ONNX Runtime-Java's loss and gradients, and whole local epochs.
 * The JVM's onnxruntime (Maven Central's newest, 1.29.0) and the Python wheel (1.32.0) are different builds, so
 * runtime outputs are compared within 1e-5 relative; everything computed in Java alone must match bit for bit.
 */
class TrainingGoldenTest {
    private static final double RELATIVE = 1e-5;

    private static File vector(String name) {
        return new File(TestSupport.vectors(), name);
    }

    private static Map<String, FloatTensor> withPrefix(Map<String, Npy.Array> arrays, String prefix) {
        Map<String, FloatTensor> out = new LinkedHashMap<String, FloatTensor>();
        for (Map.Entry<String, Npy.Array> entry : arrays.entrySet()) {
            if (entry.getKey().startsWith(prefix)) {
                out.put(entry.getKey().substring(prefix.length()), TestSupport.tensor(entry.getValue()));
            }
        }
        return out;
    }

    @Test
    void initializerWalkReadsAndReplacesExactly() {
        byte[] model = TestSupport.read(vector("model.onnx"));
        Map<String, FloatTensor> python = withPrefix(TestSupport.npz(vector("optimizer.npz")), "param.");
        Map<String, FloatTensor> java = OnnxInitializers.readFloat(model);
        assertEquals(python.keySet(), java.keySet());
        for (String name : python.keySet()) {
            TestSupport.assertBitExact(python.get(name), java.get(name), name);
        }
        Map<String, FloatTensor> changed = new LinkedHashMap<String, FloatTensor>();
        FloatTensor bias = java.get("fc2.bias").copy();
        bias.data()[0] = 42.5f;
        changed.put("fc2.bias", bias);
        Map<String, FloatTensor> reread = OnnxInitializers.readFloat(OnnxInitializers.replace(model, changed));
        TestSupport.assertBitExact(bias, reread.get("fc2.bias"), "replaced fc2.bias");
        TestSupport.assertBitExact(java.get("fc1.weight"), reread.get("fc1.weight"), "untouched fc1.weight");
        Map<String, FloatTensor> wrongShape = new LinkedHashMap<String, FloatTensor>();
        wrongShape.put("fc2.bias", FloatTensor.zeros(3));
        assertThrows(InvalidInputException.class, () -> OnnxInitializers.replace(model, wrongShape));
    }

    private static Optimizer optimizer(String name) {
        if (name.equals("sgd")) {
            return new Sgd(0.1);
        }
        if (name.equals("sgd_momentum")) {
            return new Sgd(0.05, 0.9);
        }
        if (name.equals("sgd_nesterov_decay")) {
            return new Sgd(0.05, 0.8, 1e-3, true);
        }
        if (name.equals("adam")) {
            return new Adam(0.01);
        }
        return new Adam(0.003, 0.8, 0.99, 1e-6, 1e-2); // adam_decay
    }

    @Test
    void optimizerStepsAreBitExactFromRecordedGradients() {
        Map<String, Npy.Array> arrays = TestSupport.npz(vector("optimizer.npz"));
        for (String name : new String[] {"sgd", "sgd_momentum", "sgd_nesterov_decay", "adam", "adam_decay"}) {
            Optimizer optimizer = optimizer(name);
            Map<String, FloatTensor> parameters = withPrefix(arrays, "param.");
            for (int step = 0; step < 5; step++) {
                optimizer.step(parameters, withPrefix(arrays, "grad" + step + "."));
                Map<String, FloatTensor> expected = withPrefix(arrays, name + "." + step + ".");
                assertEquals(expected.keySet(), parameters.keySet());
                for (String parameter : expected.keySet()) {
                    TestSupport.assertBitExact(expected.get(parameter), parameters.get(parameter),
                            name + " step " + step + " " + parameter);
                }
            }
        }
    }

    @Test
    void onnxRuntimeJavaLossAndGradientsMatchPythons() {
        Map<String, Npy.Array> batch = TestSupport.npz(vector("batch.npz"));
        Map<String, Npy.Array> python = TestSupport.npz(vector("trainer.npz"));
        Trainer trainer = Trainer.fromInferenceModel(TestSupport.read(vector("training_graph.onnx")),
                TestSupport.read(vector("model.onnx")), new Sgd(0.1), 1);
        try {
            Trainer.LossAndGradients result = trainer.lossAndGradients(TestSupport.tensor(batch.get("x")), batch.get("y").longs());
            float expectedLoss = python.get("loss").floats()[0];
            assertEquals(expectedLoss, result.loss, RELATIVE * Math.abs(expectedLoss));
            Map<String, FloatTensor> gradients = withPrefix(python, "grad.");
            assertEquals(gradients.keySet(), result.gradients.keySet());
            for (String name : gradients.keySet()) {
                TestSupport.assertClose(gradients.get(name), result.gradients.get(name), RELATIVE, "grad." + name);
            }
            assertThrows(InvalidInputException.class,
                    () -> trainer.lossAndGradients(TestSupport.tensor(batch.get("x")), new long[] {1, 2}));
        } finally {
            trainer.close();
        }
    }

    @Test
    void localEpochsWithPythonsBatchOrderGiveItsDelta() throws Exception {
        Map<String, Npy.Array> local = TestSupport.npz(vector("local.npz"));
        JSONObject cases = new JSONObject(new String(TestSupport.read(vector("local.json")), TestSupport.UTF8));
        ModelCard card = new ModelCard(new JSONObject(new String(TestSupport.read(vector("card.json")), TestSupport.UTF8)));
        LocalData data = new LocalData(TestSupport.tensor(local.get("x")), local.get("y").longs());
        for (final String name : new String[] {"sgd_momentum_fedprox", "adam", "batch_norm"}) {
            final Map<String, Npy.Array> orders = local;
            Participation.BatchOrder pythonOrder = new Participation.BatchOrder() {
                public int[] permutation(int epoch, int size) {
                    long[] order = orders.get(name + ".order" + epoch).longs();
                    int[] out = new int[order.length];
                    for (int i = 0; i < out.length; i++) {
                        out[i] = (int) order[i];
                    }
                    return out;
                }
            };
            JSONObject expected = cases.getJSONObject(name);
            boolean batchNorm = name.equals("batch_norm");  // its delta carries the running statistics too
            Participation.TrainingResult result = Participation.trainLocally(
                    TestSupport.read(vector(batchNorm ? "bn_graph.onnx" : "training_graph.onnx")),
                    TestSupport.read(vector(batchNorm ? "bn_model.onnx" : "model.onnx")), card,
                    expected.getJSONObject("training"), data, pythonOrder, null, 1);
            Map<String, FloatTensor> delta = withPrefix(local, name + ".delta.");
            assertEquals(delta.keySet(), result.delta.keySet());
            if (batchNorm) {
                assertTrue(result.delta.containsKey(Trainer.RUNNING_PREFIX + "bn.running_var"), "statistics in the delta");
            }
            for (String parameter : delta.keySet()) {
                TestSupport.assertClose(delta.get(parameter), result.delta.get(parameter), RELATIVE, name + " delta " + parameter);
            }
            JSONObject metrics = expected.getJSONObject("metrics");
            assertEquals(metrics.getDouble("loss"), result.metrics.get("loss"), RELATIVE * metrics.getDouble("loss"), name + " loss");
            assertEquals(metrics.getDouble("accuracy"), result.metrics.get("accuracy"), 0.0, name + " accuracy");
        }
    }

    private static FloatTensor rows(FloatTensor tensor, int start, int end) {
        long[] shape = tensor.shape();
        int row = tensor.size() / (int) shape[0];
        shape[0] = end - start;
        return new FloatTensor(shape, java.util.Arrays.copyOfRange(tensor.data(), start * row, end * row));
    }

    @Test
    void batchNormInTrainingModeAndAnMseLossStepAsPythonsTrainerDoes() {
        Map<String, Npy.Array> arrays = TestSupport.npz(vector("graphs.npz"));
        FloatTensor x = TestSupport.tensor(arrays.get("x"));
        long[] labels = arrays.get("y").longs();
        FloatTensor oneHot = TestSupport.tensor(arrays.get("y_one_hot"));

        Trainer batchNorm = Trainer.fromInferenceModel(TestSupport.read(vector("bn_graph.onnx")),
                TestSupport.read(vector("bn_model.onnx")), new Sgd(0.05, 0.9), 1);
        Trainer mse = Trainer.fromInferenceModel(TestSupport.read(vector("mse_graph.onnx")),
                TestSupport.read(vector("model.onnx")), new Adam(0.01), 1);
        try {
            assertEquals(java.util.Arrays.asList("bn.running_mean", "bn.running_var"),
                    new java.util.ArrayList<String>(batchNorm.statistics().keySet()));
            assertThrows(InvalidInputException.class, () -> mse.lossAndGradients(rows(x, 0, 16), new long[16]));
            for (int step = 0; step < 3; step++) {
                long[] batchLabels = java.util.Arrays.copyOfRange(labels, step * 16, (step + 1) * 16);
                float bnLoss = batchNorm.step(rows(x, step * 16, (step + 1) * 16), batchLabels);
                float mseLoss = mse.step(rows(x, step * 16, (step + 1) * 16), rows(oneHot, step * 16, (step + 1) * 16));
                assertEquals(arrays.get("bn." + step + ".loss").floats()[0], bnLoss, RELATIVE * Math.abs(bnLoss), "bn loss");
                assertEquals(arrays.get("mse." + step + ".loss").floats()[0], mseLoss, RELATIVE * Math.abs(mseLoss), "mse loss");
                Map<String, FloatTensor> bnState = new LinkedHashMap<String, FloatTensor>(batchNorm.parameters());
                bnState.putAll(batchNorm.statistics());
                Map<String, FloatTensor> bnExpected = withPrefix(arrays, "bn." + step + ".");
                bnExpected.remove("loss");
                assertEquals(bnExpected.keySet(), bnState.keySet());
                for (String name : bnExpected.keySet()) {
                    TestSupport.assertClose(bnExpected.get(name), bnState.get(name), RELATIVE, "bn step " + step + " " + name);
                }
                Map<String, FloatTensor> mseExpected = withPrefix(arrays, "mse." + step + ".");
                mseExpected.remove("loss");
                for (String name : mseExpected.keySet()) {
                    TestSupport.assertClose(mseExpected.get(name), mse.parameters().get(name), RELATIVE, "mse step " + step + " " + name);
                }
            }
        } finally {
            batchNorm.close();
            mse.close();
        }
    }
}
