"""`compress_zoo`: turn every root fp32 model of a zoo into pruned and INT8 variants, measure each side by
side with its parent, and publish only those the gate accepts.

For each fp32 card without a parent:
  1. pruned: rebuild the torch model from `arch` + `torch_state`, prune channels (largest ratio first),
     fine-tune with distillation from the parent, export (BN folded, checked equal to torch);
  2. int8: quantize the parent and the accepted pruned variant (static, per-channel, calibrated on train
     images normalised as the card says) with each of the `int8_recipes`, measure them side by side with
     the parent and put the fastest (then smallest) before the gate: which form is fastest depends on the CPU;
     recipes that run the same kernels (`kernel_signature`) count as equally fast, so the smaller one wins.
Fine-tuning and quantizing, which time nothing, run in `workers` processes, in two batches (the roots' INT8
files with every root's largest-ratio fine-tuning, then the accepted pruned variants' INT8 files); each
batch's measurements wait until it is done, so no timing shares the CPU with them.
Every variant is staged in a temporary folder; blobs and cards reach the zoo only after all variants are
measured and judged, so any error leaves the zoo as it was. Rejections and their reasons are logged and
written to `zoo/compress_report.json`.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import tempfile
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedzoo.cards import Latency, Metrics, ModelCard, Pruning, is_supernet
from fedzoo.compress.errors import CalibrationDataError
from fedzoo.compress.finetune import FineTuning, fine_tune
from fedzoo.compress.gate import judge, pick_fastest
from fedzoo.compress.measure import DEVICE_CLASS, Measurement, measure, measure_side_by_side, normalise
from fedzoo.compress.pruning import PruningResult, prune_channels, resize_to_state_dict
from fedzoo.compress.quantize import DEFAULT_INT8_RECIPES, INT8_RECIPES, QuantizationRecipe, quantize_int8
from fedzoo.datasets import DatasetSplit
from fedzoo.edge.kernels import split_kernels
from fedzoo.errors import FedzooError, InvalidInputError
from fedzoo.nas.export import DEFAULT_TOLERANCE, ExportMismatchError, export_checked, load_onnx_file, max_abs_difference
from fedzoo.zoo import Zoo, atomic_write_bytes, sha256_of_file

logger = logging.getLogger("fedzoo.compress")

REPORT_NAME = "compress_report.json"
TORCH_STATE = "torch_state"
ModelBuilder = Callable[[ModelCard], nn.Module]


@dataclass
class VariantOutcome:
    """One candidate variant, whether it was published and why."""

    variant_id: str
    parent_id: str
    kind: str  # "pruned" | "int8"
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measurement: dict | None = None
    parent_measurement: dict | None = None


@dataclass
class CompressionReport:
    """What `compress_zoo` published (`accepted`), refused (`rejected`, with reasons) and left alone (`skipped`)."""

    accepted: list[VariantOutcome] = field(default_factory=list)
    rejected: list[VariantOutcome] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    accuracy_tolerance_points: float = 1.0

    def record(self, outcome: VariantOutcome) -> None:
        (self.accepted if outcome.accepted else self.rejected).append(outcome)
        verdict = "accepted" if outcome.accepted else "rejected"
        log = logger.info if outcome.accepted else logger.warning
        log("%s %s (from %s): %s", verdict, outcome.variant_id, outcome.parent_id, "; ".join(outcome.reasons or outcome.notes))

    def to_dict(self) -> dict:
        return {"created_at": datetime.now(timezone.utc).isoformat(), **asdict(self)}


def kernel_signature(path: Path, activation_type: str) -> tuple:
    """What onnxruntime runs for an INT8 file: its fused kernels (names aside) and the activation type, which
    the kernel list does not show but which picks MLAS's U8S8 or S8S8 path (S8S8 is slower without VNNI)."""
    return activation_type, tuple(replace(kernel, name="") for kernel in split_kernels(path))


def default_model_builder(zoo: Zoo) -> ModelBuilder:
    """Rebuild a card's torch model: `build_subnet(arch)`, shrunk to and loaded with its `torch_state`."""

    def build(card: ModelCard) -> nn.Module:
        from fedzoo.nas.subnet import build_subnet

        if TORCH_STATE not in card.artifacts:
            raise InvalidInputError(f"card {card.id} has no {TORCH_STATE!r} artifact: pruning needs the torch weights", field="artifacts")
        path = zoo.blob_path(card.artifacts[TORCH_STATE])
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises assorted pickle/zip errors for a damaged file
            raise InvalidInputError(f"{TORCH_STATE} blob of card {card.id} is not a readable state dict: {error}", field="artifacts") from None
        model = build_subnet(card.arch, len(card.labels), int(card.input.shape[1]))
        return resize_to_state_dict(model, state).eval()

    return build


@dataclass
class _Staged:
    card: ModelCard
    onnx_path: Path
    torch_state: bytes | None = None


@dataclass
class _Parent:
    """A model variants are made from: its card, ONNX file and measurement in this run."""

    card: ModelCard
    onnx_path: Path
    measurement: Measurement


def _check_split(card: ModelCard, split: DatasetSplit) -> None:
    expected = tuple(int(dim) for dim in card.input.shape[1:])
    if split.dataset.image_shape != expected or split.dataset.num_classes != len(card.labels):
        raise InvalidInputError(
            f"card {card.id} takes {expected} images and {len(card.labels)} classes but the data set "
            f"{split.dataset.name!r} has {split.dataset.image_shape} and {split.dataset.num_classes}",
            field="dataset",
        )


def _variant_card(parent: ModelCard, variant_id: str, path: Path, measurement: Measurement, **fields) -> ModelCard:
    """The parent's card with the variant's identity, lineage and measurements (validated like any card). A DP
    parent's signed privacy claim stays on the child: its weights derive from the parent's, so they have spent
    what the parent's line spent, and a plan on the child continues that ledger (docs/privacy.md)."""
    privacy = (parent.details.get("federated") or {}).get("privacy")
    if privacy is not None:
        fields["details"] = {**fields.get("details", {}),
                             "federated": {"privacy": privacy, "privacy_inherited_from": parent.id}}
    return ModelCard.from_dict(
        {
            **parent.model_dump(),
            "id": variant_id,
            "version": 1,
            "parent_id": parent.id,
            "line": None,  # other weights, not a newer version of the parent's: a line of its own
            "metrics": Metrics(accuracy=measurement.accuracy, loss=measurement.loss, split="test", num_examples=measurement.num_examples),
            "size_bytes": measurement.size_bytes,
            "sha256": sha256_of_file(path),
            "latency_ms": {
                DEVICE_CLASS: Latency(median_ms=measurement.latency_median_ms, p90_ms=measurement.latency_p90_ms, source="measured", threads=1)
            },
            "training_graph": None,
            "artifacts": {},
            "created_at": datetime.now(timezone.utc),
            **fields,
        }
    )


@dataclass(frozen=True)
class _Settings:
    tolerance_points: float
    pruning_ratios: tuple[float, ...]
    pruning_method: str
    pruning_scope: str
    fine_tuning: FineTuning
    calibration: str
    calibration_count: int
    int8_recipes: tuple[str, ...]
    timed_runs: int


def _pruned_id(parent: ModelCard, ratio: float) -> str:
    return f"{parent.id}-p{round(ratio * 100):02d}"


@dataclass(frozen=True)
class _PruningJob:
    """One prune-and-fine-tune, self-contained so that a worker process can run it."""

    teacher: nn.Module
    input_shape: tuple[int, ...]  # without the batch dimension
    ratio: float
    method: str
    scope: str
    images: np.ndarray  # normalised train split
    labels: np.ndarray
    fine_tuning: FineTuning


@dataclass(frozen=True)
class _PruningPlan:
    ratios: tuple[float, ...]  # not yet in the zoo, largest first
    first_job: _PruningJob  # the largest ratio's, run for every root before any variant is measured


def _prune_and_fine_tune(job: _PruningJob) -> PruningResult:
    result = prune_channels(job.teacher, (1, *job.input_shape), job.ratio, job.method, job.scope)
    fine_tune(result.model, job.images, job.labels, job.fine_tuning, teacher=job.teacher)
    return result


@dataclass(frozen=True)
class _QuantizationJob:
    """One INT8 recipe applied to one parent, self-contained like `_PruningJob`."""

    recipe: str
    fp32_path: Path
    output_path: Path
    calibration_images: np.ndarray
    calibration: str


def _quantize(job: _QuantizationJob) -> QuantizationRecipe:
    quant_format, activation_type, weight_scales = INT8_RECIPES[job.recipe]
    return quantize_int8(job.fp32_path, job.output_path, job.calibration_images, job.calibration,
                         quant_format=quant_format, activation_type=activation_type, weight_scales=weight_scales)  # fmt: skip


def _set_torch_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def _run_jobs(calls: dict[Hashable, tuple[Callable[[Any], Any], Any]], workers: int) -> dict[Hashable, Any]:
    """`{key: function(job)}` for `calls = {key: (function, job)}`, in `workers` processes (in this one if 1),
    in the order given (put the longest first). Fine-tuning and quantizing time nothing, so a 2-core
    machine runs two at once. The workers share this process's torch threads (at least one each, so two
    processes of one thread rather than two of two on 2 cores), and every job is seeded, so the results do not
    depend on `workers`."""
    if workers == 1 or len(calls) <= 1:
        return {key: function(job) for key, (function, job) in calls.items()}
    # spawned, not forked: a forked child of a process that has run torch's thread pool can hang
    with ProcessPoolExecutor(min(workers, len(calls)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_set_torch_threads, initargs=(max(1, torch.get_num_threads() // workers),)) as pool:  # fmt: skip
        futures = {key: pool.submit(function, job) for key, (function, job) in calls.items()}
        return {key: future.result() for key, future in futures.items()}


class _Compressor:
    """The work of one `compress_zoo` call; holds the data, the staging folder and the report."""

    def __init__(self, zoo: Zoo, split: DatasetSplit, build_model: ModelBuilder, settings: _Settings, staging: Path) -> None:
        self.zoo, self.split, self.build_model, self.settings, self.staging = zoo, split, build_model, settings, staging
        self.report = CompressionReport(accuracy_tolerance_points=settings.tolerance_points)
        self.staged: list[_Staged] = []
        self.existing_ids = {card.id for card in zoo.cards()}

    def _test_data(self, card: ModelCard) -> tuple[np.ndarray, np.ndarray]:
        return normalise(self.split.test.x, card.input.normalisation), self.split.test.y

    def _train_data(self, card: ModelCard) -> tuple[np.ndarray, np.ndarray]:
        return normalise(self.split.train.x, card.input.normalisation), self.split.train.y

    def _measure(self, card: ModelCard, path: Path) -> Measurement:
        images, labels = self._test_data(card)
        return measure(path, images, labels, timed_runs=self.settings.timed_runs)

    def _is_new(self, variant_id: str) -> bool:
        if variant_id in self.existing_ids:
            self.report.skipped.append(variant_id)
            logger.info("skipped %s: already in the zoo", variant_id)
            return False
        return True

    def root(self, card: ModelCard) -> _Parent:
        _check_split(card, self.split)
        path = self.zoo.model_path(card)
        if sha256_of_file(path) != card.sha256:
            raise InvalidInputError(f"the ONNX blob of card {card.id} is corrupt: its bytes do not hash to {card.sha256}", field="sha256")
        load_onnx_file(path)
        return _Parent(card, path, self._measure(card, path))

    def pruning_plan(self, parent: _Parent) -> _PruningPlan | None:
        """The new ratios to try for `parent` and its first job, or None (recorded) when it is not pruned: the
        zoo already holds a pruned child, or its torch model cannot be rebuilt or does not match its ONNX blob."""
        settings = self.settings
        existing = [card.id for card in self.zoo.cards() if card.parent_id == parent.card.id and card.pruning is not None]
        if existing:
            self.report.skipped.extend(existing)
            logger.info("skipped pruning %s: the zoo already holds %s", parent.card.id, existing)
            return None
        try:
            teacher = self.build_model(parent.card)
        except (FedzooError, ImportError) as error:
            self.report.record(VariantOutcome(f"{parent.card.id}-pruned", parent.card.id, "pruned", False, [f"cannot rebuild the torch model: {error}"]))
            return None
        test_images, _ = self._test_data(parent.card)
        if max_abs_difference(teacher, parent.onnx_path, test_images[:16]) > DEFAULT_TOLERANCE * 10:
            self.report.record(VariantOutcome(f"{parent.card.id}-pruned", parent.card.id, "pruned", False,
                                              ["the card's torch_state does not compute what its ONNX blob computes"]))  # fmt: skip
            return None
        ratios = tuple(ratio for ratio in settings.pruning_ratios if self._is_new(_pruned_id(parent.card, ratio)))
        if not ratios:
            return None
        train_images, train_labels = self._train_data(parent.card)
        input_shape = tuple(int(dim) for dim in parent.card.input.shape[1:])
        return _PruningPlan(ratios, _PruningJob(teacher, input_shape, ratios[0], settings.pruning_method, settings.pruning_scope,
                                                train_images, train_labels, settings.fine_tuning))  # fmt: skip

    def prune(self, parent: _Parent, plan: _PruningPlan, first: PruningResult) -> _Parent | None:
        """Gate each ratio of the plan, largest first (`first` is the largest, already fine-tuned); stage and
        return the first variant the gate accepts. Smaller ratios are fine-tuned here, only when needed."""
        settings = self.settings
        test_images, _ = self._test_data(parent.card)
        input_shape = plan.first_job.input_shape
        for ratio in plan.ratios:
            variant_id = _pruned_id(parent.card, ratio)
            result = first if ratio == plan.first_job.ratio else _prune_and_fine_tune(replace(plan.first_job, ratio=ratio))
            model = result.model
            path = self.staging / f"{variant_id}.onnx"
            try:
                export_checked(model, (1, *input_shape), path, test_images[:16])
            except ExportMismatchError as error:
                self.report.record(VariantOutcome(variant_id, parent.card.id, "pruned", False, [str(error)]))
                continue
            measurement = self._measure(parent.card, path)
            decision = judge(measurement, parent.measurement, settings.tolerance_points)
            outcome = VariantOutcome(variant_id, parent.card.id, "pruned", decision.accepted, decision.reasons,
                                     [f"MACs -{result.macs_reduction:.0%}", *decision.notes],
                                     asdict(measurement), asdict(parent.measurement))  # fmt: skip
            self.report.record(outcome)
            if not decision.accepted:
                continue
            state = io.BytesIO()
            torch.save(model.state_dict(), state)
            card = _variant_card(
                parent.card, variant_id, path, measurement,
                pruning=Pruning(ratio=result.channel_ratio, method=f"{result.method}-{result.scope}"),
                macs=result.macs_after,
                params=result.params_after,
                details={
                    "compression": {
                        "kind": "pruned",
                        "requested_ratio": ratio,
                        "macs_reduction": result.macs_reduction,
                        "kept_channels": result.kept_channels,
                        "fine_tuning": {**asdict(settings.fine_tuning), "distilled_from": parent.card.id},
                        "gate": decision.notes,
                    },
                    "rebuild": "build_subnet(arch, ...) then fedzoo.compress.pruning.resize_to_state_dict(model, torch_state)",
                },
            )  # fmt: skip
            self.staged.append(_Staged(card, path, state.getvalue()))
            return _Parent(card, path, measurement)
        return None

    def quantization_jobs(self, parent: _Parent) -> list[_QuantizationJob]:
        """One job per INT8 recipe for `parent`, none if the zoo already holds its INT8 variant."""
        variant_id = f"{parent.card.id}-int8"
        if not self._is_new(variant_id):
            return []
        settings = self.settings
        train_images, _ = self._train_data(parent.card)
        order = np.random.default_rng(settings.fine_tuning.seed).permutation(len(train_images))
        calibration_images = train_images[order[: settings.calibration_count]]
        return [_QuantizationJob(name, parent.onnx_path, self.staging / f"{variant_id}.{name}.onnx", calibration_images, settings.calibration)
                for name in settings.int8_recipes]  # fmt: skip

    def judge_int8(self, parent: _Parent, jobs: list[_QuantizationJob], recipes: dict[str, QuantizationRecipe]) -> None:
        """Measure the quantized files of `jobs` side by side with `parent`, gate the fastest and stage it."""
        if not jobs:
            return
        settings = self.settings
        variant_id = f"{parent.card.id}-int8"
        paths = {job.recipe: job.output_path for job in jobs}
        images, labels = self._test_data(parent.card)
        measured = measure_side_by_side({"parent": parent.onnx_path, **paths}, images, labels, settings.timed_runs)
        parent_measurement = measured.pop("parent")
        signatures = {name: kernel_signature(paths[name], INT8_RECIPES[name][1]) for name in paths}
        chosen = pick_fastest(measured, parent_measurement, settings.tolerance_points, signatures)
        path, recipe, measurement = paths[chosen], recipes[chosen], measured[chosen]
        tried = [f"{name}: {m.latency_median_ms:.3f} ms, {m.size_bytes} bytes, accuracy {m.accuracy:.2%}" for name, m in measured.items()]
        decision = judge(measurement, parent_measurement, settings.tolerance_points)
        self.report.record(VariantOutcome(variant_id, parent.card.id, "int8", decision.accepted, decision.reasons,
                                          [f"recipe {chosen} (tried {'; '.join(tried)})", *decision.notes],
                                          asdict(measurement), asdict(parent_measurement)))  # fmt: skip
        if not decision.accepted:
            return
        card = _variant_card(
            parent.card, variant_id, path, measurement,
            precision="int8",
            details={
                "quantization": {**recipe.as_details(), "recipe": chosen, "recipes_tried": tried, "calibration_split": "train",
                                 "gate": decision.notes},
                "fine_tuning": (
                    f"train the fp32 parent {parent.card.id} (its training graph); the cloud re-quantizes the updated "
                    "parent with this recipe, gates it again and devices receive the new quantized version. "
                    "INT8 graphs are never trained on the device."
                ),
            },
        )  # fmt: skip
        self.staged.append(_Staged(card, path))

    def commit(self) -> None:
        """Store the staged blobs, then their cards (a card is only written once its blobs are in)."""
        for staged in self.staged:
            self.zoo.add_blob_file(staged.onnx_path)
            artifacts = {}
            if staged.torch_state is not None:
                artifacts[TORCH_STATE] = self.zoo.add_blob_bytes(staged.torch_state)
            self.zoo.add_card(ModelCard.from_dict({**staged.card.model_dump(), "artifacts": artifacts}))
        atomic_write_bytes(self.zoo.root / REPORT_NAME, json.dumps(self.report.to_dict(), indent=2).encode())


def _quantization_calls(jobs: dict[str, list[_QuantizationJob]]) -> dict[Hashable, tuple[Callable, _QuantizationJob]]:
    return {("int8", parent_id, job.recipe): (_quantize, job) for parent_id, parent_jobs in jobs.items() for job in parent_jobs}


def _recipes(done: dict[Hashable, Any], parent_id: str, jobs: list[_QuantizationJob]) -> dict[str, QuantizationRecipe]:
    return {job.recipe: done["int8", parent_id, job.recipe] for job in jobs}


def compress_zoo(
    zoo_dir: str | Path,
    split: DatasetSplit,
    accuracy_tolerance_points: float = 1.0,
    pruning_ratios: Sequence[float] = (0.5, 0.3),
    pruning_method: str = "l1",
    pruning_scope: str = "layer",
    fine_tuning: FineTuning = FineTuning(),
    calibration: str = "minmax",
    calibration_count: int = 256,
    int8_recipes: Sequence[str] = DEFAULT_INT8_RECIPES,
    build_model: ModelBuilder | None = None,
    timed_runs: int = 50,
    workers: int = 1,
    device: str | None = None,
) -> CompressionReport:
    """Add pruned and INT8 variants of every root fp32 card in the zoo at `zoo_dir`; see the module docstring.
    `workers` > 1 spawns processes, so a script calling it needs the `if __name__ == "__main__":` guard.
    `device` (cpu, cuda, cuda:N, auto) overrides `fine_tuning.device`; the cards record where they were tuned."""
    if not accuracy_tolerance_points >= 0:
        raise InvalidInputError(f"accuracy tolerance must be a non-negative number of points, got {accuracy_tolerance_points}", field="tolerance")
    if calibration_count < 1:
        raise InvalidInputError(f"calibration_count must be at least 1, got {calibration_count}", field="calibration_count")
    if len(split.train) == 0:  # checked before the fine-tuning, which runs ahead of any calibration
        raise CalibrationDataError("calibration data is empty: the data set's train split has no images", field="dataset")
    if workers < 1:
        raise InvalidInputError(f"workers must be at least 1, got {workers}", field="workers")
    unknown = sorted(set(int8_recipes) - set(INT8_RECIPES))
    if unknown or not int8_recipes:
        raise InvalidInputError(f"int8_recipes must name some of {sorted(INT8_RECIPES)}, got {list(int8_recipes)}", field="int8_recipes")
    if device is not None:
        fine_tuning = replace(fine_tuning, device=device)
    zoo = Zoo(zoo_dir)
    settings = _Settings(
        accuracy_tolerance_points, tuple(sorted(pruning_ratios, reverse=True)), pruning_method, pruning_scope,
        fine_tuning, calibration, calibration_count, tuple(int8_recipes), timed_runs,
    )  # fmt: skip
    roots = [card for card in zoo.cards() if card.precision == "fp32" and card.parent_id is None and not is_supernet(card)]
    with tempfile.TemporaryDirectory(prefix="fedzoo-compress-") as staging:
        compressor = _Compressor(zoo, split, build_model or default_model_builder(zoo), settings, Path(staging))
        parents = [compressor.root(card) for card in roots]
        plans = {parent.card.id: compressor.pruning_plan(parent) for parent in parents} if settings.pruning_ratios else {}
        # two batches of worker jobs (module docstring), the longest fine-tuning first; each measured once done
        by_size = sorted(parents, key=lambda parent: -parent.card.macs)
        int8_jobs = {parent.card.id: compressor.quantization_jobs(parent) for parent in parents}
        done = _run_jobs({**{("tune", p.card.id): (_prune_and_fine_tune, plans[p.card.id].first_job) for p in by_size if plans.get(p.card.id)},
                          **_quantization_calls(int8_jobs)}, workers)  # fmt: skip
        pruned = []
        for parent in parents:
            jobs = int8_jobs[parent.card.id]
            compressor.judge_int8(parent, jobs, _recipes(done, parent.card.id, jobs))
            if ("tune", parent.card.id) in done:
                variant = compressor.prune(parent, plans[parent.card.id], done["tune", parent.card.id])
                if variant is not None:
                    pruned.append(variant)
        int8_jobs = {variant.card.id: compressor.quantization_jobs(variant) for variant in pruned}
        done = _run_jobs(_quantization_calls(int8_jobs), workers)
        for variant in pruned:
            jobs = int8_jobs[variant.card.id]
            compressor.judge_int8(variant, jobs, _recipes(done, variant.card.id, jobs))
        compressor.commit()
    return compressor.report
