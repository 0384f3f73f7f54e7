"""The in-process engine: a plan of federated rounds with virtual devices as work items and the aggregation core
(`fedzoo.aggregation`) aggregating, without the server's HTTP, database or blob store.

`fedzoo fl simulate` has three engines over one aggregation core:

- `server` (`fedzoo.cloud.simulation.Simulation`): every device registers, checks in, downloads and uploads through
  the SDK against the real server; the system under test, and the engine for testing it;
- `inprocess` (`InProcessEngine`): the same plan, selection order, seeds, local training
  (`fedzoo.edge.local_training.train_locally`, what the SDK runs), screening, strategy, running statistics and accuracy
  gate, called directly: a researcher's sweep over strategies and fleet sizes;
- `ray`: the in-process engine with the devices' training fanned out as Ray tasks (`fedzoo.cloud.executors`).

Both engines give the same published weights for one plan on the same shards and seeds (to float tolerance:
tests/cloud/test_engines.py). What the in-process engine leaves out is what only a server has: authentication,
quarantine across rounds (each round's screening still runs), FLTrust's root set, zoo-wide plans and the REST
SecAgg+ stages; a plan asking for them is refused naming the field.

Private rounds (`run_private_rounds`: SecAgg+ through `fedzoo.secagg`'s in-process round, DP-FedAvg with fixed or
adaptive clipping) aggregate with the core's `DifferentialPrivacy` and `ServerMomentum`, the layers the server's
private rounds use. Their noise is seeded, so reproducible: they log that nothing they produce is private and their
records carry the mechanism's epsilon, never a claim about a published model.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedzoo.aggregation.direction import delta_norm
from fedzoo.aggregation.private import DifferentialPrivacy, ServerMomentum, check_secure_sum, with_unclipped_bit
from fedzoo.aggregation.robust import screen_round_updates
from fedzoo.aggregation.running_statistics import aggregate_statistics
from fedzoo.aggregation.strategies import (ClientUpdate, Parameters, Strategy, make_strategy,
                                           require_secure_aggregation_support)
from fedzoo.cards import ModelCard
from fedzoo.cloud.executors import Executor, make_executor
from fedzoo.cloud.simulation import Federation, RoundRecord, accuracy_of
from fedzoo.dp.accountant import PrivacyBudgetExhausted, PrivacyLedger, noise_multiplier_for
from fedzoo.dp.clipping import clip_delta
from fedzoo.dp.noise import AdaptiveClipping, DpFedAvg
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.edge.trainer import training_graph_state, variance_names, write_parameters
from fedzoo.errors import InvalidInputError
from fedzoo.edge.local_training import LocalData, normalise, train_locally
from fedzoo.secagg import RoundAborted, dequantise_sum, example_weight, flatten, quantise, run_local_round, unflatten
from fedzoo.secagg.bounds import cohort_config
from fedzoo.update_codec import split_statistics

if TYPE_CHECKING:
    from fedzoo.server.fl.schemas import RoundConfig

log = logging.getLogger(__name__)

ENGINES = ("server", "inprocess", "ray")
UNSUPPORTED = {"root_trust": "FLTrust needs the server's root set", "zoo": "zoo-wide plans run on the server engine",
               "privacy": "private plans run through run_private_rounds (SecAgg+ and DP in process)"}


# the devices ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceContext:
    """What every virtual device shares, shipped to an executor's workers once: the model, its training graph,
    the card, the data pool and the shards (indices into the pool, one per device)."""

    model: bytes
    training_graph: bytes
    card: ModelCard
    pool_x: np.ndarray
    pool_y: np.ndarray
    shards: list[np.ndarray]

    @classmethod
    def of(cls, federation: Federation) -> DeviceContext:
        return cls(federation.model, federation.training_graph, federation.card, federation.pool.x, federation.pool.y,
                   federation.shards)


@dataclass(frozen=True)
class FitInstructions:
    """One selected device's work for a round: train the round's `model` (ONNX bytes, written once per round as
    the server publishes one model a round) with `training`, seeded; clip to `clip_norm` on the device under DP."""

    device_index: int
    seed: int
    model: bytes
    training: dict[str, Any]
    clip_norm: float | None = None


@dataclass(frozen=True)
class FitResult:
    """What a device sends back: its delta (running statistics under `running.` names), the examples it trained
    on, its own metrics, whether its delta was within the DP bound before clipping, and its training seconds."""

    delta: Parameters
    num_examples: int
    metrics: dict[str, float]
    within: bool
    train_seconds: float


def fit_device(context: DeviceContext, work: FitInstructions) -> FitResult:
    """One virtual device's local training on its shard, with the SDK's training code (a top-level function, so
    that worker processes and Ray tasks can run it)."""
    shard = context.shards[work.device_index]
    started = time.perf_counter()
    delta, metrics = train_locally(context.training_graph, work.model, context.card, work.training,
                                   LocalData(context.pool_x[shard], context.pool_y[shard]), work.seed)
    train_seconds = time.perf_counter() - started
    within = True
    if work.clip_norm is not None:
        delta, within = clip_delta(split_statistics(delta)[0], work.clip_norm)
    return FitResult(delta, len(shard), metrics, within, train_seconds)


def _finite(result: FitResult) -> bool:
    """Whether the server would accept the update (it refuses NaN or infinite deltas and metrics with 422)."""
    return (all(bool(np.all(np.isfinite(value))) for value in result.delta.values())
            and all(map(math.isfinite, result.metrics.values())))


# the engine -----------------------------------------------------------------------------------------------


class InProcessEngine:
    """Runs a plan (the round configuration `POST /v1/fl/rounds` takes, validated by the same schema) over the
    federation's devices in this process, or with their training on `executor` ("processes", "ray").

    Selection follows the server engine's: each round shuffles the devices with the engine's `random.Random(seed)`,
    seats the first `target_clients x (1 + over_selection)` and gives each a training seed in that order; the first
    `target_clients` finite updates are accepted, as the server accepts the first uploads. Aggregation is the
    core's: norm bound, weight bound, direction screening, the strategy, running statistics; the aggregate is
    measured on the test split and published only past the plan's accuracy gate."""

    def __init__(self, federation: Federation, executor: str = "in-process", workers: int | None = None,
                 seed: int = 0, max_examples_per_update: int | None = None,
                 spill_dir: Path | None = None) -> None:
        self.federation = federation
        self.executor: Executor = make_executor(executor, workers)
        self.rng = random.Random(seed)
        # a plan without its own cap gets the server's default (FEDZOO_FL_MAX_EXAMPLES_PER_UPDATE)
        from fedzoo.server.config import DEFAULT_FL_MAX_EXAMPLES_PER_UPDATE  # a constant: no server is started

        self.max_examples_per_update = max_examples_per_update or DEFAULT_FL_MAX_EXAMPLES_PER_UPDATE
        self.spill_dir = spill_dir
        self.context = DeviceContext.of(federation)
        parameter_names, statistic_names = training_graph_state(federation.training_graph)
        initializers = read_float_initializers(federation.model)
        self.parameters: Parameters = {name: initializers[name] for name in parameter_names}
        self.statistics: Parameters = {name: initializers[name] for name in statistic_names}
        self.variances = frozenset(variance_names(federation.model)) if statistic_names else frozenset()
        test = federation.split.test
        self._evaluation = (normalise(test.x, federation.card.input.normalisation), test.y)

    def close(self) -> None:
        self.executor.close()

    def __enter__(self) -> InProcessEngine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def model(self) -> bytes:
        """The latest published model (the base model before any round published)."""
        return write_parameters(self.federation.model, {**self.parameters, **self.statistics})

    def accuracy(self, parameters: Parameters, statistics: Parameters) -> float:
        return accuracy_of(write_parameters(self.federation.model, {**parameters, **statistics}), *self._evaluation)

    def run(self, round_config: dict[str, Any], progress=None) -> list[RoundRecord]:
        """Run a whole plan; returns one record per round, as the server engine's `Simulation.run` does."""
        from fedzoo.server.fl.schemas import RoundConfig, round_training  # the plan's schema, no server

        card = self.federation.card
        config = RoundConfig.model_validate({"model_id": card.id, "evaluation_sha256": "0" * 64, **round_config})
        for name, reason in UNSUPPORTED.items():
            value = getattr(config, name)
            if value is not None and (name != "privacy" or value.secure_aggregation or value.dp):
                raise InvalidInputError(f"the in-process engine does not run {name}: {reason}", field=name)
        if config.gate.compare_with == "anchor":
            raise InvalidInputError("the in-process engine gates against the plan's best version or the parent",
                                    field="gate.compare_with")
        cap = config.max_examples_per_update or self.max_examples_per_update
        best = current = self.accuracy(self.parameters, self.statistics)
        state: Parameters = {}
        records = []
        for number in range(1, config.num_rounds + 1):
            started = time.perf_counter()
            order = list(range(len(self.federation.shards)))
            self.rng.shuffle(order)
            seated = order[:math.ceil(config.target_clients * (1 + config.over_selection))]
            strategy = make_strategy(config.strategy, self.spill_dir)
            if state:
                strategy.load_state(state)
            training = round_training(config, number, strategy.configure_fit(number)).model_dump(mode="json")
            model = self.model
            work = [FitInstructions(index, self.rng.randrange(2**31), model, training) for index in seated]
            results = self.executor.map(fit_device, self.context, work)
            worked = time.perf_counter()
            accepted = [(index, result) for index, result in zip(seated, results) if _finite(result)]
            accepted = accepted[:config.target_clients]
            outcome = self._aggregate(config, strategy, accepted, cap)
            state_text, accuracy = "failed", None
            if isinstance(outcome, str):
                summary = {"failure": outcome}
            else:
                parameters, statistics, summary = outcome
                accuracy = self.accuracy(parameters, statistics)
                reference = best if config.gate.compare_with == "best" else current
                summary["publication"] = {"published": accuracy + 1e-12 >= reference - config.max_accuracy_drop,
                                          "reference_accuracy": reference}
                if summary["publication"]["published"]:
                    state_text, current = "closed", accuracy
                    best = max(best, accuracy)
                    self.parameters, self.statistics = parameters, statistics or self.statistics
                    state = strategy.state() or state
            record = RoundRecord(number, number, state_text, len(accepted),
                                 sum(value.nbytes for _, result in accepted for value in result.delta.values()),
                                 accuracy if state_text == "closed" else None, None, len(results) - len(accepted),
                                 summary, len(results), time.perf_counter() - started,
                                 sum(result.train_seconds for result in results), 0.0, worked - started)
            records.append(record)
            if progress is not None:
                progress(record)
        return records

    def _aggregate(self, config: RoundConfig, strategy: Strategy, accepted: list[tuple[int, FitResult]],
                   cap: int) -> tuple[Parameters, Parameters, dict[str, Any]] | str:
        """The round's aggregate (parameters, statistics) and what its outcome says, or why the round failed."""
        if len(accepted) < config.min_clients:
            return f"{len(accepted)} finite updates, fewer than min_clients={config.min_clients}"
        split = {index: split_statistics(result.delta) for index, result in accepted}
        updates = [ClientUpdate(str(index), min(result.num_examples, cap),
                                lambda delta=split[index][0]: delta, delta_norm(split[index][0]), result.metrics)
                   for index, result in accepted]
        robust = screen_round_updates(updates, config.norm_bound, config.weight_bound, config.direction_screening,
                                      self.spill_dir)
        if len(robust.kept) < config.min_clients:  # the server's rule: the round's minimum counts screened updates
            return (f"only {len(robust.kept)} of {len(accepted)} updates passed screening; the round needs "
                    f"{config.min_clients}")
        parameters = strategy.aggregate_fit(self.parameters, robust.kept)
        if not all(np.all(np.isfinite(value)) for value in parameters.values()):
            return f"the {strategy.name} aggregate holds NaN or infinite weights"
        statistics: Parameters = {}
        summary: dict[str, Any] = {"aggregated_updates": len(robust.kept), "screening": {
            "norm_limit": robust.norm_limit,
            **{outcome: sum(d.outcome == outcome for d in robust.decisions) for outcome in ("counted", "clipped",
                                                                                            "rejected")}}}
        if self.statistics:
            statistics, summary["running_statistics"] = aggregate_statistics(
                self.statistics, robust.kept, lambda update: split[int(update.device_id)][1], config.norm_bound,
                self.variances)
        if robust.direction is not None:
            summary["direction_screening"] = robust.direction
        return parameters, statistics, summary


def make_engine(name: str, federation: Federation, workers: int | None = None, seed: int = 0) -> InProcessEngine:
    """The in-process engine on this machine's CPU (`inprocess`) or with device training on Ray (`ray`)."""
    if name not in ("inprocess", "ray"):
        raise InvalidInputError(f"unknown in-process engine {name!r}; use inprocess or ray", field="engine")
    return InProcessEngine(federation, "ray" if name == "ray" else "in-process", workers, seed)


# private rounds -------------------------------------------------------------------------------------------
#
# DP needs hundreds of devices to be meaningful; these rounds select, train and aggregate as the server's private
# rounds do (fedzoo.server.fl.secure_rounds), through the same core layers.


@dataclass(frozen=True)
class SecureAggregationOptions:
    """SecAgg+ in every round, each cohort's parameters by the server's rule (`fedzoo.secagg.bounds.cohort_config`):
    k = min(neighbour_count, m - 1 made even) for a cohort of m, t as set (devices refuse one below their floor),
    else their floor (k + c) // 2 + 1; `dropout_after_key_sharing` of the cohort vanish before sending their
    masked input (the costliest moment to drop). Without DP, each coordinate is clipped to +-clip_range and
    weights are examples capped at max_examples."""

    neighbour_count: int = 60
    threshold: int | None = None
    levels: int = 127
    clip_range: float = 0.05
    max_examples: int = 100
    dropout_after_key_sharing: float = 0.0


SEEDED_NOISE_NOTICE = ("the simulator's DP noise is reproducible (drawn from seed %s): its epsilon figures describe "
                       "the mechanism, and nothing it produces is private or carries an epsilon; the server draws "
                       "its noise from os.urandom")


@dataclass(frozen=True)
class DpOptions:
    """DP-FedAvg over the plan: devices clip to clip_norm, the server adds noise and counts epsilon at delta.
    Without a noise_multiplier, the one whose planned rounds spend exactly max_epsilon is used."""

    max_epsilon: float
    delta: float = 1e-5
    clip_norm: float = 0.5
    noise_multiplier: float | None = None
    adaptive: AdaptiveClipping | None = None
    mechanism: str = "rdp"


@dataclass
class PrivateRoundRecord:
    number: int
    participants: int
    survivors: int
    accuracy: float
    epsilon: float | None  # the mechanism's epsilon after this round (DP only); seeded noise: no privacy claim
    clip_norm: float | None
    round_seconds: float
    aggregation_seconds: float  # SecAgg+: the whole protocol; else the sum
    upload_bytes_per_client: float | None  # SecAgg+: mean JSON bytes a survivor sent over the five stages
    aborted: bool = False  # SecAgg+ could not unmask: the model stays, no privacy is spent


def run_private_rounds(
    federation: Federation, rounds: int, clients_per_round: int, training: dict[str, Any],
    strategy: dict[str, Any] | None = None, secure_aggregation: SecureAggregationOptions | None = None,
    dp: DpOptions | None = None, executor: str = "processes", num_workers: int | None = None, seed: int = 0,
    progress=None, server_momentum: float = 0.0, equal_weights: bool = False, evaluate_on: str = "test",
) -> list[PrivateRoundRecord]:
    """Federated rounds over the federation's devices with SecAgg+ and/or DP-FedAvg (or neither: the
    baseline); returns one record per round run. A DP plan stops early when its budget would be exceeded.

    Selection: with DP every device joins a round independently with probability clients_per_round / N
    (Poisson sampling, what the accountant assumes); without, clients_per_round devices at random.
    `server_momentum` > 0 makes FedAvg FedAvgM (DP-FedAvgM under DP: McMahan et al. 2018); `equal_weights`
    gives the non-private baseline DP's equal weighting; `evaluate_on="validation"` measures each round on
    the validation split, the one to choose settings on (the test split reports them)."""
    device_count = len(federation.shards)
    if not 3 <= clients_per_round <= device_count:
        raise InvalidInputError(f"clients_per_round must lie in [3, {device_count}], got {clients_per_round}",
                                field="clients_per_round")
    if rounds < 1:
        raise InvalidInputError(f"rounds must be at least 1, got {rounds}", field="rounds")
    aggregator = make_strategy(strategy or {"name": "fedavg"})
    if secure_aggregation is not None or dp is not None:
        require_secure_aggregation_support(aggregator)  # DP, too, needs only the equal-weighted sum
    step: Strategy = ServerMomentum(aggregator, server_momentum) if server_momentum else aggregator
    if evaluate_on not in ("test", "validation"):
        raise InvalidInputError(f"evaluate_on must be 'test' or 'validation', got {evaluate_on!r}", field="evaluate_on")
    rng = np.random.default_rng(seed)  # cohorts and training seeds: the same whatever the privacy options
    protocol_rng = np.random.default_rng([seed, 1])  # quantisation and dropouts
    private = None
    if dp is not None:
        sampling_probability = clients_per_round / device_count
        noise_multiplier = dp.noise_multiplier or noise_multiplier_for(dp.max_epsilon, dp.delta, rounds,
                                                                       sampling_probability, dp.mechanism)
        ledger = PrivacyLedger(noise_multiplier, sampling_probability, dp.delta, dp.max_epsilon, dp.mechanism)
        private = DifferentialPrivacy(step, DpFedAvg(ledger, clients_per_round, dp.clip_norm, dp.adaptive,
                                                     seed=int(protocol_rng.integers(2**63))))
        log.warning(SEEDED_NOISE_NOTICE, seed)
    parameters = read_float_initializers(federation.model)
    shapes = {name: value.shape for name, value in parameters.items()}
    vector_length = sum(value.size for value in parameters.values())
    evaluation = getattr(federation.split, evaluate_on)
    evaluation_features = normalise(evaluation.x, federation.card.input.normalisation)
    context = DeviceContext.of(federation)
    workers = make_executor(executor, num_workers)
    records: list[PrivateRoundRecord] = []
    try:
        for number in range(1, rounds + 1):
            started = time.perf_counter()
            if private is not None:
                try:
                    private.mechanism.check_budget()
                except PrivacyBudgetExhausted:
                    break
                cohort = np.flatnonzero(rng.random(device_count) < private.mechanism.ledger.sampling_probability)
            else:
                cohort = rng.choice(device_count, clients_per_round, replace=False)
            if secure_aggregation is not None and len(cohort) < 3:
                continue  # SecAgg+ needs 3 clients; a Poisson draw this small is negligible at useful sizes
            clip_norm = private.clip_norm if private is not None else None
            round_training = {**training, **aggregator.configure_fit(number)}
            model = write_parameters(federation.model, parameters)
            work = [FitInstructions(int(index), int(rng.integers(2**31)), model, round_training, clip_norm)
                    for index in cohort]
            results = workers.map(fit_device, context, work)
            aggregation_started = time.perf_counter()
            upload_bytes = None
            survivors = len(results)
            if secure_aggregation is not None:
                clip_range = clip_norm if clip_norm is not None else secure_aggregation.clip_range
                # adaptive clipping: the last coordinate carries the device's "not clipped" bit, as on the server
                unclipped_bit = private is not None and private.mechanism.adaptive is not None
                config = cohort_config(f"sim-{seed}-{number}", len(results), vector_length + unclipped_bit, clip_range,
                                       secure_aggregation.levels, secure_aggregation.neighbour_count,
                                       secure_aggregation.threshold)
                inputs = {}
                for index, result in enumerate(results):
                    vector = flatten(result.delta)
                    if private is not None:
                        weight = 1.0  # equal weights
                        if unclipped_bit:
                            vector = with_unclipped_bit(vector, result.within, clip_range)
                    else:
                        weight = example_weight(result.num_examples, secure_aggregation.max_examples)
                    inputs[index] = quantise(vector, config, weight, protocol_rng)
                dropping = set(protocol_rng.choice(len(results), int(secure_aggregation.dropout_after_key_sharing
                                                                     * len(results)), replace=False).tolist())
                try:
                    local = run_local_round(config, inputs, {"masked_input": dropping})
                except RoundAborted:
                    records.append(PrivateRoundRecord(
                        number, len(results), 0, records[-1].accuracy if records else federation.card.metrics.accuracy,
                        private.mechanism.ledger.epsilon_spent if private is not None else None, clip_norm,
                        time.perf_counter() - started, time.perf_counter() - aggregation_started, None, aborted=True))
                    continue
                weighted_sum, total_weight = dequantise_sum(local.result.ring_sum, config)
                survivors = len(local.result.survivors)
                upload_bytes = float(np.mean([sum(local.upload_bytes[c].values()) for c in local.result.survivors]))
                check_secure_sum(weighted_sum, total_weight, survivors, clip_range, private is not None,
                                 unclipped_bit=unclipped_bit)
                if private is not None:
                    parameters = private.apply_noised_secure_sum(parameters, weighted_sum, survivors, clip_range,
                                                                 config.levels)
                else:
                    parameters = step.apply_mean_delta(parameters, unflatten(weighted_sum / total_weight, shapes))
            elif private is not None:
                clipped_sum = sum((flatten(result.delta) for result in results), np.zeros(vector_length))
                parameters = private.apply_noised_sum(parameters, clipped_sum,
                                                      sum(bool(result.within) for result in results), survivors)
            else:
                updates = [ClientUpdate(f"device-{index}", 1 if equal_weights else result.num_examples,
                                        lambda delta=result.delta: delta, 0.0)
                           for index, result in zip(cohort, results)]
                parameters = step.aggregate_fit(parameters, updates)
            aggregation_seconds = time.perf_counter() - aggregation_started
            accuracy = accuracy_of(write_parameters(federation.model, parameters), evaluation_features, evaluation.y)
            record = PrivateRoundRecord(
                number, len(results), survivors, accuracy,
                private.mechanism.ledger.epsilon_spent if private is not None else None, clip_norm,
                time.perf_counter() - started, aggregation_seconds, upload_bytes)
            records.append(record)
            if progress is not None:
                progress(record)
    finally:
        workers.close()
    return records

