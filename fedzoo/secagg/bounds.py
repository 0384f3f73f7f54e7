"""Limits a device holds itself on the SecAgg+ parameters a server sends it.

The server chooses each round's configuration, so a lying server could choose one that protects no one: a
threshold of 1, two neighbours, a "sum" of two inputs. `SecAggConfig` already refuses parameters that break
the protocol (t <= k/2, fewer than max(3, t) survivors); these bounds are the device's own, stricter floor,
and a ceiling on the work a round may ask of it. A floor on k or t applies as far as the cohort allows (a
cohort of 3 or 4 has k = 2). The app may tighten them; the defaults are the Java SDK's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedzoo.secagg.config import SecAggConfig, least_survivors
from fedzoo.secagg.errors import ProtocolViolation


@dataclass(frozen=True)
class SecAggBounds:
    min_neighbour_count: int = 4
    max_neighbour_count: int = 200
    min_threshold: int = 3
    min_survivors: int = 3
    max_clients: int = 65_536

    def check(self, config: SecAggConfig) -> None:
        """Raise ProtocolViolation (`config_out_of_bounds`) naming the first parameter outside these bounds."""
        neighbours_floor = min(self.min_neighbour_count, (config.num_clients - 1) // 2 * 2)
        threshold_floor = max(min(self.min_threshold, config.neighbour_count), config.neighbour_count // 2 + 1)
        survivors_floor = max(self.min_survivors, least_survivors(config.threshold))
        problems = [
            (not neighbours_floor <= config.neighbour_count <= self.max_neighbour_count,
             f"neighbour_count {config.neighbour_count} is outside this device's [{neighbours_floor}, "
             f"{self.max_neighbour_count}]"),
            (config.threshold < threshold_floor,
             f"threshold {config.threshold} is below this device's floor {threshold_floor}"),
            (config.minimum_survivors < survivors_floor,
             f"minimum_survivors {config.minimum_survivors} is below this device's floor {survivors_floor}"),
            (config.num_clients > self.max_clients,
             f"num_clients {config.num_clients} is above this device's ceiling {self.max_clients}"),
        ]
        for failed, message in problems:
            if failed:
                raise ProtocolViolation(f"the round's configuration is refused: {message}",
                                        reason="config_out_of_bounds")
