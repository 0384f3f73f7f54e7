package dev.fedzoo.edge;

import java.util.HashMap;
import java.util.Map;

import dev.fedzoo.InvalidInputException;

/** Stochastic gradient descent with (optionally Nesterov) momentum, like torch.optim.SGD (dampening 0). */
public final class Sgd extends Optimizer {
    private final double momentum;
    private final boolean nesterov;
    private final Map<String, float[]> velocity = new HashMap<String, float[]>();

    /** Plain SGD. */
    public Sgd(double learningRate) {
        this(learningRate, 0.0, 0.0, false);
    }

    /** SGD with momentum in [0, 1). */
    public Sgd(double learningRate, double momentum) {
        this(learningRate, momentum, 0.0, false);
    }

    /** SGD with momentum, L2 weight decay and optionally Nesterov momentum. */
    public Sgd(double learningRate, double momentum, double weightDecay, boolean nesterov) {
        super(learningRate, weightDecay);
        if (!(momentum >= 0.0 && momentum < 1.0)) {
            throw new InvalidInputException("momentum must be in [0, 1), got " + momentum, "momentum");
        }
        if (nesterov && momentum == 0.0) {
            throw new InvalidInputException("nesterov momentum needs momentum > 0", "nesterov");
        }
        this.momentum = momentum;
        this.nesterov = nesterov;
    }

    @Override
    protected void update(String name, float[] parameter, float[] gradient) {
        float rate = (float) learningRate;
        float[] direction = gradient;
        if (momentum != 0.0) {
            float beta = (float) momentum;
            float[] v = velocity.get(name);
            if (v == null) {
                v = gradient.clone(); // torch: the first step's velocity is the gradient itself
                velocity.put(name, v);
            } else {
                for (int i = 0; i < v.length; i++) {
                    v[i] *= beta;
                    v[i] += gradient[i];
                }
            }
            if (nesterov) {
                direction = new float[v.length];
                for (int i = 0; i < v.length; i++) {
                    direction[i] = gradient[i] + beta * v[i];
                }
            } else {
                direction = v;
            }
        }
        for (int i = 0; i < parameter.length; i++) {
            parameter[i] -= rate * direction[i];
        }
    }
}
