package dev.fedzoo.edge;

import java.util.Arrays;

import dev.fedzoo.InvalidInputException;

/**
 * A float32 array with a shape, row-major: the Java counterpart of a numpy float32 array. Parameters,
 * gradients, deltas and image batches all travel as these.
 */
public final class FloatTensor {
    private final long[] shape;
    private final float[] data;

    /** Wraps {@code data} (not copied) as an array of {@code shape}; their sizes must agree. */
    public FloatTensor(long[] shape, float[] data) {
        if (elementCount(shape) != data.length) {
            throw new InvalidInputException("shape " + Arrays.toString(shape) + " holds " + elementCount(shape)
                    + " values, got " + data.length);
        }
        this.shape = shape.clone();
        this.data = data;
    }

    /** A zero-filled tensor of {@code shape}. */
    public static FloatTensor zeros(long... shape) {
        return new FloatTensor(shape, new float[(int) elementCount(shape)]);
    }

    /** The number of values an array of {@code shape} holds (1 for a scalar). */
    public static long elementCount(long[] shape) {
        long count = 1;
        for (long size : shape) {
            if (size < 0) {
                throw new InvalidInputException("negative dimension in shape " + Arrays.toString(shape));
            }
            count *= size;
        }
        return count;
    }

    /** The shape (a copy). */
    public long[] shape() {
        return shape.clone();
    }

    /** The values themselves (not a copy): callers may update them in place, as optimizers do. */
    public float[] data() {
        return data;
    }

    /** The number of values. */
    public int size() {
        return data.length;
    }

    /** A tensor of the same shape with its own copy of the values. */
    public FloatTensor copy() {
        return new FloatTensor(shape, data.clone());
    }

    @Override
    public String toString() {
        return "FloatTensor" + Arrays.toString(shape);
    }
}
