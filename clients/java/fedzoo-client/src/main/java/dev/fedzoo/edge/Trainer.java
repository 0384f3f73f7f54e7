package dev.fedzoo.edge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.Buffer;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import ai.onnxruntime.NodeInfo;
import ai.onnxruntime.OnnxJavaType;
import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OnnxValue;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import ai.onnxruntime.TensorInfo;
import dev.fedzoo.InvalidInputException;

/**
 * On-device training with the stock ONNX Runtime, as {@code fedzoo.edge.trainer.Trainer}: runs the cloud-built
 * standard-op training graph (inputs {@code x}, {@code y} and one per trainable parameter; outputs {@code loss}
 * and {@code grad.<name>}) and steps the parameters in Java between runs. This is what makes training possible
 * on {@code onnxruntime-android}, whose training build ended at 1.19.2. A graph built with
 * {@code batch_norm="training"} also takes BatchNorm running statistics as inputs and returns their new values as
 * {@code running.<name>}: they live in {@link #statistics()}, replaced after every step, never touched by the
 * optimizer (docs/training-graphs.md). {@code y} is int64 class indices for cross-entropy graphs and float32 for
 * {@code mse} and {@code bce} graphs. Not thread-safe; close it when done.
 */
public final class Trainer implements AutoCloseable {
    public static final String INPUT_NAME = "x";
    public static final String TARGET_NAME = "y";
    public static final String LOSS_NAME = "loss";
    public static final String GRADIENT_PREFIX = "grad.";
    public static final String RUNNING_PREFIX = "running.";

    /** The loss of one batch, the gradient of every trainable parameter and the updated running statistics. */
    public static final class LossAndGradients {
        public final float loss;
        public final Map<String, FloatTensor> gradients;
        public final Map<String, FloatTensor> statistics;

        LossAndGradients(float loss, Map<String, FloatTensor> gradients, Map<String, FloatTensor> statistics) {
            this.loss = loss;
            this.gradients = gradients;
            this.statistics = statistics;
        }
    }

    private final OrtEnvironment environment = OrtEnvironment.getEnvironment();
    private final OrtSession session;
    private final List<String> parameterNames = new ArrayList<String>();
    private final List<String> statisticNames = new ArrayList<String>();
    private final Map<String, FloatTensor> parameters = new LinkedHashMap<String, FloatTensor>();
    private final Map<String, FloatTensor> statistics = new LinkedHashMap<String, FloatTensor>();
    private final OnnxJavaType targetType;
    private final Set<String> outputNames = new LinkedHashSet<String>();
    /** Native-order direct buffers ONNX Runtime reads parameters and statistics from (no copy), refilled before each run. */
    private final Map<String, FloatBuffer> inputBuffers = new HashMap<String, FloatBuffer>();
    private final Map<String, OnnxTensor> inputTensors = new HashMap<String, OnnxTensor>();
    private final Optimizer optimizer;

    /**
     * A trainer of {@code trainingGraph} starting from {@code parameters} (a value for every trainable parameter
     * and running statistic; copied; extra entries ignored), with {@code threads} intra-op threads.
     */
    public Trainer(byte[] trainingGraph, Map<String, FloatTensor> parameters, Optimizer optimizer, int threads) {
        this.optimizer = optimizer;
        try {
            OrtSession.SessionOptions options = EdgeSession.sessionOptions(threads);
            // the arena keeps activations' memory from step to step; a memory pattern would size it for a whole run
            options.setCPUArenaAllocator(true);
            options.setMemoryPatternOptimization(false);
            session = environment.createSession(trainingGraph, options);
        } catch (OrtException error) {
            throw new InvalidInputException("onnxruntime cannot load the training graph: " + error.getMessage(), "training_graph");
        }
        Map<String, NodeInfo> inputs;
        Set<String> outputs;
        try {
            inputs = session.getInputInfo();
            outputs = session.getOutputNames();
        } catch (OrtException error) {
            throw new InvalidInputException("onnxruntime cannot describe the training graph: " + error.getMessage());
        }
        if (!inputs.containsKey(INPUT_NAME) || !inputs.containsKey(TARGET_NAME)) {
            throw new InvalidInputException("not a training graph: inputs " + inputs.keySet() + " lack 'x'/'y'");
        }
        targetType = ((TensorInfo) inputs.get(TARGET_NAME).getInfo()).type;
        if (targetType != OnnxJavaType.INT64 && targetType != OnnxJavaType.FLOAT) {
            throw new InvalidInputException("training graph target 'y' has unsupported type " + targetType);
        }
        outputNames.add(LOSS_NAME);
        for (Map.Entry<String, NodeInfo> input : inputs.entrySet()) {
            String name = input.getKey();
            if (name.equals(INPUT_NAME) || name.equals(TARGET_NAME)) {
                continue;
            }
            FloatTensor value = parameters.get(name);
            if (value == null) {
                throw new InvalidInputException("no value given for trainable parameter '" + name + "'", name);
            }
            long[] expected = ((TensorInfo) input.getValue().getInfo()).getShape();
            if (!Arrays.equals(value.shape(), expected)) {
                throw new InvalidInputException("parameter '" + name + "' has shape " + Arrays.toString(value.shape())
                        + ", the graph expects " + Arrays.toString(expected), name);
            }
            boolean statistic = outputs.contains(RUNNING_PREFIX + name);
            (statistic ? statisticNames : parameterNames).add(name);
            (statistic ? statistics : this.parameters).put(name, value.copy());
            FloatBuffer buffer = ByteBuffer.allocateDirect(value.size() * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            inputBuffers.put(name, buffer);
            try {
                inputTensors.put(name, OnnxTensor.createTensor(environment, buffer, expected));
            } catch (OrtException error) {
                close();
                throw new InvalidInputException("onnxruntime cannot hold parameter '" + name + "': " + error.getMessage(), name);
            }
        }
        for (String name : parameterNames) {
            outputNames.add(GRADIENT_PREFIX + name);
        }
        for (String name : statisticNames) {
            outputNames.add(RUNNING_PREFIX + name);
        }
    }

    /** A trainer starting from the float initializers stored in the inference model the graph was built from. */
    public static Trainer fromInferenceModel(byte[] trainingGraph, byte[] inferenceModel, Optimizer optimizer, int threads) {
        return new Trainer(trainingGraph, OnnxInitializers.readFloat(inferenceModel), optimizer, threads);
    }

    /** The trainable parameters' names, in the graph's input order. */
    public List<String> parameterNames() {
        return Collections.unmodifiableList(parameterNames);
    }

    /** The current parameters (live: the optimizer updates these arrays in place). */
    public Map<String, FloatTensor> parameters() {
        return Collections.unmodifiableMap(parameters);
    }

    /** The current BatchNorm running statistics (empty unless the graph was built with batch_norm="training"). */
    public Map<String, FloatTensor> statistics() {
        return Collections.unmodifiableMap(statistics);
    }

    /** The optimizer stepping the parameters. */
    public Optimizer optimizer() {
        return optimizer;
    }

    /** The batch loss and every parameter's gradient, without changing anything; {@code y}: class indices. */
    public LossAndGradients lossAndGradients(FloatTensor x, long[] y) {
        requireTarget(OnnxJavaType.INT64, "int64 class indices");
        return run(x, y.length, LongBuffer.wrap(y), new long[] {y.length});
    }

    /** The batch loss and every parameter's gradient for a float32 target ({@code mse} and {@code bce} graphs). */
    public LossAndGradients lossAndGradients(FloatTensor x, FloatTensor y) {
        requireTarget(OnnxJavaType.FLOAT, "float32 targets");
        return run(x, (int) y.shape()[0], FloatBuffer.wrap(y.data()), y.shape());
    }

    /** One optimizer step on one batch of class indices (and the statistics' update); returns the loss before it. */
    public float step(FloatTensor x, long[] y) {
        return apply(lossAndGradients(x, y));
    }

    /** One optimizer step on one batch of float32 targets (and the statistics' update); returns the loss before it. */
    public float step(FloatTensor x, FloatTensor y) {
        return apply(lossAndGradients(x, y));
    }

    /** One optimizer step with a batch's gradients (adjusted or not) and its running statistics adopted; returns its loss. */
    public float apply(LossAndGradients result) {
        optimizer.step(parameters, result.gradients);
        statistics.putAll(result.statistics);
        return result.loss;
    }

    private void requireTarget(OnnxJavaType wanted, String what) {
        if (targetType != wanted) {
            throw new InvalidInputException("this training graph's target 'y' is " + targetType + ", not " + what, "y");
        }
    }

    private LossAndGradients run(FloatTensor x, int targets, Buffer y, long[] yShape) {
        long[] shape = x.shape();
        if (shape.length == 0 || shape[0] != targets || targets == 0) {
            throw new InvalidInputException("need as many targets as inputs (>0), got "
                    + (shape.length == 0 ? 0 : shape[0]) + " and " + targets);
        }
        for (Map.Entry<String, FloatBuffer> input : inputBuffers.entrySet()) {
            FloatTensor value = parameters.containsKey(input.getKey()) ? parameters.get(input.getKey())
                    : statistics.get(input.getKey());
            input.getValue().clear();
            input.getValue().put(value.data()); // the optimizer stepped the Java arrays: hand ORT the new values
        }
        Map<String, OnnxTensor> batch = new HashMap<String, OnnxTensor>();
        try {
            batch.put(INPUT_NAME, OnnxTensor.createTensor(environment, FloatBuffer.wrap(x.data()), shape));
            batch.put(TARGET_NAME, y instanceof LongBuffer ? OnnxTensor.createTensor(environment, (LongBuffer) y, yShape)
                    : OnnxTensor.createTensor(environment, (FloatBuffer) y, yShape));
            Map<String, OnnxTensor> feeds = new HashMap<String, OnnxTensor>(inputTensors);
            feeds.putAll(batch);
            OrtSession.Result result = session.run(feeds, outputNames);
            try {
                float loss = ((OnnxTensor) result.get(LOSS_NAME).get()).getFloatBuffer().get(0);
                Map<String, FloatTensor> gradients = new LinkedHashMap<String, FloatTensor>();
                for (String name : parameterNames) {
                    gradients.put(name, toFloatTensor(result.get(GRADIENT_PREFIX + name).get()));
                }
                Map<String, FloatTensor> updated = new LinkedHashMap<String, FloatTensor>();
                for (String name : statisticNames) {
                    updated.put(name, toFloatTensor(result.get(RUNNING_PREFIX + name).get()));
                }
                return new LossAndGradients(loss, gradients, updated);
            } finally {
                result.close();
            }
        } catch (OrtException error) {
            // e.g. a label outside [0, classes) or images of the wrong shape
            throw new InvalidInputException("onnxruntime rejected the training batch: " + error.getMessage());
        } finally {
            for (OnnxTensor tensor : batch.values()) {
                tensor.close();
            }
        }
    }

    static FloatTensor toFloatTensor(OnnxValue value) throws OrtException {
        OnnxTensor tensor = (OnnxTensor) value;
        FloatBuffer buffer = tensor.getFloatBuffer();
        float[] data = new float[buffer.remaining()];
        buffer.get(data);
        return new FloatTensor(tensor.getInfo().getShape(), data);
    }

    @Override
    public void close() {
        for (OnnxTensor tensor : inputTensors.values()) {
            tensor.close();
        }
        EdgeSession.closeSession(session);
    }
}
