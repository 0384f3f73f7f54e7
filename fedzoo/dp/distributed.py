"""Distributed DP under SecAgg+: each device adds its share of discrete Gaussian noise in the integer ring before
masking, so the server only ever unmasks a noised sum (Kairouz, Liu and Steinke, ICML 2021, "The Distributed Discrete
Gaussian Mechanism for Federated Learning with Secure Aggregation").

A device's pipeline (the same in both SDKs; `tests/vectors/distributed_noise_vectors.json`):

1. clip the delta to L2 norm C (`fedzoo.dp.clipping`);
2. scale it to the ring's grid: x / step, step = C / levels (the SecAgg+ config's `clip_range` and `levels`);
3. round each coordinate randomly (up with probability its fraction, from a uint32 draw), and redraw the whole
   vector until its squared norm is at most `norm_bound_squared` (KLS's conditional randomized rounding at
   beta = exp(-1/2), which makes the bound an integer both SDKs compute exactly);
4. add N_Z(0, sigma^2) to every coordinate, sigma^2 from `device_sigma_squared` (exact CKS sampler,
   `fedzoo.dp.discrete_gaussian`, from `os.urandom`);
5. append its weight (`levels`: every device weighs 1 under DP) and reduce into Z_{2^bits}.

Calibration: sigma^2 is chosen so that the sum of the `survivors` devices' noise alone (the fewest honest inputs a sum
the round unmasks holds: the SecAgg+ config's `minimum_survivors` less the corrupt devices it withstands, which may add
none) meets the plan's noise multiplier z under KLS's bound; more survivors only add noise. The accounting
(`noise_multiplier_of_sum`): the sum of n draws of N_Z(0, sigma^2) added to an integer vector of L2 sensitivity D2
is (1/2) eps^2-concentrated DP with eps = D2 / (sqrt(n) sigma) + tau sqrt(d),
tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)) (KLS 2021, the sum of discrete Gaussians); that is the
Renyi curve of a Gaussian mechanism of noise multiplier 1 / eps, so the line's ledger composes it with central
rounds as a Gaussian event of that multiplier. The step^2 of margin in sigma^2 keeps tau negligible (the sum is
worth at least the plan's z, and within 1% of it on realistic grids: tests/dp/test_distributed.py).

No randomized rotation and no modular clipping: the ring must hold every noised sum without wrapping
(`ring_bits_needed`; the server refuses a plan whose ring does not), so there is no wrap-around bias to correct; the
cost is the ring SecAgg+ already picks (16 bits at levels 127 for cohorts up to 258, else 32) instead of KLS's
tighter rings after rotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from fedzoo.dp.discrete_gaussian import SIGMA_SQUARED_DENOMINATOR, SecureRandom, sample_discrete_gaussian
from fedzoo.errors import InvalidInputError
from fedzoo.privacy_terms import PrivacyTerms
from fedzoo.secagg.errors import ProtocolViolation

MECHANISM = "distributed-discrete-gaussian"
TAIL_STDDEVS = 20  # the ring holds the noise up to 20 standard deviations (P(|noise| > 20 sigma) < 1e-86)
NORM_TOLERANCE = 1e-5  # float32 clipping lands within ~1e-7 of C; the bound itself is enforced on the integers
ROUNDING_ATTEMPTS = 1000  # each attempt passes with probability > 1 - exp(-1/2); 1000 failures: something is wrong


@dataclass(frozen=True)
class DistributedNoise:
    """What the server asks of each device in a distributed-DP round: the plan's noise multiplier z (what the
    ledger charges) and the fewest honest survivors the noise is calibrated for (the SecAgg+ config's
    `minimum_survivors` less the c corrupt devices the round withstands: those may add no noise)."""

    noise_multiplier: float
    survivors: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.noise_multiplier) or self.noise_multiplier <= 0:
            raise InvalidInputError(f"noise_multiplier must be a positive number, got {self.noise_multiplier}",
                                    field="noise_multiplier")
        if type(self.survivors) is not int or self.survivors < 1:
            raise InvalidInputError(f"survivors must be a whole number >= 1, got {self.survivors}", field="survivors")

    def to_dict(self) -> dict[str, Any]:
        return {"mechanism": MECHANISM, "noise_multiplier": self.noise_multiplier, "survivors": self.survivors}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DistributedNoise:
        if data.get("mechanism") != MECHANISM:
            raise InvalidInputError(f"unknown noise mechanism {data.get('mechanism')!r}", field="mechanism")
        return cls(float(data["noise_multiplier"]), data["survivors"])


def norm_bound_squared(levels: int, dimension: int) -> int:
    """The squared L2 norm a rounded update may have (an integer, so both SDKs test it exactly): KLS's
    conditional-rounding bound c^2 + d/4 + sqrt(2 ln(1/beta)) (c + sqrt(d)/2) at beta = exp(-1/2), c = levels."""
    return levels * levels + levels + math.floor(dimension / 4 + math.sqrt(dimension) / 2)


def device_sigma_squared(noise: DistributedNoise, levels: int, dimension: int) -> Fraction:
    """Each device's noise variance in grid steps: (z D2)^2 / survivors, plus one step^2 of margin for KLS's tau
    term, rounded up to a multiple of 2^-20 (the same float operations in both SDKs)."""
    bound = math.sqrt(norm_bound_squared(levels, dimension))
    sigma = noise.noise_multiplier * bound / math.sqrt(noise.survivors)
    return Fraction(math.ceil((sigma * sigma + 1) * SIGMA_SQUARED_DENOMINATOR), SIGMA_SQUARED_DENOMINATOR)


def noise_multiplier_of_sum(sigma_squared: float, summands: int, sensitivity_squared: float, dimension: int) -> float:
    """The Gaussian noise multiplier whose Renyi curve bounds the sum of `summands` devices' N_Z(0, sigma^2) on a
    query of squared L2 sensitivity `sensitivity_squared` (grid steps) in `dimension` coordinates: 1 / eps with
    KLS's eps = D2 / (sqrt(n) sigma) + tau sqrt(d)."""
    if sigma_squared <= 0 or summands < 1 or sensitivity_squared <= 0 or dimension < 1:
        raise InvalidInputError("sigma^2, summands, sensitivity and dimension must be positive", field="noise")
    tau = 10 * sum(math.exp(-2 * math.pi ** 2 * sigma_squared * k / (k + 1)) for k in range(1, summands))
    epsilon = math.sqrt(sensitivity_squared / (summands * sigma_squared)) + tau * math.sqrt(dimension)
    return 1 / epsilon


def equivalent_noise_multiplier(noise: DistributedNoise, levels: int, dimension: int) -> float:
    """What the sum of `noise.survivors` devices' calibrated noise is worth, as a Gaussian noise multiplier."""
    return noise_multiplier_of_sum(float(device_sigma_squared(noise, levels, dimension)), noise.survivors,
                                   norm_bound_squared(levels, dimension), dimension)


def ring_bits_needed(levels: int, cohort: int, sigma_squared: Fraction) -> int:
    """Bits per coordinate the ring needs so that no sum of `cohort` devices' inputs wraps: each coordinate is at
    most levels + 1 after rounding, plus the sum's noise up to TAIL_STDDEVS standard deviations, signed."""
    largest = cohort * (levels + 1) + TAIL_STDDEVS * math.sqrt(cohort * float(sigma_squared))
    return math.ceil(math.log2(2 * largest + 1))


def round_conditionally(scaled: np.ndarray, bound_squared: int, source: SecureRandom) -> np.ndarray:
    """KLS's conditional randomized rounding: each coordinate up with probability its fraction (a uint32 draw below
    fraction x 2^32, little-endian), the whole vector redrawn until its squared norm is at most `bound_squared`."""
    floor = np.floor(scaled)
    threshold = (scaled - floor) * 2.0**32
    for _ in range(ROUNDING_ATTEMPTS):
        draws = np.frombuffer(source.read(4 * scaled.size), dtype="<u4").astype(np.float64)
        rounded = (floor + (draws < threshold)).astype(np.int64)
        if int(np.dot(rounded, rounded)) <= bound_squared:
            return rounded
    raise InvalidInputError(f"no rounding within the norm bound in {ROUNDING_ATTEMPTS} attempts: the vector is "
                            "not clipped to the round's clip norm", field="vector")


def noise_shares(sigma_squared: Fraction, dimension: int, source: SecureRandom, shares: int = 1) -> np.ndarray:
    """The sum of `shares` devices' noise, each N_Z(0, sigma^2) on every one of `dimension` coordinates (int64, drawn
    share by share, coordinate by coordinate): a device's own share, or the shares of a cohort that did not form,
    which the server adds in a zoo-wide round (`fedzoo.server.fl.zoo_privacy`)."""
    total = np.zeros(dimension, dtype=np.int64)
    for _ in range(shares):
        total += np.fromiter((sample_discrete_gaussian(sigma_squared, source) for _ in range(dimension)),
                             dtype=np.int64, count=dimension)
    return total


def noised_ring_input(clipped: np.ndarray, clip_norm: float, levels: int, modulus_bits: int, noise: DistributedNoise,
                      source: SecureRandom | None = None) -> np.ndarray:
    """The device's SecAgg+ input under distributed DP: its clipped delta (float64, L2 norm <= clip_norm) on the
    grid clip_norm / levels, rounded within the norm bound, with its share of the noise, and weight 1 (`levels`)
    appended, in Z_{2^modulus_bits} (uint32 or uint16)."""
    clipped = np.asarray(clipped, dtype=np.float64)
    if clipped.ndim != 1 or not np.all(np.isfinite(clipped)):
        raise InvalidInputError("the update must be a finite vector", field="vector")
    if float(np.linalg.norm(clipped)) > clip_norm * (1 + NORM_TOLERANCE):
        raise InvalidInputError(f"the update's norm {np.linalg.norm(clipped):.6g} is above clip_norm {clip_norm}",
                                field="vector")
    source = source if source is not None else SecureRandom()
    dimension = clipped.size
    rounded = round_conditionally(clipped * (levels / clip_norm), norm_bound_squared(levels, dimension), source)
    noised = rounded + noise_shares(device_sigma_squared(noise, levels, dimension), dimension, source)
    values = np.append(noised, levels) % 2**modulus_bits
    return values.astype(np.uint16 if modulus_bits == 16 else np.uint32)


@dataclass(frozen=True)
class NoisePolicy:
    """The device's own terms for DP under SecAgg+, so a lying server cannot quietly take the noise away:
    `require_distributed` refuses a DP round whose noise the server would add itself (it would see the noiseless
    sum); `minimum_noise_multiplier` refuses a request for less noise than the device accepts."""

    require_distributed: bool = False
    minimum_noise_multiplier: float | None = None

    def stricter(self, other: NoisePolicy) -> NoisePolicy:
        """What both policies require (the owner's and the operator's terms, `fedzoo.privacy_terms`)."""
        floors = [floor for floor in (self.minimum_noise_multiplier, other.minimum_noise_multiplier)
                  if floor is not None]
        return NoisePolicy(self.require_distributed or other.require_distributed, max(floors) if floors else None)


def check_noise_request(noise: DistributedNoise | None, honest_survivors: int, policy: NoisePolicy) -> None:
    """Refuse (ProtocolViolation) a request the device must not follow: noise calibrated for more honest survivors
    than any sum the round's signed SecAgg+ config lets the server unmask holds (`SecAggBounds.honest_survivors`:
    its survivor floor less the corrupt devices the device tolerates, which may add no noise), and one its
    `policy` does not accept (`check_noise_policy`). (The device computes its own sigma from z and the survivors,
    so the server cannot ask for a sigma that misstates z.)"""
    if noise is not None and noise.survivors > honest_survivors:
        raise ProtocolViolation(f"the noise is calibrated for {noise.survivors} honest survivors, but a sum the round "
                                f"unmasks may hold only {honest_survivors}: it would carry less than the accounted "
                                "noise",
                                "noise_survivors_above_floor")
    check_noise_policy(None if noise is None else noise.noise_multiplier, policy)


def check_noise_policy(noise_multiplier: float | None, policy: NoisePolicy) -> None:
    """Refuse (ProtocolViolation) a noise request `policy` does not accept: central noise (`noise_multiplier` None:
    the task asks the device for none) where it requires distributed, or a z below its floor. The server checks a
    plan with it too, against the operator's terms (`fedzoo.server.fl.terms_gate`)."""
    if noise_multiplier is None:
        if policy.require_distributed:
            raise ProtocolViolation("this device adds its own share of DP noise under SecAgg+, and the round asks the "
                                    "server to add it (central noise: the server would see the noiseless sum)",
                                    "noise_not_distributed")
        return
    if policy.minimum_noise_multiplier is not None and noise_multiplier < policy.minimum_noise_multiplier:
        raise ProtocolViolation(f"noise multiplier {noise_multiplier} is below this device's floor "
                                f"{policy.minimum_noise_multiplier}", "noise_below_floor")


def policy_for(terms: PrivacyTerms | None, line_id: str, own: NoisePolicy) -> NoisePolicy:
    """The device's policy for a round on `line_id`: its owner's, made at least as strict as the operator's privacy
    terms for the line (`fedzoo.privacy_terms`: distributed noise, and their floor on z)."""
    line = terms.for_line(line_id) if terms is not None else None
    return own if line is None else own.stricter(NoisePolicy(True, line.minimum_noise_multiplier))


def check_task_privacy(privacy: dict[str, Any] | None, policy: NoisePolicy) -> None:
    """Before training: `ProtocolViolation` `noise_not_distributed` for a task that cannot carry the device's own
    noise where the policy requires it (no DP clipping, or no SecAgg+: the update would leave unnoised). The noise
    request itself is checked once the round's SecAgg+ config is fixed (`check_noise_request`)."""
    if not policy.require_distributed:
        return
    if not privacy or privacy.get("clip_norm") is None or privacy.get("secure_aggregation") is None:
        raise ProtocolViolation("this device requires distributed DP under SecAgg+ on this line (the operator's "
                                "privacy terms or its owner's policy), and the round asks for no DP or no SecAgg+ "
                                "(the update would leave without this device's noise)", "noise_not_distributed")
