package dev.fedzoo.fl;

import dev.fedzoo.InvalidInputException;
import dev.fedzoo.edge.FloatTensor;

/** A device's private examples: images in [0, 1] (N, C, H, W) and integer labels. They never leave the device. */
public final class LocalData {
    public final FloatTensor x;
    public final long[] y;

    /** Images {@code x} (N, C, H, W) in [0, 1] and their N labels. */
    public LocalData(FloatTensor x, long[] y) {
        long[] shape = x.shape();
        if (shape.length < 2 || shape[0] != y.length || y.length == 0) {
            throw new InvalidInputException("need a batch of images (N, ...) and N > 0 labels, got " + x + " and "
                    + y.length + " labels", "data");
        }
        this.x = x;
        this.y = y;
    }

    /** The number of examples. */
    public int size() {
        return y.length;
    }
}
