"""Limits a device holds itself on the SecAgg+ parameters a server sends it, from a stated corruption budget.

The server chooses each round's configuration, so a lying server could choose one that protects no one: a
threshold of k/2 + 1 that two of its own devices next to a victim break (issue #44), two neighbours, a "sum"
of two inputs. The device assumes a round of n may hold c = `corrupt_devices(n)` devices that work with the
server (`corruption_budget` x n, and never fewer than two where the cohort allows it), placed anywhere in the
graph (the server may grind the graph, see `graph`), and refuses parameters under which c corrupt neighbours
and a lying server could read one input (docs/privacy.md, "How t, k and the survivor floor follow from the
budget"):

- t > (k + c) / 2: a corrupt neighbour reveals both of the victim's secrets; an honest one reveals one. The
  server needs t - c honest shares of each, so with 2 (t - c) > k - c it never gets both.
- k > c (so such a t <= k exists), and k at least `min_neighbour_count` where the cohort allows it.
- minimum_survivors >= c + 2: every unmasked sum holds at least two honest inputs.

The defaults are the Java SDK's; the cohort configuration both engines send (`cohort_config`: the server's
rounds and the in-process simulator's) satisfies them with its default threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedzoo.secagg.config import SecAggConfig, least_survivors
from fedzoo.secagg.errors import ProtocolViolation

DEFAULT_CORRUPTION_BUDGET = 0.05  # 5% of a round's devices may work with the server
LEAST_CORRUPT_DEVICES = 2  # two server-made devices next to the victim: the case of issue #44


def largest_neighbour_count(num_clients: int) -> int:
    """The largest even k below n."""
    return (num_clients - 1) // 2 * 2


def corrupt_devices(num_clients: int, corruption_budget: float = DEFAULT_CORRUPTION_BUDGET,
                    least: int = LEAST_CORRUPT_DEVICES) -> int:
    """c: how many corrupt devices a round of n must withstand; `least` only where the cohort allows k > c (a
    cohort of 3 or 4 has k = 2, and withstands one)."""
    return max(math.ceil(corruption_budget * num_clients - 1e-9),
               min(least, largest_neighbour_count(num_clients) - 1))


def threshold_floor(neighbour_count: int, corrupt: int) -> int:
    """The least t with 2 (t - c) > k - c (with c capped at k: all neighbours corrupt)."""
    return (neighbour_count + min(corrupt, neighbour_count)) // 2 + 1


def survivors_floor(threshold: int, corrupt: int) -> int:
    """The least minimum_survivors: max(3, t), and c + 2 so a sum holds two honest inputs."""
    return max(least_survivors(threshold), corrupt + 2)


def neighbours_floor(num_clients: int, corrupt: int, min_neighbour_count: int) -> int:
    """The least k: above c, and `min_neighbour_count` as far as the cohort allows."""
    return max(min(min_neighbour_count, largest_neighbour_count(num_clients)), (corrupt + 2) // 2 * 2)


def cohort_config(round_id: str, cohort: int, vector_length: int, clip_range: float, levels: int,
                  neighbour_count: int, threshold: int | None = None, min_clients: int = 0,
                  survivor_fraction: float | None = None) -> SecAggConfig:
    """A round's SecAgg+ parameters for a cohort of `cohort` devices, the one rule of the server and the simulator:
    k capped below the cohort; t as the operator set it, else the default devices' floor (k + c) // 2 + 1 for the c
    corrupt devices a round of this size must withstand; devices refuse to unmask a sum of fewer than
    max(3, t, c + 2, min_clients, ceil(survivor_fraction x cohort)) inputs (all of a cohort of 3). The defaults are
    within every default device's bounds; a t the operator set below them is sent as it is, and devices refuse it.
    A survivor fraction trades dropout tolerance for noise: distributed DP calibrates each device's share at the
    floor, so a floor near the cohort wastes less noise when every device survives."""
    corrupt = corrupt_devices(cohort)
    neighbours = min(neighbour_count, largest_neighbour_count(cohort))
    chosen = (max(neighbours // 2 + 1, min(threshold, neighbours)) if threshold
              else min(threshold_floor(neighbours, corrupt), neighbours))
    least = max(survivors_floor(chosen, corrupt), min_clients, math.ceil((survivor_fraction or 0) * cohort - 1e-9))
    return SecAggConfig(round_id, cohort, neighbours, chosen, vector_length, clip_range, levels,
                        minimum_survivors=min(cohort, least))


@dataclass(frozen=True)
class SecAggBounds:
    corruption_budget: float = DEFAULT_CORRUPTION_BUDGET
    least_corrupt_devices: int = LEAST_CORRUPT_DEVICES
    min_neighbour_count: int = 4
    max_neighbour_count: int = 200
    max_clients: int = 65_536

    def honest_survivors(self, config: SecAggConfig) -> int:
        """The honest inputs any sum the round unmasks holds at least: its survivor floor less the corrupt devices
        this device tolerates (they may add nothing that the floor counts on, e.g. distributed DP's noise)."""
        return config.minimum_survivors - corrupt_devices(config.num_clients, self.corruption_budget,
                                                          self.least_corrupt_devices)

    def check(self, config: SecAggConfig) -> None:
        """Raise ProtocolViolation (`config_out_of_bounds`) naming the first parameter outside these bounds."""
        corrupt = corrupt_devices(config.num_clients, self.corruption_budget, self.least_corrupt_devices)
        least_k = neighbours_floor(config.num_clients, corrupt, self.min_neighbour_count)
        least_t = threshold_floor(config.neighbour_count, corrupt)
        floor_survivors = survivors_floor(config.threshold, corrupt)
        tolerated = f"(this device tolerates {corrupt} corrupt devices in a round of {config.num_clients})"
        problems = [
            (config.num_clients > self.max_clients,
             f"num_clients {config.num_clients} is above this device's ceiling {self.max_clients}"),
            (not least_k <= config.neighbour_count <= self.max_neighbour_count,
             f"neighbour_count {config.neighbour_count} is outside this device's [{least_k}, "
             f"{self.max_neighbour_count}] {tolerated}"),
            (config.threshold < least_t,
             f"threshold {config.threshold} is below this device's floor {least_t} = (k + c) // 2 + 1 {tolerated}"),
            (config.minimum_survivors < floor_survivors,
             f"minimum_survivors {config.minimum_survivors} is below this device's floor {floor_survivors} "
             f"{tolerated}"),
        ]
        for failed, message in problems:
            if failed:
                raise ProtocolViolation(f"the round's configuration is refused: {message}",
                                        reason="config_out_of_bounds")
