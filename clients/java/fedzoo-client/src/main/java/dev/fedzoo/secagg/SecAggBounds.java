package dev.fedzoo.secagg;

/**
 * Limits the device holds itself on the parameters a server sends (as {@code fedzoo.secagg.bounds.SecAggBounds}),
 * derived from a stated corruption budget: a round of n may hold c = max(ceil(budget x n), 2) devices that work with
 * the server (one where the cohort's k is 2), placed anywhere in the graph. The device refuses t <= (k + c) / 2 (then
 * the server could collect both of a victim's secrets), k <= c, k below {@code minNeighbourCount} as far as the cohort
 * allows, and a survivor floor below c + 2. An app may tighten them (docs/privacy.md, "Threat model").
 */
public final class SecAggBounds {
    public static final double DEFAULT_CORRUPTION_BUDGET = 0.05;
    public static final int LEAST_CORRUPT_DEVICES = 2;
    public final double corruptionBudget;
    public final int leastCorruptDevices;
    public final int minNeighbourCount;
    public final int maxNeighbourCount;
    public final int maxClients;

    /** The defaults: 5% corrupt devices and at least two, k in [4, 200] (as the cohort allows), at most 65,536 clients. */
    public SecAggBounds() {
        this(DEFAULT_CORRUPTION_BUDGET, LEAST_CORRUPT_DEVICES, 4, 200, 65_536);
    }

    public SecAggBounds(double corruptionBudget, int leastCorruptDevices, int minNeighbourCount, int maxNeighbourCount,
                        int maxClients) {
        this.corruptionBudget = corruptionBudget;
        this.leastCorruptDevices = leastCorruptDevices;
        this.minNeighbourCount = minNeighbourCount;
        this.maxNeighbourCount = maxNeighbourCount;
        this.maxClients = maxClients;
    }

    /** The largest even k below n. */
    public static int largestNeighbourCount(int numClients) {
        return (numClients - 1) / 2 * 2;
    }

    /**
     * The honest inputs any sum the round unmasks holds at least: its survivor floor less the corrupt devices this
     * device tolerates (they may add nothing the floor counts on, e.g. distributed DP's noise).
     */
    public int honestSurvivors(SecAggConfig config) {
        return config.minimumSurvivors - corruptDevices(config.numClients);
    }

    /** c: the corrupt devices a round of n must withstand. */
    public int corruptDevices(int numClients) {
        return Math.max((int) Math.ceil(corruptionBudget * numClients - 1e-9),
                Math.min(leastCorruptDevices, largestNeighbourCount(numClients) - 1));
    }

    /** The least t with 2 (t - c) > k - c. */
    public static int thresholdFloor(int neighbourCount, int corrupt) {
        return (neighbourCount + Math.min(corrupt, neighbourCount)) / 2 + 1;
    }

    /** Refuses ({@code config_out_of_bounds}) the first parameter outside these bounds, in Python's order. */
    public void check(SecAggConfig config) {
        int corrupt = corruptDevices(config.numClients);
        int neighboursFloor = Math.max(Math.min(minNeighbourCount, largestNeighbourCount(config.numClients)),
                (corrupt + 2) / 2 * 2);
        int thresholdFloor = thresholdFloor(config.neighbourCount, corrupt);
        int survivorsFloor = Math.max(SecAggConfig.leastSurvivors(config.threshold), corrupt + 2);
        String tolerated = " (this device tolerates " + corrupt + " corrupt devices in a round of " + config.numClients
                + ")";
        if (config.numClients > maxClients) {
            refuse("num_clients " + config.numClients + " is above this device's ceiling " + maxClients);
        }
        if (config.neighbourCount < neighboursFloor || config.neighbourCount > maxNeighbourCount) {
            refuse("neighbour_count " + config.neighbourCount + " is outside this device's [" + neighboursFloor + ", "
                    + maxNeighbourCount + "]" + tolerated);
        }
        if (config.threshold < thresholdFloor) {
            refuse("threshold " + config.threshold + " is below this device's floor " + thresholdFloor
                    + " = (k + c) / 2 + 1" + tolerated);
        }
        if (config.minimumSurvivors < survivorsFloor) {
            refuse("minimum_survivors " + config.minimumSurvivors + " is below this device's floor " + survivorsFloor
                    + tolerated);
        }
    }

    private static void refuse(String problem) {
        throw new ProtocolViolation("the round's configuration is refused: " + problem, "config_out_of_bounds");
    }
}
