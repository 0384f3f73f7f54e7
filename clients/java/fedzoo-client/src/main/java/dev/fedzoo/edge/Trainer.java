package dev.fedzoo.edge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
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
 * on {@code onnxruntime-android}, whose training build ended at 1.19.2. Not thread-safe; close it when done.
 */
public final class Trainer implements AutoCloseable {
    public static final String INPUT_NAME = "x";
    public static final String TARGET_NAME = "y";
    public static final String LOSS_NAME = "loss";
    public static final String GRADIENT_PREFIX = "grad.";

    /** The loss of one batch and the gradient of every trainable parameter. */
    public static final class LossAndGradients {
        public final float loss;
        public final Map<String, FloatTensor> gradients;

        LossAndGradients(float loss, Map<String, FloatTensor> gradients) {
            this.loss = loss;
            this.gradients = gradients;
        }
    }

    private final OrtEnvironment environment = OrtEnvironment.getEnvironment();
    private final OrtSession session;
    private final List<String> parameterNames = new ArrayList<String>();
    private final Map<String, FloatTensor> parameters = new LinkedHashMap<String, FloatTensor>();
    private final Set<String> outputNames = new LinkedHashSet<String>();
    /** Native-order direct buffers ONNX Runtime reads the parameters from (no copy), refilled before each run. */
    private final Map<String, FloatBuffer> parameterBuffers = new HashMap<String, FloatBuffer>();
    private final Map<String, OnnxTensor> parameterTensors = new HashMap<String, OnnxTensor>();
    private final Optimizer optimizer;

    /**
     * A trainer of {@code trainingGraph} starting from {@code parameters} (copied; extra entries ignored), with
     * {@code threads} intra-op threads.
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
        try {
            inputs = session.getInputInfo();
        } catch (OrtException error) {
            throw new InvalidInputException("onnxruntime cannot describe the training graph: " + error.getMessage());
        }
        if (!inputs.containsKey(INPUT_NAME) || !inputs.containsKey(TARGET_NAME)) {
            throw new InvalidInputException("not a training graph: inputs " + inputs.keySet() + " lack 'x'/'y'");
        }
        if (((TensorInfo) inputs.get(TARGET_NAME).getInfo()).type != OnnxJavaType.INT64) {
            throw new InvalidInputException("training graph target 'y' must be int64 class labels");
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
            parameterNames.add(name);
            this.parameters.put(name, value.copy());
            outputNames.add(GRADIENT_PREFIX + name);
            FloatBuffer buffer = ByteBuffer.allocateDirect(value.size() * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            parameterBuffers.put(name, buffer);
            try {
                parameterTensors.put(name, OnnxTensor.createTensor(environment, buffer, expected));
            } catch (OrtException error) {
                close();
                throw new InvalidInputException("onnxruntime cannot hold parameter '" + name + "': " + error.getMessage(), name);
            }
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

    /** The optimizer stepping the parameters. */
    public Optimizer optimizer() {
        return optimizer;
    }

    /** The batch loss and every parameter's gradient, without changing anything. {@code x} is already normalised. */
    public LossAndGradients lossAndGradients(FloatTensor x, long[] y) {
        long[] shape = x.shape();
        if (shape.length == 0 || shape[0] != y.length || y.length == 0) {
            throw new InvalidInputException("need as many targets as inputs (>0), got "
                    + (shape.length == 0 ? 0 : shape[0]) + " and " + y.length);
        }
        for (String name : parameterNames) {
            FloatBuffer buffer = parameterBuffers.get(name);
            buffer.clear();
            buffer.put(parameters.get(name).data()); // the optimizer stepped the Java arrays: hand ORT the new values
        }
        Map<String, OnnxTensor> batch = new HashMap<String, OnnxTensor>();
        try {
            batch.put(INPUT_NAME, OnnxTensor.createTensor(environment, FloatBuffer.wrap(x.data()), shape));
            batch.put(TARGET_NAME, OnnxTensor.createTensor(environment, LongBuffer.wrap(y), new long[] {y.length}));
            Map<String, OnnxTensor> feeds = new HashMap<String, OnnxTensor>(parameterTensors);
            feeds.putAll(batch);
            OrtSession.Result result = session.run(feeds, outputNames);
            try {
                float loss = ((OnnxTensor) result.get(LOSS_NAME).get()).getFloatBuffer().get(0);
                Map<String, FloatTensor> gradients = new LinkedHashMap<String, FloatTensor>();
                for (String name : parameterNames) {
                    gradients.put(name, toFloatTensor(result.get(GRADIENT_PREFIX + name).get()));
                }
                return new LossAndGradients(loss, gradients);
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

    /** One optimizer step on one batch; returns the batch loss before the step. */
    public float step(FloatTensor x, long[] y) {
        LossAndGradients result = lossAndGradients(x, y);
        optimizer.step(parameters, result.gradients);
        return result.loss;
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
        for (OnnxTensor tensor : parameterTensors.values()) {
            tensor.close();
        }
        EdgeSession.closeSession(session);
    }
}
