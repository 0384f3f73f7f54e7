"""The zoo build: one supernet training run, a latency-constrained search, and a zoo of Pareto-optimal
subnets written as ONNX models with model cards ("train once, specialise for many devices").

Stages, in order::

    data      load, split (seeded), normalise with the train split's statistics
    check     the smallest subnet must fit the constraints, else fail before any training
    train     the supernet, sandwich rule + in-place distillation, on `device`, in one process or data-parallel
              on `training_workers` (fedzoo.nas.distributed); checkpoint after every epoch
    search    evolutionary search on validation loss and latency (the preset's estimator), candidates evaluated in
              one process per core (or on Ray); checkpoint after every generation
    finetune  the chosen subnets trained jointly inside the supernet (`zoo_finetune_epochs`, fedzoo.nas.training),
              so the zoo's models start from the cloud's data spent on them, still slices of one supernet;
              no checkpoint: seeded, a resumed build repeats it   (none when the preset's epochs are 0)
    cards     extract, recalibrate BN, test accuracy, export ONNX, measure latency, write cards
    compress  pruned and INT8 variants behind the accuracy gate, fine-tuned on every core (fedzoo.compress.pipeline)   (skippable)
    graphs    a standard-op training graph for every model (fedzoo.graphs.training_graphs)   (skippable)

Checkpoints live in `<out>/.checkpoint/`; running the same build again resumes from them. Every random
draw is seeded from `BuildConfig.seed`, so two builds with the same settings train the same supernet.
`<out>/build_report.json` records the settings, the device and workers that trained, and each stage's time.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedzoo.cards import InputSpec, Latency, Metrics, ModelCard, Normalisation
from fedzoo.datasets import DatasetSplit, Subset, load_dataset, split_dataset
from fedzoo.cloud.executors import Executor, make_executor
from fedzoo.graphs.training_graphs import attach_training_graphs
from fedzoo.compress.zoo_extraction import write_supernet_card
from fedzoo.compress.pipeline import compress_zoo
from fedzoo.edge.device_profile import usable_cores
from fedzoo.errors import FedzooError, InvalidInputError
from fedzoo.nas.evaluation import Candidate, EvaluationContext, evaluate_candidate, prepare_subnet
from fedzoo.nas.latency import LatencyEstimator, make_latency_estimator
from fedzoo.nas.search import (SEARCH_STRATEGIES, Constraints, SearchState, run_search, select_zoo,
                               select_zoo_for_budgets)
from fedzoo.nas.space import FAMILY, Arch, SearchSpace, arch_hash, default_space, tiny_space
from fedzoo.nas.subnet import build_subnet, count_macs, count_params, evaluate_accuracy
from fedzoo.nas.devices import DeviceData, describe_device, resolve_device
from fedzoo.nas.distributed import join_workers, leave_workers, local_rank, newest_state, run_local_workers, \
    synchronise_batchnorm
from fedzoo.nas.supernet import Supernet
from fedzoo.nas.training import ONE_WORKER, Replica, TrainingConfig, finetune_zoo_epoch, make_optimizer, steps_per_epoch, \
    train_supernet_epoch
from fedzoo.zoo import Zoo, atomic_write_bytes

CHECKPOINT_FOLDER = ".checkpoint"
BUILD_REPORT = "build_report.json"


class BuildInterrupted(FedzooError):
    """The build stopped early on purpose (a stop-after setting); running it again resumes."""


@dataclass(frozen=True)
class Preset:
    """A named size of build: the search space, training schedule, search budget and search latency source."""

    make_space: Callable[[int], SearchSpace]
    training: TrainingConfig
    evaluations: int
    population_size: int
    calibration_examples: int
    max_train_examples: int | None = None
    latency_source: str = "measured"  # what the search ranks by (see fedzoo.nas.latency); cards are always measured


PRESETS: dict[str, Preset] = {
    # ~10 minutes on 2 cores for MNIST-5k. Two largest-subnet epochs, then the sandwich with the smallest and one
    # random student; no zoo fine-tune (not measured at this size). The search ranks by the kernel predictor, so
    # the same seed gives the same zoo, and a candidate needs no timing run: 160 of them (118 CPU s at load ~3) fill
    # the seed-0 front to the zoo's 16 (96 left it at 12).
    "default": Preset(
        default_space,
        TrainingConfig(epochs=10, sandwich_random_subnets=1, largest_only_epochs=2),
        evaluations=160,
        population_size=16,
        calibration_examples=500,
        latency_source="predicted",
    ),
    # seconds: for tests and smoke runs. Two sandwich epochs leave the searched subnets at 60-70% on MNIST-5k;
    # two epochs of the chosen subnets' joint fine-tune take them to 80-90% (docs/zoo-federated.md).
    "tiny": Preset(
        tiny_space,
        TrainingConfig(epochs=2, batch_size=16, learning_rate=0.2, max_shift_pixels=1, zoo_finetune_epochs=2),
        evaluations=16,
        population_size=8,
        calibration_examples=128,
        max_train_examples=768,
    ),
}


@dataclass(frozen=True)
class BuildConfig:
    """Everything a zoo build depends on; `None` fields take the preset's value."""

    dataset: str
    out: Path
    preset: str = "default"
    seed: int = 0
    epochs: int | None = None
    finetune_epochs: int | None = None  # the zoo's joint fine-tune after the search (the preset's when None)
    # of `epochs`, the first this many train the largest subnet alone before the sandwich rule (the preset's when
    # None): distilling from a largest that has learnt nothing yet wastes a short schedule (docs/zoo-federated.md)
    largest_only_epochs: int | None = None
    evaluations: int | None = None
    population_size: int | None = None
    strategy: str = "evolution"
    latency_budget_ms: float | None = None
    max_params: int | None = None
    latency_source: str | None = None
    executor: str = "processes"
    num_workers: int | None = None  # CPUs for parallel work: the search's executor's and the compress stage's; None = all
    zoo_min_size: int = 8
    zoo_max_size: int = 16
    # the fleet's MACs budgets, when known: the zoo is then the best searched subnet within each (min and max
    # size unused), not the Pareto front (`select_zoo_for_budgets`)
    zoo_budgets_macs: tuple[int, ...] = ()
    compress: bool = True
    training_graphs: bool = True
    # Supernet training threads. 2 on 2 cores trained MNIST 1.3x faster, but summing in another order gave another
    # supernet (10 zoo roots, best 0.970, against 13 and 0.977): 1 keeps the benchmarked one.
    torch_threads: int = 1
    stop_after_epoch: int | None = None
    stop_after_generation: int | None = None
    # where training, search evaluation, the cards' scoring and fine-tuning run (fedzoo.nas.devices)
    device: str = "auto"
    training_workers: int = 1  # data-parallel supernet training processes on this machine (fedzoo.nas.distributed)
    mixed_precision: bool = False  # bfloat16 autocast for the supernet's forward passes
    # BatchNorm over the global batch (all-reduced per layer and pass) instead of each worker's slice (the default,
    # as DDP's): one all-reduce per BatchNorm layer and pass costs more than the second worker gains on 2 CPUs
    sync_batchnorm: bool = False

    def resolved_preset(self) -> Preset:
        if self.preset not in PRESETS:
            raise InvalidInputError(f"unknown preset {self.preset!r}; use one of {sorted(PRESETS)}", field="preset")
        return PRESETS[self.preset]

    @property
    def training(self) -> TrainingConfig:
        training = self.resolved_preset().training
        if self.epochs is not None:
            training = replace(training, epochs=self.epochs)
        if self.finetune_epochs is not None:
            training = replace(training, zoo_finetune_epochs=self.finetune_epochs)
        if self.largest_only_epochs is not None:  # the user's: the preset's may exceed a shortened --epochs
            training = replace(training, largest_only_epochs=self.largest_only_epochs)
            if training.largest_only_epochs > training.epochs:
                raise InvalidInputError(f"--largest-only-epochs {training.largest_only_epochs} exceeds the supernet's "
                                        f"--epochs {training.epochs}", field="largest_only_epochs")
        return training

    @property
    def search_evaluations(self) -> int:
        return self.evaluations if self.evaluations is not None else self.resolved_preset().evaluations

    @property
    def search_population_size(self) -> int:
        return self.population_size if self.population_size is not None else self.resolved_preset().population_size

    @property
    def search_latency_source(self) -> str:
        return self.latency_source if self.latency_source is not None else self.resolved_preset().latency_source

    @property
    def constraints(self) -> Constraints:
        return Constraints(self.latency_budget_ms, self.max_params)


@dataclass
class BuildResult:
    """What a build produced, with the time each stage took (for benchmarks)."""

    zoo: Zoo
    cards: list[ModelCard]
    search: SearchState
    supernet: Supernet
    split: DatasetSplit
    normalised: dict[str, Subset]
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # CPU time per stage of this process and its worker processes: steadier than wall time on a shared machine
    stage_cpu_seconds: dict[str, float] = field(default_factory=dict)


class BuildReporter:
    """Receives progress; the CLI shows it with rich, tests pass this silent base class."""

    def start_stage(self, name: str, total: int | None = None) -> None:
        """A stage with `total` steps (None: unknown) begins."""

    def advance(self, completed: int) -> None:
        """`completed` steps of the current stage are done."""

    def note(self, text: str) -> None:
        """A one-line message worth showing."""


# data and checks ------------------------------------------------------------------------------

def _normalise(subset: Subset, mean: list[float], std: list[float]) -> Subset:
    mean_array = np.asarray(mean, dtype=np.float32)[None, :, None, None]
    std_array = np.asarray(std, dtype=np.float32)[None, :, None, None]
    return Subset(((subset.x - mean_array) / std_array).astype(np.float32), subset.y)


def prepare_data(config: BuildConfig) -> tuple[DatasetSplit, dict[str, Subset]]:
    """The seeded split and its parts normalised with the train statistics (train capped by the preset)."""
    split = split_dataset(load_dataset(config.dataset), seed=config.seed)
    parts = {name: _normalise(getattr(split, name), split.mean, split.std) for name in ("train", "validation", "test")}
    limit = config.resolved_preset().max_train_examples
    if limit is not None:
        parts["train"] = Subset(parts["train"].x[:limit], parts["train"].y[:limit])
    return split, parts


def _check_output_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {out} is a file; give a folder for the zoo", field="out")
    if out.is_dir() and any(out.iterdir()) and not (out / "zoo.json").exists() and not (out / CHECKPOINT_FOLDER).exists():
        raise InvalidInputError(f"--out {out} is a non-empty folder that is not a zoo; choose an empty or new folder", field="out")


def check_constraints_reachable(
    space: SearchSpace, num_classes: int, in_channels: int, constraints: Constraints, estimator: LatencyEstimator,
    budgets_macs: tuple[int, ...] = (),
) -> None:
    """Fail fast when even the smallest subnet breaks a limit or a tier's budget: no search could fit it."""
    smallest = build_subnet(space.min_arch(), num_classes, in_channels).eval()
    macs = count_macs(smallest, (1, in_channels, space.resolution, space.resolution))
    if budgets_macs and min(budgets_macs) < macs:
        raise InvalidInputError(
            f"no subnet fits --budget-macs {min(budgets_macs)}: the smallest subnet takes {macs} MACs",
            field="zoo_budgets_macs",
        )
    params = count_params(smallest)
    if constraints.max_params is not None and params > constraints.max_params:
        raise InvalidInputError(
            f"no subnet fits --max-params {constraints.max_params}: the smallest subnet has {params} parameters",
            field="max_params",
        )
    if constraints.latency_budget_ms is not None:
        latency_ms = estimator.latency_ms(smallest, (1, in_channels, space.resolution, space.resolution))
        if latency_ms > constraints.latency_budget_ms:
            raise InvalidInputError(
                f"no subnet fits --latency-budget-ms {constraints.latency_budget_ms}: the smallest subnet takes "
                f"{latency_ms:.3f} ms on {estimator.device_class}",
                field="latency_budget_ms",
            )


# checkpoints ---------------------------------------------------------------------------------

def _fingerprint(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _training_fingerprint(config: BuildConfig, space: SearchSpace) -> str:
    return _fingerprint({"dataset": config.dataset, "preset": config.preset, "seed": config.seed, "space": space.to_dict(), "training": asdict(config.training)})


def _search_fingerprint(config: BuildConfig, space: SearchSpace, strategy: str) -> str:
    return _fingerprint(
        {
            "training": _training_fingerprint(config, space),
            "strategy": strategy,
            "evaluations": config.search_evaluations,
            "population": config.search_population_size,
            "constraints": asdict(config.constraints),
            "latency_source": config.search_latency_source,
            "objective": "validation-loss",  # Candidate.point; earlier builds ranked by validation accuracy
        }
    )


def _torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _load_checkpoint(path: Path, fingerprint: str) -> Any | None:
    """The checkpoint at `path` if it was written by a build with these settings; an error if not."""
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False) if path.suffix == ".pt" else json.loads(path.read_text())
    if state.get("fingerprint") != fingerprint:
        raise InvalidInputError(
            f"{path} was written by a build with other settings; delete {path.parent} or use another --out",
            field="out",
        )
    return state


# stages --------------------------------------------------------------------------------------

def train_supernet(
    config: BuildConfig, space: SearchSpace, parts: dict[str, Subset], num_classes: int, in_channels: int, reporter: BuildReporter,
    device: torch.device = torch.device("cpu"), replica: Replica = ONE_WORKER,
) -> Supernet:
    """The trained supernet (on the CPU, in eval mode), resumed from the last epoch checkpoint if there is one.
    With several workers (`replica`), each trains on its slice of every batch; each machine's first worker
    writes the checkpoint, and a restarted group resumes from the newest copy any worker holds."""
    training = config.training
    checkpoint = config.out / CHECKPOINT_FOLDER / "supernet.pt"
    fingerprint = _training_fingerprint(config, space)
    torch.manual_seed(config.seed)
    supernet = Supernet(space, num_classes, in_channels).to(memory_format=torch.channels_last)
    if replica.world_size > 1 and config.sync_batchnorm:
        synchronise_batchnorm(supernet)
    supernet.to(device)
    optimizer = make_optimizer(supernet, training)
    first_epoch = 0
    state = _load_checkpoint(checkpoint, fingerprint)
    if replica.world_size > 1:
        state = newest_state(state)
    if state is not None:
        supernet.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"]
        reporter.note(f"resuming supernet training after epoch {first_epoch} of {training.epochs}")
    writes_checkpoints = replica.world_size == 1 or local_rank() == 0
    train = DeviceData.place(parts["train"].x, parts["train"].y, device)
    for epoch in range(first_epoch, training.epochs):
        reporter.start_stage(f"train supernet, epoch {epoch + 1}/{training.epochs}", steps_per_epoch(len(train), training.batch_size))
        loss = train_supernet_epoch(
            supernet, optimizer, train, None, training, config.seed, epoch,
            on_step=lambda done, total: reporter.advance(done), replica=replica, mixed_precision=config.mixed_precision,
        )
        if writes_checkpoints:
            model_state = {name: value.cpu() for name, value in supernet.state_dict().items()}
            state = {"fingerprint": fingerprint, "epoch": epoch + 1, "model": model_state, "optimizer": optimizer.state_dict()}
            atomic_write_bytes(checkpoint, _torch_bytes(state))
        reporter.note(f"epoch {epoch + 1}/{training.epochs}: largest-subnet train loss {loss:.4f}")
        if config.stop_after_epoch is not None and epoch + 1 >= config.stop_after_epoch and epoch + 1 < training.epochs:
            raise BuildInterrupted(f"stopped after epoch {epoch + 1} as asked; run the same build again to resume")
    trained = Supernet(space, num_classes, in_channels).to(memory_format=torch.channels_last)
    trained.load_state_dict(supernet.state_dict())  # plain BatchNorm and the CPU, for the search's workers
    return trained.eval()


def train_supernet_worker(config: BuildConfig, reporter: BuildReporter | None = None) -> int:
    """One data-parallel worker's share of the training stage, in a process torchrun (or `run_local_workers`)
    started: join the others, train, leave. Returns the epochs the checkpoint now holds (fewer than the
    schedule's when the build was asked to stop early). Every worker loads and splits the data itself."""
    reporter = reporter or BuildReporter()
    device = resolve_device(config.device, local_rank())
    workers_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if device.type == "cuda" and workers_here > torch.cuda.device_count():
        raise InvalidInputError(
            f"{workers_here} workers on a machine with {torch.cuda.device_count()} GPUs: give each worker its own GPU "
            "(fewer workers, or --device cpu)", field="workers",
        )
    torch.set_num_threads(config.torch_threads)
    split, parts = prepare_data(config)
    channels, height, _ = split.dataset.image_shape
    space = config.resolved_preset().make_space(height)
    replica = join_workers(device)
    try:
        train_supernet(config, space, parts, split.dataset.num_classes, channels, reporter, device, replica)
    except BuildInterrupted:
        pass  # the checkpoint holds the epochs done; the caller reports the stop
    finally:
        leave_workers()
    return trained_epochs(config, space)


def trained_epochs(config: BuildConfig, space: SearchSpace) -> int:
    """The epochs this build's supernet checkpoint holds (0 without one)."""
    saved = _load_checkpoint(config.out / CHECKPOINT_FOLDER / "supernet.pt", _training_fingerprint(config, space))
    return 0 if saved is None else int(saved["epoch"])


def _train_on_local_workers(config: BuildConfig, reporter: BuildReporter) -> None:
    """The training stage in `config.training_workers` processes on this machine (each restarted from the last
    checkpoint, up to 3 times, when one dies)."""
    reporter.start_stage(f"train supernet on {config.training_workers} workers", None)
    epochs_done = run_local_workers(train_supernet_worker, (config,), config.training_workers)[0]
    if epochs_done < config.training.epochs:
        raise BuildInterrupted(f"stopped after epoch {epochs_done} as asked; run the same build again to resume")


def finetune_zoo(
    config: BuildConfig, supernet: Supernet, members: list[Arch], train: Subset, reporter: BuildReporter,
    device: torch.device = torch.device("cpu"),
) -> Supernet:
    """A copy of `supernet` after `zoo_finetune_epochs` of its `members`' joint fine-tune (smallest first), on
    the build's training examples with its optimiser settings and a fresh schedule (on the CPU, in eval mode)."""
    training = config.training
    tuned = Supernet(supernet.space, supernet.num_classes, supernet.in_channels).to(memory_format=torch.channels_last)
    tuned.load_state_dict(supernet.state_dict())
    tuned.to(device)
    optimizer = make_optimizer(tuned, training)
    data = DeviceData.place(train.x, train.y, device)
    for epoch in range(training.zoo_finetune_epochs):
        reporter.start_stage(f"fine-tune the zoo's {len(members)} subnets, epoch {epoch + 1}/{training.zoo_finetune_epochs}",
                             steps_per_epoch(len(data), training.batch_size))
        loss = finetune_zoo_epoch(tuned, optimizer, data, None, members, training, config.seed, epoch,
                                  on_step=lambda done, total: reporter.advance(done), mixed_precision=config.mixed_precision)
        reporter.note(f"zoo fine-tune epoch {epoch + 1}/{training.zoo_finetune_epochs}: largest chosen subnet's train loss {loss:.4f}")
    return tuned.cpu().eval()


def search_architectures(
    config: BuildConfig,
    strategy_name: str,
    context: EvaluationContext,
    executor: Executor,
    reporter: BuildReporter,
    checkpoint_name: str | None = None,
) -> SearchState:
    """Run one search strategy on the trained supernet, resuming from its generation checkpoint."""
    if strategy_name not in SEARCH_STRATEGIES:
        raise InvalidInputError(f"unknown search strategy {strategy_name!r}; use one of {sorted(SEARCH_STRATEGIES)}", field="strategy")
    strategy = SEARCH_STRATEGIES[strategy_name](config.search_population_size)
    checkpoint = config.out / CHECKPOINT_FOLDER / f"{checkpoint_name or 'search-' + strategy_name}.json"
    supernet = context.supernet
    fingerprint = _search_fingerprint(config, supernet.space, strategy_name)
    saved = _load_checkpoint(checkpoint, fingerprint)
    state_holder = [SearchState.from_dict(saved["state"]) if saved is not None else SearchState()]
    if saved is not None:
        reporter.note(f"resuming {strategy_name} search after generation {state_holder[0].generation} "
                      f"({len(state_holder[0].evaluated)} evaluated)")
    constraints = config.constraints
    total = config.search_evaluations
    reporter.start_stage(f"{strategy_name} search", total)

    def admissible(arch: Arch) -> bool:
        if constraints.max_params is None:
            return True
        return count_params(build_subnet(arch, supernet.num_classes, supernet.in_channels)) <= constraints.max_params

    def evaluate_batch(archs: list[Arch]) -> list[Candidate]:
        already = len(state_holder[0].evaluated)
        return executor.map(evaluate_candidate, context, archs, on_result=lambda done: reporter.advance(already + done))

    def on_generation(new_state: SearchState) -> None:
        state_holder[0] = new_state
        atomic_write_bytes(checkpoint, json.dumps({"fingerprint": fingerprint, "state": new_state.to_dict()}).encode())
        feasible = [c for c in new_state.evaluated if constraints.fits(c)]
        best = max((c.accuracy for c in feasible), default=float("nan"))
        lowest_loss = min((c.loss for c in feasible), default=float("nan"))
        reporter.note(f"{strategy_name} generation {new_state.generation}: {len(new_state.evaluated)} evaluated, "
                      f"{len(feasible)} feasible, best validation accuracy {best:.4f}, lowest validation loss {lowest_loss:.4f}")
        if config.stop_after_generation is not None and new_state.generation >= config.stop_after_generation and len(new_state.evaluated) < total:
            raise BuildInterrupted(f"stopped after search generation {new_state.generation} as asked; run the same build again to resume")

    return run_search(
        strategy, supernet.space, evaluate_batch, total, config.search_population_size, constraints, config.seed,
        admissible=admissible, state=state_holder[0], on_generation=on_generation,
    )


def write_card(
    zoo: Zoo,
    config: BuildConfig,
    split: DatasetSplit,
    parts: dict[str, Subset],
    supernet: Supernet,
    candidate: Candidate,
    device_class: str,
    details: dict[str, Any],
) -> ModelCard:
    """Extract one zoo subnet, score it on the test split, export and time its ONNX, and store its card."""
    from fedzoo.nas.export import export_onnx
    from fedzoo.edge.benchmark import benchmark_model

    calibration = parts["train"].x[: max(config.resolved_preset().calibration_examples * 4, 1)]
    subnet = prepare_subnet(supernet, candidate.arch, calibration, resolve_device(config.device))
    accuracy, loss = evaluate_accuracy(subnet, parts["test"].x, parts["test"].y)
    subnet = subnet.cpu().to(memory_format=torch.contiguous_format)  # plain layout for the saved state and the export
    channels, height, width = split.dataset.image_shape
    input_shape = (1, channels, height, width)
    with tempfile.TemporaryDirectory() as folder:
        onnx_path = Path(folder) / "model.onnx"
        export_onnx(subnet, input_shape, onnx_path)
        measurement = benchmark_model(onnx_path, threads=1)
        model_sha = zoo.add_blob_file(onnx_path)
        size_bytes = onnx_path.stat().st_size
    state_sha = zoo.add_blob_bytes(_torch_bytes(subnet.state_dict()))
    card = ModelCard(
        id=f"{split.dataset.name}-ofa-{arch_hash(candidate.arch)}",
        family=FAMILY,
        task=split.dataset.name,
        input=InputSpec(name="input", shape=["batch", channels, height, width], normalisation=Normalisation(mean=split.mean, std=split.std)),
        labels=split.dataset.labels,
        arch=candidate.arch,
        precision="fp32",
        metrics=Metrics(accuracy=accuracy, loss=loss, split="test", num_examples=len(parts["test"].y)),
        macs=count_macs(subnet, input_shape),
        params=count_params(subnet),
        size_bytes=size_bytes,
        sha256=model_sha,
        latency_ms={device_class: Latency(median_ms=measurement.median_ms, p90_ms=measurement.p90_ms, source="measured", threads=1)},
        artifacts={"torch_state": state_sha},
        details={**details, "search": {"validation_accuracy": candidate.accuracy, "latency_ms": candidate.latency_ms}},
    )
    zoo.add_card(card)
    return card


def _cpu_seconds() -> float:
    """CPU time of this process and of its child processes that have ended (a stage's workers end with it)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@contextmanager
def _timed(stage: str, seconds: dict[str, float], cpu_seconds: dict[str, float]) -> Iterator[None]:
    """Record the wall and CPU seconds the block takes as `stage` (kept only if the block succeeds)."""
    started, started_cpu = time.perf_counter(), _cpu_seconds()
    yield
    seconds[stage] = time.perf_counter() - started
    cpu_seconds[stage] = _cpu_seconds() - started_cpu


def build_zoo(
    config: BuildConfig, reporter: BuildReporter | None = None, latency_estimator: LatencyEstimator | None = None
) -> BuildResult:
    """Run every stage of the build (see the module docstring) and return the zoo and its cards. The
    search's "processes" executor and the compress stage spawn processes, so a script calling this needs the
    `if __name__ == "__main__":` guard (without it, the spawned workers run the script again)."""
    reporter = reporter or BuildReporter()
    _check_output_folder(config.out)
    preset = config.resolved_preset()
    device = resolve_device(config.device)
    if config.training_workers < 1:
        raise InvalidInputError(f"training_workers must be at least 1, got {config.training_workers}", field="workers")
    Replica(0, config.training_workers).local_batch_size(config.training.batch_size)  # fails now if the batch does not split evenly
    estimator = latency_estimator or make_latency_estimator(config.search_latency_source)
    if config.strategy not in SEARCH_STRATEGIES:
        raise InvalidInputError(f"unknown search strategy {config.strategy!r}; use one of {sorted(SEARCH_STRATEGIES)}", field="strategy")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.torch_threads)
    seconds: dict[str, float] = {}
    cpu_seconds: dict[str, float] = {}
    try:
        with _timed("data", seconds, cpu_seconds):
            reporter.start_stage("load data", None)
            split, parts = prepare_data(config)
            channels, height, width = split.dataset.image_shape
            if height != width:
                raise InvalidInputError(f"the search space needs square images, got {height}x{width}", field="dataset")
            space = preset.make_space(height)
            num_classes = split.dataset.num_classes
            check_constraints_reachable(space, num_classes, channels, config.constraints, estimator, config.zoo_budgets_macs)
            config.out.mkdir(parents=True, exist_ok=True)

        with _timed("train", seconds, cpu_seconds):
            if config.training_workers > 1 and trained_epochs(config, space) < config.training.epochs:
                _train_on_local_workers(config, reporter)
            supernet = train_supernet(config, space, parts, num_classes, channels, reporter, device)  # resumes

        with _timed("search", seconds, cpu_seconds):
            context = EvaluationContext(supernet, parts["train"].x[: preset.calibration_examples], parts["validation"].x,
                                        parts["validation"].y, estimator, device=str(device))
            # candidates timed side by side would be timed under each other's load: measured latency runs them one by one
            workers = 1 if estimator.source == "measured" and config.executor == "processes" else config.num_workers
            executor = make_executor(config.executor, workers)
            try:
                state = search_architectures(config, config.strategy, context, executor, reporter)
            finally:
                executor.close()
            if config.zoo_budgets_macs:
                chosen = select_zoo_for_budgets(state.evaluated, config.constraints, config.zoo_budgets_macs)
            else:
                chosen = select_zoo(state.evaluated, config.constraints, config.zoo_min_size, config.zoo_max_size)
            if not chosen:
                raise InvalidInputError(
                    f"no evaluated subnet met the constraints ({asdict(config.constraints)}); relax --latency-budget-ms or --max-params",
                    field="latency_budget_ms",
                )

        if config.training.zoo_finetune_epochs:
            with _timed("finetune", seconds, cpu_seconds):
                members = [candidate.arch for candidate in sorted(chosen, key=lambda candidate: candidate.macs)]
                supernet = finetune_zoo(config, supernet, members, parts["train"], reporter, device)

        with _timed("cards", seconds, cpu_seconds):
            zoo = Zoo.create(config.out)
            details = {
                "build": {"seed": config.seed, "preset": config.preset, "strategy": config.strategy, "epochs": config.training.epochs,
                          "zoo_finetune_epochs": config.training.zoo_finetune_epochs, "evaluations": len(state.evaluated),
                          "search_latency_source": estimator.source,
                          "train_examples": len(parts["train"].y), **_training_setup(config, device)},
            }
            reporter.start_stage("write cards", len(chosen))
            cards = []
            for index, candidate in enumerate(chosen):
                cards.append(write_card(zoo, config, split, parts, supernet, candidate, estimator.device_class, details))
                reporter.advance(index + 1)
            # the zoo carries its supernet, which zoo-wide federated plans improve (docs/zoo-federated.md)
            largest = prepare_subnet(supernet, space.max_arch(), parts["train"].x[: preset.calibration_examples])
            accuracy, loss = evaluate_accuracy(largest, parts["test"].x, parts["test"].y)
            write_supernet_card(zoo, supernet.to(memory_format=torch.contiguous_format), cards[0],
                                Metrics(accuracy=accuracy, loss=loss, split="test", num_examples=len(parts["test"].y)))

        # the fine-tuning after pruning (97% of the compress stage's time, measured) is training too: it runs
        # with the build's thread count, not torch's default of one thread per core
        if config.compress:
            with _timed("compress", seconds, cpu_seconds):
                reporter.start_stage("compress", None)
                compress_zoo(config.out, split, workers=config.num_workers or usable_cores(), device=str(device))
        if config.training_graphs:
            with _timed("training graphs", seconds, cpu_seconds):
                reporter.start_stage("training graphs", None)
                attach_training_graphs(config.out)
    finally:
        torch.set_num_threads(previous_threads)
    write_build_report(config, device, len(parts["train"].y), seconds, cpu_seconds)
    return BuildResult(zoo, cards, state, supernet, split, parts, seconds, cpu_seconds)


def _training_setup(config: BuildConfig, device: torch.device) -> dict[str, Any]:
    """Where and how the supernet trained, for the cards and the build report."""
    return {**describe_device(device), "training_workers": config.training_workers, "mixed_precision": config.mixed_precision,
            "sync_batchnorm": config.sync_batchnorm}


def write_build_report(config: BuildConfig, device: torch.device, train_examples: int, seconds: dict[str, float],
                       cpu_seconds: dict[str, float]) -> None:
    """`<out>/build_report.json`: the settings, the training setup and each stage's wall and CPU seconds (of
    this run: a resumed build's stages took less)."""
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in asdict(config).items()}
    report = {"settings": settings, "training": _training_setup(config, device), "stage_seconds": seconds,
              "stage_cpu_seconds": cpu_seconds, "train_examples": train_examples}
    atomic_write_bytes(config.out / BUILD_REPORT, json.dumps(report, indent=2).encode())
