"""Zoo-wide plans (docs/zoo-federated.md): every selected device trains the subnet of the zoo model its
lookup picks under its budget, and the server improves the one supernet all zoo models share.

- **selection**: the device's lookup (the plan's budget, or its class's) picks a zoo model; the device
  trains that model's arch, extracted from the round's supernet as a signed training card (`<task>.subnet`,
  never served by lookup: its BatchNorm is kept so the delta names the subnet's own tensors). Its graph runs
  BatchNorm as `zoo.device_batch_norm` says: in training mode (the delta carries the running statistics) or in
  inference mode (statistics recalibrated on the calibration images, fixed on the device). Devices and SDKs are
  unchanged: it is a round like any other to them.
- **screening** per subnet: the norm bound's median is taken over the devices that trained the same subnet.
- **aggregation** per element (`fedzoo.aggregation.per_element`): each delta is mapped onto the supernet
  (`fedzoo.nas.subnet_mapping`) and every element averaged over the devices covering it, that mean scaled by
  the cohorts covering the element (`zoo.coverage_step_exponent`); elements below `min_coverage` keep their
  values.
- **publication** (a background job of the round service, after the round stops taking updates): a new
  supernet version, then every zoo model re-extracted from it with BatchNorm recalibrated on the server's
  calibration images, measured on the evaluation set and published as the next version (signed, with lineage)
  if it passes the accuracy gate: against the best version of its own line (`gate.compare_with` "best", the
  default) or its current version ("parent"). A compressed variant (pruned, or INT8 not re-quantized) whose
  source line moved is then retired from lookup (`models.retired_by`; downloadable by id).
- **one evaluation set**: a plan measures every model of the task on its evaluation set when it is created, and
  lookup ranks by that measurement (`models.accuracy`, `models.evaluation_sha256`), so build cards (measured on
  the build's test split) and new versions (on the server's set) compare on one set.
Torch (the `cloud` extra) is needed on the server for the extraction; it is imported only here, lazily.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedzoo.aggregation.per_element import (
    CoverageSum, coverage_by_layer, coverage_report, is_statistic, require_mean_only, step_supernet,
)
from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import Strategy
from fedzoo.cards import SUPERNET_DETAILS, Metrics, ModelCard
from fedzoo.errors import FedzooError, InvalidInputError
from fedzoo.secagg import unflatten
from fedzoo.server.fl.zoo_privacy import CohortNoise, PublicSubnet, noised_coverage_sum
from fedzoo.nas.space import Arch, SearchSpace, arch_hash, arch_key
from fedzoo.nas.subnet_mapping import Weights, map_back
from fedzoo.server import registry
from fedzoo.server.devices import AuthenticatedDevice
from fedzoo.server.fl.evaluation import GateReference, client_reported_metrics, decide_publication, evaluate
from fedzoo.server.fl.outcome import RoundOutcome, UpdateCounts, ZooRound
from fedzoo.server.fl.tables import FLRound, FLSubnetAssignment, FLUpdate
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import RoundConfig, ZooSettings
from fedzoo.server.fl.secure_rounds import CohortSum, SeatGroup, ledger_line, refuse_plain_plan_on_dp_weights
from fedzoo.server.fl.stages.screening import ScreenedRound, screen_round, tally_screening
from fedzoo.server.latency import LatencyEstimator
from fedzoo.server.lookup import LookupQuery, lookup
from fedzoo.server.tables import DeviceRecord, ModelRecord
from fedzoo.signing import CardSigningKey, sign_card

WEIGHTS_ARTIFACT = "supernet_weights"  # as fedzoo.compress.zoo_extraction (not imported: it imports torch)
SUBNET_TASK_SUFFIX = ".subnet"
COMPRESSION_TOLERANCE = 0.01  # an INT8 variant may lose at most 1 point against its fp32 model (fedzoo.compress.gate)


def is_zoo(config: RoundConfig) -> bool:
    return config.zoo is not None


def line_root(card: ModelCard) -> str:
    """The zoo model a card is a version of: its first version's id (zoo-wide versions record it)."""
    return str(card.details.get("zoo_federated", {}).get("root_id", card.id))


def round_identity(card: ModelCard) -> tuple[str, str]:
    """(task, family) devices check in for: a supernet's zoo task and family, else the card's own."""
    details = card.details.get(SUPERNET_DETAILS)
    return (str(details["task"]), str(details["zoo_family"])) if details else (card.task, card.family)


@dataclass(frozen=True)
class Supernet:
    """A published supernet card with its space and weights."""

    card: ModelCard
    space: SearchSpace
    weights: Weights
    num_classes: int
    in_channels: int

    @property
    def task(self) -> str:
        return round_identity(self.card)[0]

    @property
    def zoo_family(self) -> str:
        return round_identity(self.card)[1]


def training_card_id(supernet: Supernet, arch: Arch, zoo: ZooSettings) -> str:
    """The id of `arch`'s training card at this supernet version: the card devices train in a zoo-wide round, and
    the model line they check the operator's privacy terms for (it starts a line of its own). An inference-mode
    card's id names its mode and the calibration images its statistics come from, so a plan never trains a card
    made for another mode or other images."""
    mode = f"-bn{zoo.calibration_sha256[:8]}" if zoo.device_batch_norm == "inference" else ""
    return f"{supernet.card.id}-{arch_hash(arch)}"[:120 - len(mode)] + mode + f"-t{supernet.card.version}"


@dataclass
class ZooOutcome:
    """What a zoo-wide round's aggregation produced: the new weights, and the round's outcome so far."""

    weights: Weights
    screened: list[Screened]
    outcome: RoundOutcome


@dataclass(frozen=True)
class SteppedSupernet:
    """The supernet's weights after a round's per-element step, and what the round records of it."""

    weights: Weights
    zoo: ZooRound


@dataclass
class ZooPublication:
    """The supernet's new card and, per zoo model, the new card (None when refused) and what was measured."""

    supernet_onnx: bytes
    supernet_metrics: Metrics
    models: list[dict[str, Any]] = field(default_factory=list)
    new_cards: list[ModelCard] = field(default_factory=list)
    seconds: float = 0.0


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class ZooPlan:
    """The zoo-wide parts of the round stages: assignment, per-subnet screening, per-element aggregation and
    re-publication of the zoo."""

    def __init__(self, context: RoundContext, estimator: LatencyEstimator, signing_key: CardSigningKey) -> None:
        self.context, self.estimator, self.signing_key = context, estimator, signing_key
        self._supernets: dict[str, Supernet] = {}

    # the supernet ---------------------------------------------------------------------------------

    def supernet(self, session: Session, model_id: str) -> Supernet:
        """The supernet card `model_id` with its weights (cached: blobs are immutable)."""
        card = ModelCard.from_dict(registry.get_card(session, model_id))
        details = card.details.get(SUPERNET_DETAILS)
        if not details or WEIGHTS_ARTIFACT not in card.artifacts:
            raise InvalidInputError(f"model {model_id!r} is not a zoo's supernet card (it needs details.supernet and "
                                    f"artifacts.{WEIGHTS_ARTIFACT}); build the zoo with `fedzoo zoo build`",
                                    field="model_id")
        cached = self._supernets.get(card.sha256 + card.artifacts[WEIGHTS_ARTIFACT])
        if cached is not None:
            return cached
        with self.context.store.open(card.artifacts[WEIGHTS_ARTIFACT]) as stream:
            with np.load(io.BytesIO(stream.read()), allow_pickle=False) as archive:
                weights = {name: archive[name] for name in archive.files}
        supernet = Supernet(card, SearchSpace.from_dict(details["space"]), weights, int(details["num_classes"]),
                            int(details["in_channels"]))
        if len(self._supernets) >= 4:
            self._supernets.pop(next(iter(self._supernets)))
        self._supernets[card.sha256 + card.artifacts[WEIGHTS_ARTIFACT]] = supernet
        return supernet

    def check_plan(self, session: Session, config: RoundConfig, strategy: Strategy) -> Supernet:
        """Refuse what a zoo-wide plan cannot run, naming the field; returns the supernet."""
        dp = config.privacy.dp
        if dp is not None and config.privacy.secure_aggregation is None:
            raise InvalidInputError("DP in zoo-wide plans noises each subnet cohort's SecAgg+ sum: set "
                                    "privacy.secure_aggregation too (docs/privacy.md, \"DP in zoo-wide rounds\")",
                                    field="privacy.dp")
        if dp is not None and dp.adaptive is not None:
            raise InvalidInputError("zoo-wide plans clip at a fixed clip_norm; adaptive clipping (each cohort's "
                                    "count of unclipped updates) is not built for them yet", field="privacy.dp.adaptive")
        require_mean_only(strategy)
        if config.gate.compare_with == "anchor":
            raise InvalidInputError("zoo-wide plans gate each zoo model against its own line: set gate.compare_with "
                                    "to 'best' (the line's best version) or 'parent'", field="gate.compare_with")
        supernet = self.supernet(session, config.model_id)
        members = self.members(session, supernet)
        if not members:
            raise InvalidInputError(f"no published fp32 model of task {supernet.task!r} is a subnet of supernet "
                                    f"{supernet.card.id!r}: there is no zoo to improve", field="model_id")
        if dp is None:  # every zoo model the round republishes must keep a true epsilon
            for member in members:
                refuse_plain_plan_on_dp_weights(session, member)
        self._calibration_images(config.zoo.calibration_sha256, supernet)
        return supernet

    def _calibration_images(self, sha256: str, supernet: Supernet) -> np.ndarray:
        """The plan's calibration images, normalised as the zoo's cards say."""
        if not self.context.store.exists(sha256):
            raise InvalidInputError(f"zoo.calibration_sha256 names blob {sha256}, which is not uploaded",
                                    field="zoo.calibration_sha256")
        try:
            with self.context.store.open(sha256) as stream, np.load(io.BytesIO(stream.read()),
                                                                    allow_pickle=False) as archive:
                images = archive["x"].astype(np.float32)
        except (KeyError, ValueError, OSError) as error:
            raise InvalidInputError(f"the calibration blob is not an .npz with an array 'x': {error}",
                                    field="zoo.calibration_sha256") from None
        expected = (supernet.in_channels, supernet.space.resolution, supernet.space.resolution)
        if images.ndim != 4 or images.shape[1:] != expected or not len(images):
            raise InvalidInputError(f"the calibration images have shape {images.shape}; the zoo needs (N, "
                                    f"{', '.join(map(str, expected))}) with N >= 1", field="zoo.calibration_sha256")
        normalisation = supernet.card.input.normalisation
        if normalisation is None:
            return images
        mean = np.asarray(normalisation.mean, np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(normalisation.std, np.float32).reshape(1, -1, 1, 1)
        return ((images - mean) / std).astype(np.float32)

    def members(self, session: Session, supernet: Supernet) -> list[ModelCard]:
        """The zoo: the newest version of every fp32, unpruned model of the task whose arch is a subnet."""
        cards = [ModelCard.model_validate_json(text) for text in session.scalars(
            select(ModelRecord.card_json).where(ModelRecord.task == supernet.task, ModelRecord.precision == "fp32"))]
        zoo = [card for card in cards if card.pruning is None and card.family == supernet.zoo_family
               and supernet.space.contains(card.arch)]
        superseded = {card.parent_id for card in zoo if card.parent_id is not None}
        return sorted((card for card in zoo if card.id not in superseded), key=lambda card: card.id)

    def zoo_models(self, session: Session, supernet: Supernet) -> list[ModelCard]:
        """Every model a round of this zoo may republish: the zoo models and their INT8 variants."""
        members = self.members(session, supernet)
        return [*members, *(variant for member in members for variant in self.int8_variants(session, supernet, member))]

    def terms_lines(self, session: Session, supernet: Supernet, zoo: ZooSettings) -> list[str]:
        """The model lines a zoo-wide round touches, which the operator's privacy terms are checked for: each zoo
        model's training card (its own line: the one devices check), the supernet's line, and every zoo model's line
        and ledger line (`zoo_models`: each is charged and may be republished)."""
        trained = [training_card_id(supernet, member.arch, zoo) for member in self.members(session, supernet)]
        republished = [line for model in self.zoo_models(session, supernet)
                       for line in (model.line_id, ledger_line(session, model))]
        return [*trained, supernet.card.line_id, *republished]

    @staticmethod
    def int8_variants(session: Session, supernet: Supernet, member: ModelCard) -> list[ModelCard]:
        """The newest version of each INT8 variant of a zoo model: quantized from it by the compression stage
        (`parent_id`), or re-quantized from it by an earlier zoo-wide round (`details.zoo_federated.fp32_id`)."""
        cards = [ModelCard.model_validate_json(text) for text in session.scalars(
            select(ModelRecord.card_json).where(ModelRecord.task == supernet.task, ModelRecord.precision == "int8"))]
        superseded = {card.parent_id for card in cards}
        return sorted((card for card in cards if card.id not in superseded and "quantization" in card.details and (
            card.parent_id == member.id or card.details.get("zoo_federated", {}).get("fp32_id") == member.id)),
            key=lambda card: card.id)

    def measure_task(self, session: Session, supernet: Supernet, evaluation_sha256: str) -> int:
        """Measure every model of the zoo's task on the plan's evaluation set, as lookup's accuracy: build cards
        carry their build's test split, new versions the server's set, and lookup must rank them on one.
        Returns how many were measured (those measured on this set already are not)."""
        records = list(session.scalars(select(ModelRecord).where(
            ModelRecord.task == supernet.task, or_(ModelRecord.evaluation_sha256.is_(None),
                                                   ModelRecord.evaluation_sha256 != evaluation_sha256))))
        if not records:
            return 0
        with self.context.store.open(evaluation_sha256) as stream:
            evaluation_npz = stream.read()
        for record in records:
            with self.context.store.open(record.sha256) as stream:
                measured = evaluate(stream.read(), ModelCard.model_validate_json(record.card_json), evaluation_npz)
            record.accuracy, record.evaluation_sha256 = measured.accuracy, evaluation_sha256
        return len(records)

    def reference(self, session: Session, card: ModelCard, current: Metrics, config: RoundConfig) -> GateReference:
        """What a re-extracted model must not fall below (minus the tolerance): its current version ("parent"),
        or the most accurate version of its line measured on the plan's evaluation set ("best", the default)."""
        best = GateReference(card.id, current.accuracy, config.gate.compare_with)
        if config.gate.compare_with == "parent":
            return best
        root = line_root(card)
        for model_id, accuracy, card_json in session.execute(select(
                ModelRecord.id, ModelRecord.accuracy, ModelRecord.card_json).where(
                ModelRecord.task == card.task, ModelRecord.precision == card.precision,
                ModelRecord.evaluation_sha256 == config.evaluation_sha256)):
            if accuracy > best.accuracy and line_root(ModelCard.model_validate_json(card_json)) == root:
                best = GateReference(model_id, accuracy, "best")
        return best

    def retire_stale_variants(self, session: Session, supernet: Supernet, new_ids: dict[str, str]) -> list[str]:
        """Retire from lookup every compressed variant made from a zoo model this round superseded (`new_ids`:
        previous fp32 version -> new version): a pruned model or an INT8 one not re-quantized here would be
        served with none of what the fleet learned. An INT8 variant of a retired pruned one goes with it.
        Returns the retired ids; their cards stay downloadable by id."""
        records = {record.id: record for record in session.scalars(select(ModelRecord).where(
            ModelRecord.task == supernet.task, ModelRecord.retired_by.is_(None),
            ModelRecord.id.not_in(new_ids.values())))}
        variants = {model_id: card for model_id, record in records.items()
                    if (card := ModelCard.model_validate_json(record.card_json)).pruning is not None
                    or card.precision != "fp32"}
        retired_by = dict(new_ids)
        retired: list[str] = []
        changed = True
        while changed:  # a variant of a retired variant goes too
            changed = False
            for model_id, card in variants.items():
                source = card.details.get("zoo_federated", {}).get("fp32_id") or card.parent_id
                if model_id in retired or source not in retired_by:
                    continue
                records[model_id].retired_by = retired_by[model_id] = retired_by[source]
                retired.append(model_id)
                changed = True
        return sorted(retired)

    # selection ------------------------------------------------------------------------------------

    def assign(self, session: Session, round_row: FLRound, config: RoundConfig, device_id: str) -> str | None:
        """Record the subnet this device trains (publishing its training card if this round has none yet) and
        return the training card's id; None when no zoo model fits the device's budget."""
        device = session.get(DeviceRecord, device_id)
        budget = config.zoo.latency_budget_ms_by_class.get(device.device_class or "", config.zoo.latency_budget_ms)
        supernet = self.supernet(session, round_row.base_model_id)
        try:
            chosen = lookup(session, AuthenticatedDevice(device.id, device.device_class, device.memory_mb),
                            LookupQuery(task=supernet.task, latency_budget_ms=budget)).chosen
        except FedzooError:  # no model of the task, or none fits: this device sits the round out
            return None
        arch = ModelCard.from_dict(registry.get_card(session, chosen.model_id)).arch
        if not supernet.space.contains(arch):
            return None
        training_id = self._training_card(session, supernet, arch, config.zoo)
        session.add(FLSubnetAssignment(round_id=round_row.id, device_id=device_id, zoo_model_id=chosen.model_id,
                                       training_model_id=training_id, arch_json=arch_key(arch)))
        return training_id

    def _training_card(self, session: Session, supernet: Supernet, arch: Arch, zoo: ZooSettings) -> str:
        """The signed training card of `arch` at this supernet version in the plan's BatchNorm mode (published
        once): in inference mode its statistics are recalibrated on the plan's calibration images, the ones the
        republication recalibrates on."""
        card_id = training_card_id(supernet, arch, zoo)
        if session.get(ModelRecord, card_id) is not None:
            return card_id
        from fedzoo.compress.zoo_extraction import SupernetSpec, training_blobs

        spec = SupernetSpec(supernet.space, supernet.num_classes, supernet.in_channels, supernet.task,
                            supernet.zoo_family)
        inference = zoo.device_batch_norm == "inference"
        calibration = self._calibration_images(zoo.calibration_sha256, supernet) if inference else None
        model, graph = training_blobs(spec, arch, supernet.weights, calibration)
        batch_norm = ({"batch_norm": "inference", "calibration_sha256": zoo.calibration_sha256} if inference
                      else {"batch_norm": "training"})
        base = supernet.card
        card = ModelCard.from_dict({
            **base.model_dump(exclude={"signature"}),
            "id": card_id, "family": f"{base.family}-subnet", "task": supernet.task + SUBNET_TASK_SUFFIX,
            "parent_id": base.id, "line": None,  # a line of its own: never a version of the supernet's line
            "arch": arch, "sha256": self.context.store.put(model), "size_bytes": len(model),
            "training_graph": self.context.store.put(graph), "artifacts": {}, "latency_ms": {},
            "created_at": self.context.clock(),
            "details": {"zoo_training": {"supernet_id": base.id, "supernet_version": base.version,
                                         "training_graph_bytes": len(graph), **batch_norm,
                                         "note": "a subnet of the supernet with BatchNorm unfolded, for training only; "
                                                 "its metrics are the supernet card's"}},
        })
        card = sign_card(card, self.signing_key, now=self.context.clock())
        try:
            with session.begin_nested():  # two workers seating devices of one arch at once: one card wins
                registry.publish(session, self.context.store, self.estimator, card)
        except IntegrityError:
            if session.get(ModelRecord, card_id) is None:
                raise
        return card_id

    # screening and aggregation ------------------------------------------------------------------------

    def screen(self, session: Session, rows: list[FLUpdate], config: RoundConfig,
               revoked: frozenset[str]) -> ScreenedRound:
        """Screening per subnet: each subnet's updates are screened among themselves (a norm bound's median
        over devices that trained the same tensors); the decisions come back in the rows' order."""
        assignments = self._assignments(session, rows[0].round_id) if rows else {}
        groups: dict[str, list[FLUpdate]] = {}
        for row in rows:
            groups.setdefault(assignments[row.device_id].training_model_id, []).append(row)
        decisions: dict[int, Screened] = {}
        limits: dict[str, float] = {}
        defences: dict[str, dict[str, Any]] = {}
        for training_id, group in groups.items():
            # no root-set scoring: the root set trains the single-model plan's model, not each subnet
            screened = screen_round(self.context, group, config, revoked, None)
            limits[training_id] = screened.outcome.screening.norm_limit
            defences[training_id] = screened.outcome.defences
            decisions.update({row.id: decision for row, decision in zip(group, screened.screened)})
        ordered = [decisions[row.id] for row in rows]
        kept = [decision.update for decision in ordered if decision.update is not None]
        outcome = RoundOutcome(counts=UpdateCounts(len(rows), len(kept), sum(update.num_examples for update in kept)),
                               upload_bytes=sum(row.upload_bytes for row in rows),
                               screening=tally_screening(ordered, per_subnet_norm_limit=limits),
                               client_reported_metrics=client_reported_metrics(kept), per_subnet_defences=defences)
        return ScreenedRound(ordered, kept, outcome)

    @staticmethod
    def _download_bytes(session: Session, training_id: str) -> int:
        """What a device downloads to train this subnet: its model and its training graph."""
        card = ModelCard.from_dict(registry.get_card(session, training_id))
        return card.size_bytes + int(card.details.get("zoo_training", {}).get("training_graph_bytes", 0))

    def seat_group(self, session: Session, round_id: int, device_id: str) -> SeatGroup:
        """The SecAgg+ cohort a seated device joins: the devices that train its subnet (`docs/privacy.md`, "Zoo-wide
        rounds under SecAgg+"), whose update vector is that subnet's trainable parameters."""
        training_id = session.get(FLSubnetAssignment, (round_id, device_id)).training_model_id
        parameters = self.context.bases.get(session, training_id).parameters
        return SeatGroup(training_id, sum(value.size for value in parameters.values()))

    def _assignments(self, session: Session, round_id: int) -> dict[str, FLSubnetAssignment]:
        return {row.device_id: row for row in session.scalars(
            select(FLSubnetAssignment).where(FLSubnetAssignment.round_id == round_id))}

    def aggregate(self, round_id: int, config: RoundConfig, supernet: Supernet, rows: list[FLUpdate],
                  screening: ScreenedRound, strategy: Strategy) -> ZooOutcome:
        """Map every kept update onto the supernet and average per element; the statistics' deltas are averaged
        per element too (variances kept positive). Devices of an inference-mode plan send no statistics: the
        supernet's keep their values (every published model is recalibrated anyway)."""
        started = time.perf_counter()
        with self.context.database.session() as session:
            assignments = self._assignments(session, round_id)
            download_bytes = {training_id: self._download_bytes(session, training_id)
                              for training_id in {row.training_model_id for row in assignments.values()}}
        blobs = {row.device_id: row.blob_sha256 for row in rows}
        total = CoverageSum({name: value.shape for name, value in supernet.weights.items()})
        subnets: dict[str, int] = {}
        for update in screening.kept:
            assignment = assignments[update.device_id]
            arch = json.loads(assignment.arch_json)
            delta = {**update.load_delta(), **self.context.delta_loader(blobs[update.device_id], statistics=True)()}
            total.add(map_back(supernet.space, arch, supernet.weights, delta), update.num_examples,
                      assignment.arch_json)
            subnets[assignment.zoo_model_id] = subnets.get(assignment.zoo_model_id, 0) + 1
        upload = sum(row.upload_bytes for row in rows)
        download = sum(download_bytes[assignments[row.device_id].training_model_id] for row in rows)
        outcome = self._stepped(config, supernet, total, subnets, strategy, started, upload, download, len(rows))
        # a copy of the screening's outcome: a refused re-extraction records the screening alone
        return ZooOutcome(outcome.weights, screening.screened,
                          replace(screening.outcome, strategy=strategy.name, zoo=outcome.zoo))

    def aggregate_cohorts(self, round_id: int, config: RoundConfig, supernet: Supernet, sums: list[CohortSum],
                          strategy: Strategy, outcome: RoundOutcome, upload_bytes: int,
                          noise: CohortNoise | None = None) -> ZooOutcome:
        """A zoo-wide round under SecAgg+: each cohort's unmasked sum (the devices of one subnet, at least 3) mapped
        onto the supernet and combined per element; no device's own update is ever seen. Under DP (`noise`), every
        subnet of the zoo's sum is noised and combined with public weights only (`fedzoo.server.fl.zoo_privacy`)."""
        started = time.perf_counter()
        with self.context.database.session() as session:
            assignments = self._assignments(session, round_id)
            zoo_model_of = {row.training_model_id: row.zoo_model_id for row in assignments.values()}
            arch_key_of = {row.training_model_id: row.arch_json for row in assignments.values()}
            shapes = {cohort.name: {name: value.shape for name, value in
                                    self.context.bases.get(session, cohort.name).parameters.items()} for cohort in sums}
            download = sum(self._download_bytes(session, cohort.name) * cohort.count for cohort in sums)
            members = self.members(session, supernet)
        deltas = {arch_key_of[cohort.name]: unflatten(cohort.total, shapes[cohort.name]) for cohort in sums}
        subnets: dict[str, int] = {}
        for cohort in sums:
            subnets[zoo_model_of[cohort.name]] = subnets.get(zoo_model_of[cohort.name], 0) + cohort.count
        if noise is not None:
            public = {arch_key(member.arch): PublicSubnet(arch_key(member.arch), member.arch) for member in members}
            total = noised_coverage_sum(supernet.space, supernet.weights, list(public.values()), deltas,
                                        config.target_clients, noise)
        else:
            total = CoverageSum({name: value.shape for name, value in supernet.weights.items()})
            for cohort in sums:
                key = arch_key_of[cohort.name]
                total.add_sum(map_back(supernet.space, json.loads(key), supernet.weights, deltas[key]),
                              cohort.total_weight, cohort.count, key)
        devices = sum(cohort.count for cohort in sums)
        stepped = self._stepped(config, supernet, total, subnets, strategy, started, upload_bytes, download, devices)
        return ZooOutcome(stepped.weights, [], replace(outcome, strategy=strategy.name, zoo=stepped.zoo))

    def _stepped(self, config: RoundConfig, supernet: Supernet, total: CoverageSum, subnets: dict[str, int],
                 strategy: Strategy, started: float, upload_bytes: int, download_bytes: int, devices: int
                 ) -> SteppedSupernet:
        """The strategy's per-element step from `total`, checked finite, with the round's coverage and bytes."""
        weights, released = step_supernet(strategy, supernet.weights, total, config.zoo.min_coverage,
                                          config.zoo.coverage_step_exponent)
        # the coverage of what devices train: every parameter but the kernel transforms, which no subnet holds
        parameters = {name for name in supernet.weights if "kernel_transforms" not in name and not is_statistic(name)}
        if not all(np.all(np.isfinite(value)) for value in weights.values()):
            raise InvalidInputError(f"the per-element {strategy.name} aggregate holds NaN or infinite weights")
        report = coverage_report(total.counts, released)
        elements = sum(value.size for name, value in supernet.weights.items() if name in parameters)
        zoo = ZooRound(
            supernet_id=supernet.card.id, devices_per_zoo_model=subnets,
            min_coverage=config.zoo.min_coverage,
            coverage_step_exponent=config.zoo.coverage_step_exponent,
            devices_per_subnet=round(total.devices_per_subnet, 4),
            coverage={
                "parameters": elements,
                "uncovered": sum(report[name].uncovered for name in parameters),
                "single_device": sum(report[name].single for name in parameters),
                "released": sum(report[name].released for name in parameters),
                "by_layer": coverage_by_layer({name: report[name] for name in parameters}),
            },
            aggregation_s=round(time.perf_counter() - started, 4),
            bytes={
                "upload": upload_bytes,
                "upload_per_device": round(upload_bytes / max(devices, 1), 1),
                "download_per_device": round(download_bytes / max(devices, 1), 1),
            },
        )
        return SteppedSupernet(weights, zoo)

    # publication ----------------------------------------------------------------------------------

    def re_extract(self, config: RoundConfig, supernet: Supernet, weights: Weights, members: list[ModelCard],
                   variants: dict[str, list[ModelCard]], progress: Callable[[int], None]) -> ZooPublication:
        """Every zoo model re-extracted from the new weights, BN recalibrated on the calibration images,
        measured beside its current version; which pass the gate (`reference`; and what the device statistics
        alone give). Each INT8 variant (`variants` by zoo model id) is re-quantized from a re-extracted model that
        passed, with its own recipe, and gated twice: against its line (the plan's `max_accuracy_drop`) and
        against the new fp32 model (the compression gate's tolerance). `progress` hears the zoo models done."""
        from fedzoo.compress.zoo_extraction import SupernetSpec, deployable_blob, inference_training_graph, requantized_blob

        started = time.perf_counter()
        spec = SupernetSpec(supernet.space, supernet.num_classes, supernet.in_channels, supernet.task,
                            supernet.zoo_family)
        calibration = self._calibration_images(config.zoo.calibration_sha256, supernet)
        with self.context.store.open(config.evaluation_sha256) as stream:
            evaluation_npz = stream.read()
        supernet_onnx = deployable_blob(spec, supernet.space.max_arch(), weights, calibration)
        publication = ZooPublication(supernet_onnx, evaluate(supernet_onnx, supernet.card, evaluation_npz))
        for done, member in enumerate(members):
            progress(done)
            with self.context.store.open(member.sha256) as stream:
                before = evaluate(stream.read(), member, evaluation_npz)
            onnx_bytes = deployable_blob(spec, member.arch, weights, calibration)
            after = evaluate(onnx_bytes, member, evaluation_npz)
            device_statistics = evaluate(deployable_blob(spec, member.arch, weights, None), member, evaluation_npz)
            reference = self._line_reference(member, before, config)
            decision = decide_publication(after, reference, config.max_accuracy_drop)
            publication.models.append({
                "model_id": member.id, "accuracy_before": before.accuracy, "accuracy_after": after.accuracy,
                "accuracy_with_device_statistics": device_statistics.accuracy, "gate": reference.as_dict(),
                "published": decision.publish,
                "reason": decision.reason, "onnx": onnx_bytes, "metrics": after, "card": member,
                "training_graph": inference_training_graph(onnx_bytes) if decision.publish else None,
            })
            for variant in variants.get(member.id, []) if decision.publish else ():
                publication.models.append(self._requantized(variant, member, onnx_bytes, after, calibration,
                                                            evaluation_npz, config, requantized_blob))
        progress(len(members))
        publication.seconds = round(time.perf_counter() - started, 4)
        return publication

    def _line_reference(self, card: ModelCard, current: Metrics, config: RoundConfig) -> GateReference:
        with self.context.database.session() as session:
            return self.reference(session, card, current, config)

    def _requantized(self, variant: ModelCard, member: ModelCard, fp32_onnx: bytes, fp32_after: Metrics,
                     calibration: np.ndarray, evaluation_npz: bytes, config: RoundConfig, requantize) -> dict[str, Any]:
        """An INT8 variant re-made from the re-extracted fp32 model, with both gates' verdict."""
        with self.context.store.open(variant.sha256) as stream:
            before = evaluate(stream.read(), variant, evaluation_npz)
        onnx_bytes = requantize(fp32_onnx, variant.details["quantization"], calibration)
        after = evaluate(onnx_bytes, variant, evaluation_npz)
        reference = self._line_reference(variant, before, config)
        against_current = decide_publication(after, reference, config.max_accuracy_drop)
        against_fp32 = decide_publication(after, GateReference(member.id, fp32_after.accuracy,
                                                               "re-extracted fp32 model"), COMPRESSION_TOLERANCE)
        publish = against_current.publish and against_fp32.publish
        return {"model_id": variant.id, "accuracy_before": before.accuracy, "accuracy_after": after.accuracy,
                "accuracy_with_device_statistics": None, "gate": reference.as_dict(), "published": publish,
                "reason": f"{against_current.reason}; against the new fp32 model: {against_fp32.reason}",
                "onnx": onnx_bytes, "metrics": after, "card": variant, "training_graph": None,
                "fp32_of": member.id}

    def publish(self, session: Session, round_row: FLRound, supernet: Supernet, weights: Weights,
                publication: ZooPublication, outcome: RoundOutcome, claims: dict[str, dict[str, Any]]) -> ModelCard:
        """Publish the new supernet version and every zoo model that passed the gate, retire the compressed
        variants their lines left behind; returns the supernet card. Under DP the supernet's card states the plan's
        privacy (its line's epsilon), and each republished model's card the claim of its own line (`claims`, by the
        id of the card it supersedes: `zoo_privacy.charge_zoo_lines`)."""
        now = self.context.clock()
        evaluation_sha256 = RoundConfig.model_validate_json(round_row.config_json).evaluation_sha256
        version = registry.next_line_version(session, supernet.card.line_id)  # unique per line, across plans
        weights_sha = self.context.store.put(_npz(weights))
        supernet_card = supernet.card.model_copy(update={
            "id": f"{supernet.task}-supernet-v{version}-r{round_row.id}"[:128], "version": version,
            "parent_id": supernet.card.id, "line": supernet.card.line_id,
            "sha256": self.context.store.put(publication.supernet_onnx),
            "size_bytes": len(publication.supernet_onnx), "metrics": publication.supernet_metrics, "created_at": now,
            "artifacts": {**supernet.card.artifacts, WEIGHTS_ARTIFACT: weights_sha},
            "details": {**supernet.card.details, "federated": {
                "round_id": round_row.id, "base_model_id": supernet.card.id,
                **({"privacy": outcome.privacy} if outcome.privacy is not None else {})}},
        })
        supernet_card = sign_card(ModelCard.from_dict(supernet_card.model_dump(exclude={"signature"})),
                                  self.signing_key, now=now)
        registry.publish(session, self.context.store, self.estimator, supernet_card)
        fp32_training_graphs: dict[str, str | None] = {}  # an INT8 variant trains through its fp32 parent's graph
        new_ids: dict[str, str] = {}  # previous fp32 version -> its new version (published first: models are in order)
        for model in publication.models:
            if not model["published"]:
                continue
            member: ModelCard = model["card"]
            privacy = claims.get(member.id)
            fp32_id = new_ids.get(model.get("fp32_of", ""))
            new_version = registry.next_line_version(session, member.line_id)
            root = line_root(member)
            card = member.model_copy(update={
                "id": f"{root}-v{new_version}-r{round_row.id}"[:128], "version": new_version, "parent_id": member.id,
                "line": member.line_id,
                "sha256": self.context.store.put(model["onnx"]), "size_bytes": len(model["onnx"]),
                "metrics": model["metrics"], "created_at": now, "artifacts": {},
                "training_graph": (self.context.store.put(model["training_graph"]) if model["training_graph"]
                                   else fp32_training_graphs.get(fp32_id)),
                "details": {**member.details, "zoo_federated": {
                    "root_id": root, "round_id": round_row.id, "supernet_id": supernet_card.id,
                    "metrics_source": "the server's evaluation set (held out, measured on the server)",
                    "batch_norm": "recalibrated on the plan's calibration images",
                    "accuracy_before": model["accuracy_before"],
                    **({"fp32_id": fp32_id} if fp32_id else {})},
                    **({"federated": {"round_id": round_row.id, "privacy": privacy}} if privacy is not None else {})},
            })
            card = sign_card(ModelCard.from_dict(card.model_dump(exclude={"signature"})), self.signing_key, now=now)
            registry.publish(session, self.context.store, self.estimator, card)
            session.get(ModelRecord, card.id).evaluation_sha256 = evaluation_sha256  # its metrics: that set's
            publication.new_cards.append(card)
            model["new_model_id"] = card.id
            if card.precision == "fp32":
                new_ids[member.id] = card.id
                fp32_training_graphs[card.id] = card.training_graph
        outcome.zoo.models = [{key: value for key, value in model.items()
                               if key not in ("onnx", "metrics", "card", "training_graph", "fp32_of")}
                              for model in publication.models]
        outcome.zoo.new_versions = len(publication.new_cards)
        outcome.zoo.retired_from_lookup = self.retire_stale_variants(session, supernet, new_ids)
        outcome.zoo.publication_s = publication.seconds
        return supernet_card
