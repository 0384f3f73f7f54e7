"""Distributed DP over REST (`privacy.dp.noise: "distributed"`): the devices noise their own inputs in the SecAgg+ ring
(`fedzoo.dp.distributed`), so the server never sees a noiseless sum and never adds noise itself.

What the server still does: refuse the setting without SecAgg+ (422 `privacy.dp.noise`: there is no ring to noise
in), check that the ring holds every possible noised sum without wrapping (422 `privacy.secure_aggregation.levels`
otherwise) and report the bits per coordinate it needs, ask each device for the noise calibrated for the round's
signed survivor floor (the SecAgg+ config's `minimum_survivors`, which every device enforces before it unmasks, less
the corrupt devices the round withstands: a Sybil adds no noise), and charge the plan's ledger for each released
round at the plan's z, which the calibrated sum meets or beats.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedzoo.dp.accountant import PrivacyLedger
from fedzoo.dp.distributed import (MECHANISM, TAIL_STDDEVS, DistributedNoise, device_sigma_squared,
                                   equivalent_noise_multiplier, norm_bound_squared, ring_bits_needed)
from fedzoo.errors import InvalidInputError
from fedzoo.secagg import SecAggConfig
from fedzoo.secagg.bounds import SecAggBounds
from fedzoo.secagg.config import MIN_CLIENTS
from fedzoo.server.fl.schemas import RoundConfig


def is_distributed(config: RoundConfig) -> bool:
    return config.privacy.dp is not None and config.privacy.dp.noise == "distributed"


def check_distributed_plan(config: RoundConfig, protocol: SecAggConfig | None) -> None:
    """422 for a distributed-noise plan the ring cannot carry: without SecAgg+ (`protocol` None), or a ring too small
    for the selection goal's noised sums (`protocol`: the SecAgg+ config a cohort of that size gets)."""
    if protocol is None:
        raise InvalidInputError("distributed noise needs secure aggregation: each device adds its share of the noise "
                                "inside the SecAgg+ ring; set privacy.secure_aggregation, or use noise 'central'",
                                field="privacy.dp.noise")
    needed = bits_needed(protocol, noise_request(config, protocol))
    if needed > protocol.modulus_bits:
        raise InvalidInputError(f"the noised sums of {protocol.num_clients} devices need {needed} bits per coordinate, "
                                f"more than the {protocol.modulus_bits}-bit ring at levels={protocol.levels}; lower "
                                "levels or the noise multiplier", field="privacy.secure_aggregation.levels")


def sensitivity_scale(config: RoundConfig) -> int:
    """How many devices' inputs one device can put into a released sum or take out of it: `MIN_CLIENTS` in a zoo-wide
    round (a device that brings its subnet's group to 3 makes that cohort's sum exist: docs/privacy.md, "Distributed
    DP in zoo-wide rounds"), else 1."""
    return MIN_CLIENTS if config.zoo is not None else 1


def requested_noise_multiplier(config: RoundConfig) -> float:
    """The z each device is asked for: the plan's z times `sensitivity_scale` (the devices calibrate against their
    own bound, so a zoo-wide cohort's sum carries z for three devices' bound)."""
    return config.privacy.dp.noise_multiplier * sensitivity_scale(config)


def noise_request(config: RoundConfig, protocol: SecAggConfig) -> DistributedNoise:
    """What each device is asked to add: `requested_noise_multiplier`, calibrated for the fewest honest survivors a
    sum the round unmasks holds (its survivor floor less the corrupt devices the default devices withstand)."""
    return DistributedNoise(requested_noise_multiplier(config), SecAggBounds().honest_survivors(protocol))


def bits_needed(protocol: SecAggConfig, noise: DistributedNoise) -> int:
    """Bits per coordinate no noised sum of the whole cohort can wrap in (the weight coordinate needs fewer)."""
    return ring_bits_needed(protocol.levels, protocol.num_clients,
                            device_sigma_squared(noise, protocol.levels, protocol.vector_length))


def noise_slack(protocol: SecAggConfig, noise: DistributedNoise, survivors: int) -> float:
    """How far (model units) the survivors' summed noise may take a coordinate beyond what clipped updates add up to:
    TAIL_STDDEVS of its standard deviation (the server's envelope check on the unmasked sum)."""
    sigma_squared = float(device_sigma_squared(noise, protocol.levels, protocol.vector_length))
    return TAIL_STDDEVS * math.sqrt(survivors * sigma_squared) * protocol.clip_range / protocol.levels


def require_calibrated_survivors(survivors: int, minimum_survivors: int) -> None:
    """A sum must hold at least the survivors its noise was calibrated under (the devices enforce it; a server that
    let fewer through would release less noise than it charges)."""
    if survivors < minimum_survivors:
        raise InvalidInputError(f"the sum holds {survivors} inputs, fewer than the round's floor {minimum_survivors} "
                                "the noise is calibrated under", field="survivors")


def released_mean(noised_sum: np.ndarray, survivors: int, minimum_survivors: int, ledger: PrivacyLedger,
                  expected_clients: int) -> np.ndarray:
    """The round's mean delta from the devices' noised sum, charged to the ledger: the sum must hold at least the
    survivors the noise was calibrated for (`require_calibrated_survivors`), and it is divided by the expected
    cohort (fixed denominator, as central DP)."""
    require_calibrated_survivors(survivors, minimum_survivors)
    ledger.require_budget_for_next_round()
    ledger.record_round()
    return np.asarray(noised_sum, dtype=np.float64) / expected_clients


def card_noise(protocol: SecAggConfig, noise: DistributedNoise) -> dict[str, Any]:
    """What a card states about the distributed mechanism, beyond the ledger's figures."""
    sigma_squared = device_sigma_squared(noise, protocol.levels, protocol.vector_length)
    step = protocol.clip_range / protocol.levels
    return {"noise": f"{MECHANISM}: each device adds N_Z(0, sigma^2) in the SecAgg+ ring, from os.urandom",
            "mechanism": MECHANISM, "calibrated_survivors": noise.survivors,
            "device_sigma": math.sqrt(float(sigma_squared)) * step,
            "equivalent_noise_multiplier": equivalent_noise_multiplier(noise, protocol.levels, protocol.vector_length),
            "sensitivity": math.sqrt(norm_bound_squared(protocol.levels, protocol.vector_length)) * step,
            "grid_step": step, "ring_bits": protocol.modulus_bits, "bits_needed": bits_needed(protocol, noise)}
