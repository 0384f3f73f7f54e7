package dev.fedzoo.edge;

import java.nio.FloatBuffer;
import java.util.Arrays;
import java.util.Collections;
import java.util.Map;

import ai.onnxruntime.NodeInfo;
import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import ai.onnxruntime.TensorInfo;
import dev.fedzoo.InvalidInputException;
import dev.fedzoo.ModelCard;

/**
 * Inference on the device, as {@code fedzoo.edge.runtime.EdgeSession}: an ONNX Runtime CPU session that checks
 * its input against the model card and applies the card's {@code (x - mean) / std}, so a wrong tensor fails
 * with a message naming the problem, not a native crash. Not thread-safe; close it when done.
 */
public final class EdgeSession implements AutoCloseable {
    private final OrtEnvironment environment = OrtEnvironment.getEnvironment();
    private final OrtSession session;
    private final String inputName;
    private final String outputName;
    private final long[] inputShape;
    private float[] mean;
    private float[] std;

    /** A session of {@code model} (ONNX bytes) with {@code threads} intra-op threads; {@code card} may be null. */
    public EdgeSession(byte[] model, ModelCard card, int threads) {
        session = createSession(model, threads);
        try {
            Map.Entry<String, NodeInfo> input = session.getInputInfo().entrySet().iterator().next();
            inputName = input.getKey();
            inputShape = ((TensorInfo) input.getValue().getInfo()).getShape();
            outputName = session.getOutputNames().iterator().next();
        } catch (OrtException error) {
            throw new InvalidInputException("onnxruntime cannot describe the model: " + error.getMessage(), "model");
        }
        if (card != null) {
            adoptCard(card);
        }
    }

    /** Options for a CPU session: {@code threads} intra-op threads, one inter-op thread, sequential, all optimisations. */
    public static OrtSession.SessionOptions sessionOptions(int threads) throws OrtException {
        if (threads < 1) {
            throw new InvalidInputException("threads must be a positive integer, got " + threads, "threads");
        }
        OrtSession.SessionOptions options = new OrtSession.SessionOptions();
        options.setIntraOpNumThreads(threads);
        options.setInterOpNumThreads(1);
        options.setExecutionMode(OrtSession.SessionOptions.ExecutionMode.SEQUENTIAL);
        options.setOptimizationLevel(OrtSession.SessionOptions.OptLevel.ALL_OPT);
        return options;
    }

    /** An ONNX Runtime CPU session of {@code model}; a file it cannot load is an {@link InvalidInputException}. */
    public static OrtSession createSession(byte[] model, int threads) {
        try {
            return OrtEnvironment.getEnvironment().createSession(model, sessionOptions(threads));
        } catch (OrtException error) {
            throw new InvalidInputException("onnxruntime cannot load the model: " + error.getMessage(), "model");
        }
    }

    private void adoptCard(ModelCard card) {
        if (!card.inputName().equals(inputName)) {
            throw new InvalidInputException("card input name '" + card.inputName() + "' does not match the model's input '"
                    + inputName + "'", "input.name");
        }
        long[] cardShape = card.inputShape();
        if (cardShape.length != inputShape.length) {
            throw new InvalidInputException("card input shape has rank " + cardShape.length + " but the model's input "
                    + Arrays.toString(inputShape) + " has rank " + inputShape.length, "input.shape");
        }
        mean = card.normalisationMean();
        std = card.normalisationStd();
        long channels = cardShape.length > 1 ? cardShape[1] : -1;
        if (mean != null && (mean.length != std.length || (channels > 0 && mean.length != 1 && mean.length != channels))) {
            throw new InvalidInputException("card normalisation has " + mean.length + " means and " + std.length
                    + " stds for " + channels + " input channels", "input.normalisation");
        }
    }

    /** The model's input name. */
    public String inputName() {
        return inputName;
    }

    /** The model's input shape; a symbolic dimension reads as -1. */
    public long[] inputShape() {
        return inputShape.clone();
    }

    /** {@code x} with the card's {@code (x - mean) / std} applied per channel (a new tensor); {@code x} itself without one. */
    public FloatTensor preprocess(FloatTensor x) {
        return normalise(x, mean, std);
    }

    /**
     * The per-channel {@code (x - mean) / std} of an NC... batch, computed in float32 like numpy, or {@code x}
     * unchanged when {@code mean} is null.
     */
    public static FloatTensor normalise(FloatTensor x, float[] mean, float[] std) {
        if (mean == null) {
            return x;
        }
        long[] shape = x.shape();
        int channels = shape.length > 1 ? (int) shape[1] : 1;
        int perChannel = channels == 0 ? 0 : (int) (FloatTensor.elementCount(shape) / Math.max(1, shape[0]) / channels);
        float[] in = x.data();
        float[] out = new float[in.length];
        for (int i = 0; i < in.length; i++) {
            int channel = mean.length == 1 ? 0 : (i / perChannel) % channels;
            out[i] = (in[i] - mean[channel]) / std[channel];
        }
        return new FloatTensor(shape, out);
    }

    /** The model's first output for a validated and, when {@code normalise}, normalised batch {@code x}. */
    public FloatTensor run(FloatTensor x, boolean normalise) {
        validate(x);
        FloatTensor feed = normalise ? preprocess(x) : x;
        try {
            OnnxTensor tensor = OnnxTensor.createTensor(environment, FloatBuffer.wrap(feed.data()), feed.shape());
            try {
                OrtSession.Result result = session.run(Collections.singletonMap(inputName, tensor),
                        Collections.singleton(outputName));
                try {
                    return Trainer.toFloatTensor(result.get(outputName).get());
                } finally {
                    result.close();
                }
            } finally {
                tensor.close();
            }
        } catch (OrtException error) {
            throw new InvalidInputException("onnxruntime rejected the input: " + error.getMessage(), inputName);
        }
    }

    /** {@link #run(FloatTensor, boolean)} with the card's normalisation. */
    public FloatTensor run(FloatTensor x) {
        return run(x, true);
    }

    /** The arg-max class index of each example. */
    public int[] predict(FloatTensor x) {
        return argmax(run(x));
    }

    /** The share of {@code predicted} classes equal to their {@code labels}. */
    public static double accuracy(int[] predicted, long[] labels) {
        int correct = 0;
        for (int i = 0; i < predicted.length; i++) {
            correct += predicted[i] == labels[i] ? 1 : 0;
        }
        return correct / (double) predicted.length;
    }

    /** The index of the largest value in each row of a [N, classes] tensor. */
    public static int[] argmax(FloatTensor logits) {
        long[] shape = logits.shape();
        int rows = (int) shape[0];
        int columns = rows == 0 ? 0 : logits.size() / rows;
        int[] best = new int[rows];
        float[] data = logits.data();
        for (int row = 0; row < rows; row++) {
            for (int column = 1; column < columns; column++) {
                if (data[row * columns + column] > data[row * columns + best[row]]) {
                    best[row] = column;
                }
            }
        }
        return best;
    }

    private void validate(FloatTensor x) {
        long[] shape = x.shape();
        if (shape.length != inputShape.length) {
            throw new InvalidInputException("input has rank " + shape.length + " (shape " + Arrays.toString(shape)
                    + "), the model expects " + Arrays.toString(inputShape), inputName);
        }
        for (int i = 0; i < shape.length; i++) {
            if (inputShape[i] >= 0 && inputShape[i] != shape[i]) {
                throw new InvalidInputException("input dimension " + i + " is " + shape[i] + ", the model expects "
                        + Arrays.toString(inputShape), inputName);
            }
        }
    }

    @Override
    public void close() {
        closeSession(session);
    }

    /** Closes an ONNX Runtime session; a failure to free native memory is a bug, not an input error. */
    static void closeSession(OrtSession session) {
        try {
            session.close();
        } catch (OrtException error) {
            throw new IllegalStateException("closing the onnxruntime session failed", error);
        }
    }
}
