package dev.fedzoo.edge;

import java.util.Arrays;
import java.util.Map;

import dev.fedzoo.InvalidInputException;

/**
 * Updates parameters in place from their gradients, with torch.optim's rules, as {@code fedzoo.edge.optimizers}.
 * Arithmetic is numpy 2's: array operations in float32, scalar coefficients computed in double and rounded
 * to float32 once, in the same order as the Python code, so a Java and a Python device given the same
 * gradients end bit for bit at the same parameters.
 */
public abstract class Optimizer {
    protected final double learningRate;
    protected final double weightDecay;

    /** An optimizer with a positive learning rate and an L2 weight decay (0: none). */
    protected Optimizer(double learningRate, double weightDecay) {
        if (!(learningRate > 0.0)) {
            throw new InvalidInputException("learning_rate must be positive, got " + learningRate, "learning_rate");
        }
        if (weightDecay < 0.0) {
            throw new InvalidInputException("weight_decay must be >= 0, got " + weightDecay, "weight_decay");
        }
        this.learningRate = learningRate;
        this.weightDecay = weightDecay;
    }

    /** Applies one update to every parameter that has a gradient (parameter arrays are modified in place). */
    public void step(Map<String, FloatTensor> parameters, Map<String, FloatTensor> gradients) {
        for (Map.Entry<String, FloatTensor> entry : gradients.entrySet()) {
            String name = entry.getKey();
            FloatTensor parameter = parameters.get(name);
            FloatTensor gradient = entry.getValue();
            if (parameter == null || !Arrays.equals(parameter.shape(), gradient.shape())) {
                throw new InvalidInputException("gradient of '" + name + "' has shape " + Arrays.toString(gradient.shape())
                        + ", the parameter " + (parameter == null ? "does not exist" : Arrays.toString(parameter.shape())), name);
            }
            float[] g = gradient.data();
            if (weightDecay != 0.0) {
                // L2 penalty, as torch.optim adds it (a new array: the caller's gradient stays as it was)
                float decay = (float) weightDecay;
                float[] p = parameter.data();
                float[] decayed = new float[g.length];
                for (int i = 0; i < g.length; i++) {
                    decayed[i] = g[i] + decay * p[i];
                }
                g = decayed;
            }
            update(name, parameter.data(), g);
        }
    }

    /** Changes {@code parameter} in place given its (weight-decayed) gradient. */
    protected abstract void update(String name, float[] parameter, float[] gradient);
}
