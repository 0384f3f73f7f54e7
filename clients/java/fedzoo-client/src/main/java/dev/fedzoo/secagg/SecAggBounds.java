package dev.fedzoo.secagg;

/**
 * Limits the device holds itself on the parameters a server sends (as {@code fedzoo.secagg.bounds.SecAggBounds}):
 * a lying server could choose a round that protects no one (a threshold of 1, a "sum" of two inputs). A floor on
 * k or t applies as far as the cohort allows. An app may tighten them.
 */
public final class SecAggBounds {
    public final int minNeighbourCount;
    public final int maxNeighbourCount;
    public final int minThreshold;
    public final int minSurvivors;
    public final int maxClients;

    /** The defaults: k in [4, 200] (as the cohort allows), t >= 3, at least 3 survivors, at most 65,536 clients. */
    public SecAggBounds() {
        this(4, 200, 3, 3, 65_536);
    }

    public SecAggBounds(int minNeighbourCount, int maxNeighbourCount, int minThreshold, int minSurvivors, int maxClients) {
        this.minNeighbourCount = minNeighbourCount;
        this.maxNeighbourCount = maxNeighbourCount;
        this.minThreshold = minThreshold;
        this.minSurvivors = minSurvivors;
        this.maxClients = maxClients;
    }

    /** Refuses ({@code config_out_of_bounds}) the first parameter outside these bounds, in the protocol's order. */
    public void check(SecAggConfig config) {
        int neighboursFloor = Math.min(minNeighbourCount, (config.numClients - 1) / 2 * 2);
        int thresholdFloor = Math.max(Math.min(minThreshold, config.neighbourCount), config.neighbourCount / 2 + 1);
        int survivorsFloor = Math.max(minSurvivors, SecAggConfig.leastSurvivors(config.threshold));
        if (config.neighbourCount < neighboursFloor || config.neighbourCount > maxNeighbourCount) {
            refuse("neighbour_count " + config.neighbourCount + " is outside this device's [" + neighboursFloor + ", "
                    + maxNeighbourCount + "]");
        }
        if (config.threshold < thresholdFloor) {
            refuse("threshold " + config.threshold + " is below this device's floor " + thresholdFloor);
        }
        if (config.minimumSurvivors < survivorsFloor) {
            refuse("minimum_survivors " + config.minimumSurvivors + " is below this device's floor " + survivorsFloor);
        }
        if (config.numClients > maxClients) {
            refuse("num_clients " + config.numClients + " is above this device's ceiling " + maxClients);
        }
    }

    private static void refuse(String problem) {
        throw new ProtocolViolation("the round's configuration is refused: " + problem, "config_out_of_bounds");
    }
}
