"""Bodies of the federated-learning endpoints (pydantic): validated and documented by the same models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fedzoo.capabilities import ENCODINGS_PATTERN, SECURE_AGGREGATION_VERSION, Capabilities, parse_encodings
from fedzoo.cards import IDENTIFIER_PATTERN, SHA256_PATTERN

RoundStateName = Literal["open", "collecting", "aggregating", "closed", "failed"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


DEFAULT_MAX_ACCURACY_DROP = 0.02
MAX_NUM_EXAMPLES = 1_000_000_000


class NormBound(_Request):
    """Updates whose L2 norm exceeds `median_multiple` x the median norm of the round's updates (or
    `max_norm`, when set) are clipped to that bound or left out of the aggregate; either way recorded."""

    median_multiple: float = Field(default=3.0, gt=1.0, le=1000.0)
    max_norm: float | None = Field(default=None, gt=0.0, le=1e12, description="an absolute bound as well")
    action: Literal["clip", "reject"] = Field(default="clip")


class WeightBound(_Request):
    """How much one update may weigh in the round's mean, relative to the round itself: a device's example
    count is its own claim, so no claim may buy it the round (docs/federated-rounds.md, "Robust rounds")."""

    rule: Literal["median_multiple", "equal", "examples"] = Field(
        default="median_multiple",
        description="median_multiple: min(counted examples, k x the round's median); equal: every update weighs "
                    "the same; examples: the counted examples alone (capped only by max_examples_per_update)")
    median_multiple: float = Field(default=2.0, ge=1.0, le=1000.0, description="k of the median_multiple rule")


class DirectionScreening(_Request):
    """Each update is compared with the coordinate-wise median of the round's updates: one whose cosine with it
    is at most `min_cosine` points away from what the round agrees on and is left out (on by default; needs at
    least 3 updates and the updates themselves, so not under SecAgg+; docs/federated-rounds.md, "Robust rounds")."""

    min_cosine: float = Field(
        default=-0.05, ge=-1.0, lt=1.0,
        description="updates whose cosine with the round's median delta is at most this are left out; below 0 so "
                    "that honest non-IID updates about orthogonal to the median stay in")


class RootTrust(_Request):
    """FLTrust (Cao et al., NDSS 2021) against a small training set the operator gives the server: the server
    trains its own update on it, each update's weight is multiplied by its cosine similarity with that update
    (at most `min_cosine`: left out) and its norm is bounded by `max_norm_ratio` x the server update's norm."""

    root_sha256: str = Field(pattern=SHA256_PATTERN,
                             description="blob of an .npz with `x` (N,C,H,W in [0,1]) and `y`: the server's own "
                                         "training examples, kept apart from the evaluation set")
    min_cosine: float = Field(default=0.0, ge=0.0, lt=1.0,
                              description="updates whose cosine with the server's update is at most this are left out")
    max_norm_ratio: float = Field(default=1.0, gt=0.0, le=1000.0,
                                  description="each counted update is scaled down to at most this x the norm of "
                                              "the server's update")


class PublicationGate(_Request):
    """What a new version is compared with before it is published: never only its parent, else small drops
    add up one tolerance at a time (a ratchet)."""

    compare_with: Literal["best", "anchor", "parent"] = Field(
        default="best",
        description="best: the most accurate version the plan has published (its base included); anchor: the "
                    "model `anchor_model_id`; parent: the round's base model alone (allows a ratchet)")
    anchor_model_id: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN,
                                        description="the published model measured as the reference (anchor only)")

    @model_validator(mode="after")
    def _anchor_named(self) -> PublicationGate:
        if (self.compare_with == "anchor") != (self.anchor_model_id is not None):
            raise ValueError("anchor_model_id is required with compare_with 'anchor', and allowed only with it")
        return self


class QuarantinePolicy(_Request):
    """A device with `max_exclusions` updates left out among its last `window_updates` is quarantined: never
    selected again until an operator releases it (or revokes it for good). Exclusions by the norm bound and the
    direction screening count; root-set exclusions count when the update points away from the server's
    (`max_root_cosine`)."""

    max_exclusions: int = Field(default=3, ge=1, le=1000)
    window_updates: int = Field(default=5, ge=1, le=1000)
    max_root_cosine: float = Field(
        default=-0.05, ge=-1.0, le=1.0,
        description="a root-set exclusion counts only when its cosine is at most this: an update pointing away from "
                    "the server's, not an honest one about orthogonal to it (late in a plan honest cosines near 0)")

    @model_validator(mode="after")
    def _window_holds_the_exclusions(self) -> QuarantinePolicy:
        if self.max_exclusions > self.window_updates:
            raise ValueError(f"max_exclusions ({self.max_exclusions}) cannot exceed window_updates "
                             f"({self.window_updates})")
        return self


MAX_NEIGHBOURS = 200  # k = O(log n) (Bell et al.): 200 is far past any cohort's need, and bounds a reply


class SecureAggregationSettings(_Request):
    """SecAgg+ in every round of the plan (see docs/privacy.md, "Sizing k and t"). The cohort is the devices
    selected; k is capped at the largest even number below the cohort, t defaults to the devices' floor
    (k + c) // 2 + 1 for the c corrupt devices they withstand (`fedzoo.secagg.bounds`)."""

    neighbour_count: int = Field(default=60, ge=2, le=MAX_NEIGHBOURS,
                                 description="k: even; each device masks with k others")
    threshold: int | None = Field(default=None, ge=2, le=MAX_NEIGHBOURS,
                                  description="t: shares that recover a secret, k/2 < t <= k (default: the devices' "
                                              "floor (k + c) // 2 + 1 for c corrupt devices, docs/privacy.md)")
    levels: int = Field(default=127, ge=1, le=32_767,
                        description="quantised values lie in [-levels, levels]; 127 is the int8 encoding")
    survivor_fraction: float | None = Field(
        default=None, gt=0, le=1,
        description="raise each cohort's survivor floor to ceil(fraction x cohort): distributed DP calibrates each "
                    "device's noise at that floor, so a floor near the cohort adds less noise than a low one when "
                    "every device survives; a cohort that loses more than (1 - fraction) of its devices fails")
    clip_range: float = Field(default=0.05, gt=0, le=1e6,
                              description="each coordinate is clipped to +-clip_range (under DP: the clip norm)")
    stage_deadline_s: float = Field(default=30.0, gt=0, le=24 * 3600,
                                    description="each of the five stages closes this long after it opened "
                                                "(or when every device it waits for replied)")

    @model_validator(mode="after")
    def _threshold_above_half(self) -> SecureAggregationSettings:
        if self.neighbour_count % 2:
            raise ValueError(f"neighbour_count must be even, got {self.neighbour_count}")
        if self.threshold is not None and not self.neighbour_count / 2 < self.threshold <= self.neighbour_count:
            raise ValueError(f"threshold must lie in ({self.neighbour_count // 2}, {self.neighbour_count}]")
        return self


class AdaptiveClippingSettings(_Request):
    """Adaptive clipping (Andrew et al. 2021, `fedzoo.dp.noise.AdaptiveClipping`): each round moves the clip norm
    towards the `target_unclipped_quantile` of the update norms from a noised, centred count of the unclipped
    ones; the count's noise is part of the round's noise multiplier. Under SecAgg+ each device's bit is one more
    coordinate of its masked vector (the task's `privacy.unclipped_bit`); not with distributed noise."""

    target_unclipped_quantile: float = Field(default=0.5, gt=0, lt=1)
    clip_learning_rate: float = Field(default=0.2, gt=0, le=10)
    clipped_count_stddev: float | None = Field(
        default=None, gt=0, le=1e6,
        description="the count's noise; default max(target_clients / 20, z); must exceed z / 2")


class DpSettings(_Request):
    """DP-FedAvg: devices clip their delta to `clip_norm` (fixed, or adapted each round), the server adds discrete
    Gaussian noise to the sum and divides by `target_clients`; the plan stops before its epsilon would pass
    `max_epsilon`."""

    max_epsilon: float = Field(gt=0, le=1000, description="the plan's budget at `delta`")
    delta: float | None = Field(
        default=None, gt=0, lt=1,
        description="default: the line's, or for a new line min(1e-5, 1 / n^2) for a fleet of n devices; refused "
                    "above the server's FEDZOO_DP_MAX_DELTA")
    clip_norm: float = Field(gt=0, le=1e6, description="each device's delta is clipped to this L2 norm (adaptive: "
                                                       "the first round's)")
    adaptive: AdaptiveClippingSettings | None = None
    noise_multiplier: float | None = Field(
        default=None, gt=0, le=1000,
        description="z; default: the smallest whose num_rounds rounds spend max_epsilon at sampling_probability")
    sampling_probability: float = Field(
        default=1.0, gt=0, le=1,
        description="q: each device's first check-in for a round is seated with this probability, a secret coin "
                    "(random check-ins; 1: whoever checks in is seated, no amplification by sampling). Below 1 the "
                    "round seats every heads until its selection window ends, target_clients is the expected "
                    "cohort (q x eligible devices), and the accountant amplifies by q; not with secure_aggregation")
    mechanism: Literal["rdp", "pld"] = Field(default="rdp", description="the accountant (dp-accounting)")
    noise: Literal["central", "distributed"] = Field(
        default="central",
        description="who adds the noise: the server to the unmasked sum (central), or each device its share inside "
                    "the SecAgg+ ring, calibrated for the round's survivor floor (distributed: needs secure "
                    "aggregation; the server never sees a noiseless sum)")


class PrivacySettings(_Request):
    """Secure aggregation and/or differential privacy for every round of the plan (both off by default)."""

    secure_aggregation: SecureAggregationSettings | None = None
    dp: DpSettings | None = None


class ZooSettings(_Request):
    """A zoo-wide plan (docs/zoo-federated.md): every device trains the subnet its lookup picks under its budget,
    and the server improves the supernet and re-publishes every zoo model from it."""

    latency_budget_ms: float = Field(gt=0, le=1e6, description="the budget a device's lookup chooses its subnet under")
    latency_budget_ms_by_class: dict[str, float] = Field(
        default_factory=dict, description="budgets for some device classes (e.g. a tier of slow phones), overriding "
                                          "latency_budget_ms for them")
    calibration_sha256: str = Field(
        pattern=SHA256_PATTERN,
        description="blob of an .npz with `x` (N,C,H,W in [0,1]): the server's images that every re-extracted zoo "
                    "model's BatchNorm statistics are recalibrated on (never the evaluation set)")
    min_coverage: int = Field(default=1, ge=1, le=100_000,
                              description="a supernet element moves only when at least this many devices covered it")
    coverage_step_exponent: float = Field(
        default=1.0, ge=0, le=1,
        description="each released element's mean delta is scaled by max(1, covering devices / devices per subnet) "
                    "to this power before the strategy's step: 1 moves a weight that k subnets' cohorts trained about "
                    "as far as their k per-model steps together, 0 is the plain per-element mean")
    device_batch_norm: Literal["training", "inference"] = Field(
        default="training",
        description="how devices run their subnet's BatchNorm: 'training' normalises with each batch's statistics "
                    "and uploads running-statistics deltas; 'inference' sends statistics recalibrated on the "
                    "calibration images and keeps them fixed (only BN scale and bias train). Pick 'inference' for "
                    "non-IID devices with small shards, whose few-class batches make poor statistics")

    @field_validator("latency_budget_ms_by_class")
    @classmethod
    def _positive_budgets(cls, budgets: dict[str, float]) -> dict[str, float]:
        for device_class, budget in budgets.items():
            if not 0 < budget <= 1e6:
                raise ValueError(f"the budget of class {device_class!r} must lie in (0, 1e6] ms, got {budget}")
        return budgets


class RoundConfig(_Request):
    """What an admin asks for: the model to fine-tune, how clients train, how many and by when.

    Cross-field rule: `target_clients` must be at least `min_clients` (else 422)."""

    model_id: str = Field(pattern=IDENTIFIER_PATTERN, description="the published model the round starts from")
    min_clients: int = Field(ge=1, le=100_000, description="fewer accepted updates by the deadline fail the round")
    target_clients: int = Field(
        ge=1, le=100_000,
        description="the round aggregates as soon as this many arrive; in a sampled DP plan "
                    "(privacy.dp.sampling_probability < 1) the expected cohort, q x eligible devices, and "
                    "DP-FedAvg's denominator")
    over_selection: float = Field(default=0.3, ge=0.0, le=4.0,
                                  description="select target x (1 + this) devices, as stragglers drop out")
    deadline_s: float = Field(gt=0, le=7 * 24 * 3600, description="seconds from the round's start to its deadline")
    num_rounds: int = Field(default=1, ge=1, le=10_000, description="rounds to run, each from the previous result")
    local_epochs: int = Field(default=1, ge=1, le=100)
    batch_size: int = Field(default=32, ge=1, le=4096)
    learning_rate: float = Field(default=0.05, gt=0, le=10)
    learning_rate_decay: float = Field(
        default=1.0, gt=0, le=1,
        description="round n of the plan trains at learning_rate x this^(n-1): on label-skewed devices FedAvg at a "
                    "fixed rate stalls short of the optimum (Li et al. 2020, On the Convergence of FedAvg on Non-IID Data)")
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(default=0.0, ge=0, lt=1)
    strategy: dict[str, Any] = Field(default_factory=lambda: {"name": "fedavg"},
                                     description='e.g. {"name": "trimmed_mean", "trim_fraction": 0.2}')
    evaluation_sha256: str = Field(
        pattern=SHA256_PATTERN,
        description="blob of an .npz with held-out `x` (N,C,H,W in [0,1]) and `y`: the server measures the base "
                    "model and each aggregate on it; a new version's published metrics are these, never the "
                    "devices' own figures")
    max_accuracy_drop: float = Field(
        default=DEFAULT_MAX_ACCURACY_DROP, ge=0.0, le=1.0,
        description="publish the aggregate only if its accuracy on the evaluation set is at least the gate's "
                    "reference (by default the plan's best version) minus this; otherwise the round fails and the "
                    "next one starts again from the parent")
    max_examples_per_update: int | None = Field(
        default=None, ge=1, le=MAX_NUM_EXAMPLES,
        description="an update's FedAvg weight is min(num_examples, this); default: the server's "
                    "FEDZOO_FL_MAX_EXAMPLES_PER_UPDATE (the most examples one device holds for a task)")
    norm_bound: NormBound = Field(default_factory=lambda: NormBound(),
                                  description="how updates with an outlying L2 norm are treated at aggregation")
    weight_bound: WeightBound = Field(default_factory=lambda: WeightBound(),
                                      description="an update's weight relative to the round's (robust rounds)")
    direction_screening: DirectionScreening | None = Field(
        default_factory=lambda: DirectionScreening(),
        description="leave out updates pointing away from the round's median delta (null: never)")
    root_trust: RootTrust | None = Field(default=None, description="score each update against the server's own "
                                                                   "update on an operator-given root set (FLTrust)")
    gate: PublicationGate = Field(default_factory=lambda: PublicationGate(),
                                  description="the reference a new version's accuracy is compared with")
    quarantine: QuarantinePolicy | None = Field(default_factory=lambda: QuarantinePolicy(),
                                                description="stop selecting devices whose updates keep being left "
                                                            "out (null: never quarantine)")
    selection_window_s: float | None = Field(
        default=None, gt=0, le=7 * 24 * 3600,
        description="sampled DP plans (privacy.dp.sampling_probability < 1): seconds from the round's start in which "
                    "devices check in and draw their coin; default: half of deadline_s. Selection closes earlier "
                    "once every registered, unrevoked, unquarantined device drew")
    poll_interval_s: float = Field(default=5.0, gt=0, le=3600, description="pace steering: how soon devices ask again")
    privacy: PrivacySettings = Field(default_factory=lambda: PrivacySettings(),
                                     description="SecAgg+ and DP-FedAvg (docs/privacy.md); only FedAvg, FedProx and "
                                                 "FedAdam run under either")
    zoo: ZooSettings | None = Field(default=None, description="set for a zoo-wide plan (POST /v1/fl/zoo-rounds), "
                                                              "whose model_id names the zoo's supernet card")

    @model_validator(mode="after")
    def _target_at_least_minimum(self) -> RoundConfig:
        if self.target_clients < self.min_clients:
            raise ValueError(f"target_clients ({self.target_clients}) must be at least min_clients ({self.min_clients})")
        return self


class TaskQuery(_Request):
    """A device checking in: what it can work on, and what it can do (fedzoo.capabilities; a device that declares
    nothing is selected for plain rounds only)."""

    task: str = Field(pattern=IDENTIFIER_PATTERN, description="the task the device has data for, e.g. mnist")
    family: str | None = Field(default=None, min_length=1, max_length=200,
                               description="only rounds of this model family")
    secure_aggregation: int | None = Field(default=None, ge=1, le=1000,
                                           description="the SecAgg+ protocol version the device speaks")
    dp_clipping: bool = Field(default=False, description="the device clips its delta to a DP round's clip norm")
    unclipped_bit: bool = Field(default=False, description="under SecAgg+ the device appends its unclipped bit to its "
                                                           "masked vector (adaptive clipping)")
    encodings: str | None = Field(default=None, pattern=ENCODINGS_PATTERN,
                                  description="the update encodings the device can upload, comma-separated: fp32,int8")

    def capabilities(self) -> Capabilities:
        return Capabilities(self.secure_aggregation, self.dp_clipping,
                            parse_encodings(self.encodings) if self.encodings is not None else None,
                            self.unclipped_bit)


class TrainingConfig(_Response):
    local_epochs: int
    batch_size: int
    learning_rate: float
    optimizer: str
    momentum: float
    proximal_mu: float = Field(default=0.0, description="FedProx: add mu * (w - w_global) to every gradient")


def round_training(config: RoundConfig, round_number: int, strategy_fields: dict[str, Any]) -> TrainingConfig:
    """How devices (and the server, on its root set) train in round `round_number` of the plan."""
    return TrainingConfig(local_epochs=config.local_epochs, batch_size=config.batch_size,
                          learning_rate=config.learning_rate * config.learning_rate_decay ** (round_number - 1),
                          optimizer=config.optimizer, momentum=config.momentum, **strategy_fields)


class UploadSpec(_Response):
    url: str
    encodings: list[str] = Field(description="fp32 or int8 (see fedzoo.update_codec)")
    max_bytes: int


SecureStageName = Literal["selection", "advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask",
                          "done"]


class SecureAggregationTask(_Response):
    """Where a SecAgg+ round stands for this device: the stage, and the stage's request for it when it owes a
    reply (null while it waits for the others: ask again after `retry_after_s`)."""

    stage: SecureStageName
    version: int = Field(default=SECURE_AGGREGATION_VERSION, description="the SecAgg+ protocol version of the round (fedzoo.capabilities); a device that "
                                     "speaks another declines the round")
    client: int | None = Field(description="this device's number in the round (fixed when selection closes)")
    config: dict[str, Any] | None = Field(description="the round's SecAggConfig (fedzoo.secagg.config)")
    request: dict[str, Any] | None = Field(description="the stage's request for this device (docs/privacy.md)")
    reply_url: str | None = Field(description="POST the reply here; masked_input as application/octet-stream")
    stage_deadline_at: datetime | None
    retry_after_s: float = Field(description="when to ask again for the next stage")
    sit_out_reason: str | None = Field(
        default=None, description="why this seated device is in no cohort (its subnet's group is below SecAgg+'s "
                                  "least cohort of 3): it sits the round out")


class TaskPrivacy(_Response):
    clip_norm: float | None = Field(description="DP: clip the delta to this L2 norm before anything leaves the device")
    equal_weights: bool = Field(description="every update counts the same (DP); else examples, capped by the round")
    max_examples: int = Field(description="the cap on a device's example count in its weight")
    secure_aggregation: SecureAggregationTask | None = None
    distributed_noise: dict[str, Any] | None = Field(
        default=None, description="distributed DP: {mechanism, noise_multiplier, survivors}, the noise the device adds "
                                  "to its ring input (fedzoo.dp.distributed), once the round's SecAgg+ config is fixed")
    unclipped_bit: bool = Field(
        default=False, description="adaptive clipping under SecAgg+: append 1 if the delta was within clip_norm before "
                                   "clipping, else 0, as one more coordinate of the vector masked (in clip_range units; "
                                   "the round's config counts it in vector_length)")


class Task(_Response):
    """Work for one device: download the model and training graph, train, upload the delta by the deadline."""

    round_id: int
    round_number: int
    model_id: str
    base_version: int
    model_sha256: str
    model_url: str
    training_graph_sha256: str
    training_graph_url: str
    deadline_at: datetime
    training: TrainingConfig
    upload: UploadSpec
    privacy: TaskPrivacy | None = Field(default=None, description="set when the round runs SecAgg+ or DP-FedAvg")


class TaskResponse(_Response):
    task: Task | None
    retry_after_s: float | None = Field(description="pace steering: when to ask again (no task) or null")
    reason: str | None = None


class UpdateMetadata(_Request):
    """The JSON part `metadata` of an update upload (the other part, `delta`, is the .npz)."""

    base_version: int = Field(ge=1, description="the version the delta was computed against")
    num_examples: int = Field(ge=1, le=MAX_NUM_EXAMPLES, strict=True,
                              description="a JSON integer; its FedAvg weight is capped by the round's "
                                          "max_examples_per_update")
    metrics: dict[str, float] = Field(default_factory=dict, max_length=16,
                                      description="the client's own figures, e.g. loss, accuracy on local data: "
                                                  "stored and shown as client_reported_metrics, never published "
                                                  "as the model's accuracy nor used for ranking")


class UpdateReceipt(_Response):
    round_id: int
    device_id: str
    accepted_updates: int
    counted_examples: int = Field(description="the weight the update gets: num_examples, capped by the round")
    upload_bytes: int
    encoding: str
    round_state: RoundStateName


class RoundView(_Response):
    id: int
    number: int
    rounds_remaining: int
    state: RoundStateName
    task: str
    family: str
    base_model_id: str
    base_version: int
    config: dict[str, Any]
    created_at: datetime
    deadline_at: datetime
    finished_at: datetime | None
    selected_devices: int | None = Field(description="null under DP (membership-dependent: docs/privacy.md)")
    accepted_updates: int | None
    upload_bytes: int | None
    result_model_id: str | None
    outcome: dict[str, Any] | None
    next_round_id: int | None
    publication: dict[str, Any] | None = Field(
        default=None, description="a zoo-wide round's background publication: stage (queued, aggregating, "
                                  "re-extracting, publishing, published or refused), zoo models done of the total, "
                                  "started_at, and at the end finished_at and seconds; null for other rounds")
    declined_devices: int | None = Field(description="selected devices that declined the task (POST .../decline)")
    sat_out_devices: dict[str, int] | None = Field(
        default=None, description="a zoo-wide SecAgg+ round: seated devices told to sit out because fewer than 3 "
                                  "trained their subnet, by the subnet's training card ({} for other rounds); null "
                                  "under DP")
    counts_withheld: str | None = Field(default=None, description="under DP: why the counts are null")


class DeclineRequest(_Request):
    """A selected device says it will not do the round's task, and why (a task it cannot do, or a server
    that broke the protocol)."""

    reason: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$",
                        description="e.g. unsupported_secure_aggregation, unsupported_dp_clipping, overlapping_lists")
    message: str = Field(default="", max_length=500, description="details for the operator")


class DeclineReceipt(_Response):
    round_id: int
    reason: str


BASE64_32_BYTES = r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$"  # an X25519 key or a SHA-256 commitment
BASE64_33_BYTES = r"^[A-Za-z0-9+/]{44}$"  # a Shamir share value
BASE64_16_BYTES = r"^[A-Za-z0-9+/]{21}[AQgw]==$"  # a share commitment
BASE64_64_BYTES = r"^[A-Za-z0-9+/]{85}[AQgw]==$"  # an Ed25519 signature
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class AdvertiseKeysReply(_Request):
    """Stage 1: the device's two fresh X25519 public keys and a fresh nonce (base64 of 32 bytes each), signed with
    its registered key; the nonces of every device fix the round's graph (fedzoo.secagg.graph)."""

    cipher_public_key: str = Field(pattern=BASE64_32_BYTES)
    mask_public_key: str = Field(pattern=BASE64_32_BYTES)
    nonce: str = Field(pattern=BASE64_32_BYTES)
    signature: str = Field(pattern=BASE64_64_BYTES, description="Ed25519 over fedzoo.secagg.signatures."
                                                                "advertise_payload (docs/privacy.md)")


class ConsistencyCheckReply(_Request):
    """Stage 4: the device's signature on the survivor set it was sent."""

    signature: str = Field(pattern=BASE64_64_BYTES, description="Ed25519 over fedzoo.secagg.signatures."
                                                                "consistency_payload (docs/privacy.md)")


class DealtShare(_Request):
    holder: int = Field(ge=0, lt=65_536)
    ciphertext: str = Field(min_length=4, max_length=340, pattern=BASE64,
                            description="base64 of nonce || ChaCha20-Poly1305 (at most 255 bytes)")
    self_mask_commitment: str = Field(pattern=BASE64_16_BYTES)
    mask_key_commitment: str = Field(pattern=BASE64_16_BYTES)


class ShareKeysReply(_Request):
    """Stage 2: one encrypted share pair per neighbour, with commitments."""

    shares: list[DealtShare] = Field(max_length=MAX_NEIGHBOURS)
    self_mask_seed_commitment: str = Field(pattern=BASE64_32_BYTES)


class RevealedShare(_Request):
    owner: int = Field(ge=0, lt=65_536)
    kind: Literal["self_mask", "mask_key"]
    value: str = Field(pattern=BASE64_33_BYTES, description="base64 of the 33-byte share value")


class UnmaskReply(_Request):
    """Stage 4: for each neighbour, the share of its self-mask seed (survived) or its mask key (dropped)."""

    shares: list[RevealedShare] = Field(max_length=MAX_NEIGHBOURS)
    undecryptable: list[Annotated[int, Field(ge=0, lt=65_536)]] = Field(default_factory=list,
                                                                        max_length=MAX_NEIGHBOURS)


class SecureReplyReceipt(_Response):
    round_id: int
    stage: SecureStageName
    client: int
    received: int = Field(description="replies this stage has so far")
    expected: int = Field(description="replies the stage waits for before it closes early")
    current_stage: SecureStageName | None = Field(description="the round's stage now (the reply may have closed one)")
    round_state: RoundStateName
