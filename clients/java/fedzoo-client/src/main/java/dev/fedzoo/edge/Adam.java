package dev.fedzoo.edge;

import java.util.HashMap;
import java.util.Map;

import dev.fedzoo.InvalidInputException;

/** Adam with bias correction, like torch.optim.Adam (weight decay as an L2 term, amsgrad off). */
public final class Adam extends Optimizer {
    private final double beta1;
    private final double beta2;
    private final double epsilon;
    private final Map<String, float[]> firstMoment = new HashMap<String, float[]>();
    private final Map<String, float[]> secondMoment = new HashMap<String, float[]>();
    private final Map<String, Integer> steps = new HashMap<String, Integer>();

    /** Adam with torch's defaults: betas (0.9, 0.999), epsilon 1e-8, no weight decay. */
    public Adam(double learningRate) {
        this(learningRate, 0.9, 0.999, 1e-8, 0.0);
    }

    /** Adam with every hyper-parameter given. */
    public Adam(double learningRate, double beta1, double beta2, double epsilon, double weightDecay) {
        super(learningRate, weightDecay);
        if (!(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0)) {
            throw new InvalidInputException("betas must be in [0, 1), got (" + beta1 + ", " + beta2 + ")", "betas");
        }
        this.beta1 = beta1;
        this.beta2 = beta2;
        this.epsilon = epsilon;
    }

    @Override
    protected void update(String name, float[] parameter, float[] gradient) {
        float[] first = firstMoment.get(name);
        float[] second = secondMoment.get(name);
        if (first == null) {
            first = new float[parameter.length];
            second = new float[parameter.length];
            firstMoment.put(name, first);
            secondMoment.put(name, second);
        }
        Integer previous = steps.get(name);
        int step = previous == null ? 1 : previous + 1;
        steps.put(name, step);
        // the scalars of numpy's expressions, each rounded to float32 where numpy meets the float32 array
        float b1 = (float) beta1;
        float oneMinusB1 = (float) (1.0 - beta1);
        float b2 = (float) beta2;
        float oneMinusB2 = (float) (1.0 - beta2);
        float secondCorrection = (float) (1.0 - Math.pow(beta2, step));
        float eps = (float) epsilon;
        float stepSize = (float) (learningRate / (1.0 - Math.pow(beta1, step)));
        for (int i = 0; i < parameter.length; i++) {
            first[i] *= b1;
            first[i] += oneMinusB1 * gradient[i];
            second[i] *= b2;
            second[i] += oneMinusB2 * gradient[i] * gradient[i];
            float denominator = (float) Math.sqrt(second[i] / secondCorrection) + eps;
            parameter[i] -= stepSize * first[i] / denominator;
        }
    }
}
