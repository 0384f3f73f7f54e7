"""Benchmark of compress/: INT8 vs fp32 (size, batch-1 ORT CPU latency, accuracy) and channel pruning
(MACs removed within a 1-point accuracy drop) on a zoo of MNIST models, all measured in this one run.

    .venv/bin/python bench/compress_int8_pruning.py            # builds a 3-model MNIST zoo first
    .venv/bin/python bench/compress_int8_pruning.py --zoo DIR  # or compresses a copy of an existing zoo's roots

Every figure is printed next to `os.getloadavg()`: the machine is shared and timings move with its load.

Goals (issue 4): INT8 size <= 0.3x, latency <= 0.7x, accuracy drop <= 0.5 point; pruning >= 40% fewer
MACs at <= 1.0 point drop.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from fedzoo.cards import InputSpec, Latency, Metrics, ModelCard, Normalisation
from fedzoo.compress.compact import compact_model
from fedzoo.compress.finetune import FineTuning, fine_tune
from fedzoo.compress.macs import count_cost
from fedzoo.compress.measure import DEVICE_CLASS, evaluate_onnx, normalise
from fedzoo.compress.pipeline import CompressionReport, VariantOutcome, compress_zoo
from fedzoo.compress.quantize import DEFAULT_INT8_RECIPES, quantize_int8
from fedzoo.datasets import DatasetSplit, load_dataset, split_dataset
from fedzoo.edge.benchmark import benchmark_model, benchmark_models_interleaved
from fedzoo.nas.export import export_checked
from fedzoo.nas.subnet import build_subnet
from fedzoo.zoo import Zoo

TRAIN_EPOCHS = 5
# fp32 and int8 timed in this many interleaved rounds of 2 runs each. With 5 alternations of 100 runs, an
# INT8 file timed here and by the compress stage minutes earlier differed by up to 1.6x (0.149 vs 0.240 ms)
# on a VM whose speed moves within seconds; the fleet bench's sessions repeat within 10% at 300 rounds.
LATENCY_ROUNDS = 300
GOALS = {"int8_size": 0.3, "int8_latency": 0.7, "int8_drop_points": 0.5, "pruning_macs_reduction": 0.40}


def mnist_arch(depth: int, kernel: int, expand_ratio: int) -> dict:
    """A subnet of the default MNIST space (stem 16 stride 2, stages 16/24/40/64, head 128)."""
    stages = [(16, 1, "relu6"), (24, 2, "relu6"), (40, 2, "hswish"), (64, 1, "hswish")]
    return {
        "family": "ofa-mbv2", "stem_channels": 16, "stem_stride": 2, "stem_activation": "relu6",
        "head_channels": 128, "head_activation": "hswish",
        "stages": [
            {"out_channels": width, "stride": stride, "activation": activation,
             "kernels": [kernel] * depth, "expand_ratios": [expand_ratio] * depth}
            for width, stride, activation in stages
        ],
    }  # fmt: skip


ARCHS = {"mnist-d1k3e3": mnist_arch(1, 3, 3), "mnist-d2k3e3": mnist_arch(2, 3, 3), "mnist-d2k3e4": mnist_arch(2, 3, 4)}


def wide_arch(activation: str, width: float = 1.0) -> dict:
    """A larger subnet (stem stride 1, depth 3, expand 6; widths 32-128 times `width`, ~90 M MACs at 1.0),
    to find the model size at which INT8 starts to pay."""
    arch = mnist_arch(3, 3, 6)
    arch.update(stem_channels=round(32 * width), stem_stride=1, head_channels=round(256 * width), head_activation=activation)
    for stage, channels in zip(arch["stages"], (32, 48, 80, 128)):
        stage.update(out_channels=round(channels * width), activation=activation)
    return arch


def compacted_copy(path: Path, scratch: Path) -> Path:
    """The fp32 parent cleaned like the INT8 files are (names, value_info, docs), so the size ratio is fair."""
    target = scratch / f"{path.stem}-compact.onnx"
    onnx.save(compact_model(onnx.load(str(path))), str(target))
    return target


def size_breakdown(path: Path) -> dict[str, int]:
    """Bytes of an ONNX file by what they hold: weights, biases, scales, zero points, and the graph itself."""
    model = onnx.load(str(path))
    parts = {"int8 weights": 0, "int32 biases": 0, "fp32 weights+biases": 0, "fp32 scales": 0, "zero points": 0}
    consumer_slot = {name: (node.op_type, slot) for node in model.graph.node for slot, name in enumerate(node.input)}
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        op_type, slot = consumer_slot.get(tensor.name, ("", 0))
        if array.dtype == np.int8 and array.ndim > 1:
            parts["int8 weights"] += array.nbytes
        elif array.dtype == np.int32 and op_type in ("DequantizeLinear", "QLinearConv", "QGemm") and (op_type != "DequantizeLinear" or slot == 0):
            parts["int32 biases"] += array.nbytes
        elif array.dtype == np.float32 and op_type in ("Conv", "Gemm") and slot > 0:
            parts["fp32 weights+biases"] += array.nbytes
        elif array.dtype == np.float32:
            parts["fp32 scales"] += array.nbytes
        else:
            parts["zero points"] += array.nbytes
    parts["graph (nodes, names, headers)"] = path.stat().st_size - sum(parts.values())
    return parts


def build_zoo(root: Path, split: DatasetSplit) -> None:
    """Train each arch for a few epochs and add it as a root fp32 card with its torch_state."""
    zoo = Zoo.create(root)
    normalisation = Normalisation(mean=split.mean, std=split.std)
    train_x, test_x = normalise(split.train.x, normalisation), normalise(split.test.x, normalisation)
    input_shape = (1, *split.dataset.image_shape)
    for card_id, arch in ARCHS.items():
        started = time.perf_counter()
        torch.manual_seed(0)
        model = build_subnet(arch, split.dataset.num_classes, split.dataset.image_shape[0])
        fine_tune(model, train_x, split.train.y, FineTuning(epochs=TRAIN_EPOCHS, learning_rate=3e-3, distillation_weight=0))
        path = root / f"{card_id}.onnx"
        export_checked(model, input_shape, path, test_x[:16])
        accuracy, loss = evaluate_onnx(path, test_x, split.test.y)
        state = io.BytesIO()
        torch.save(model.state_dict(), state)
        cost = count_cost(model, input_shape)
        latency = benchmark_model(path, threads=1)
        zoo.add_card(
            ModelCard(
                id=card_id, family="ofa-mbv2", task=split.dataset.name,
                input=InputSpec(name="input", shape=["batch", *split.dataset.image_shape], normalisation=normalisation),
                labels=split.dataset.labels, arch=arch,
                metrics=Metrics(accuracy=accuracy, loss=loss, num_examples=len(split.test)),
                macs=cost.macs, params=cost.params, size_bytes=path.stat().st_size, sha256=zoo.add_blob_file(path),
                latency_ms={DEVICE_CLASS: Latency(median_ms=latency.median_ms, p90_ms=latency.p90_ms, source="measured", threads=1)},
                artifacts={"torch_state": zoo.add_blob_bytes(state.getvalue())},
            )
        )  # fmt: skip
        path.unlink()
        print(f"trained {card_id}: {cost.macs / 1e6:.2f} M MACs, {cost.params} params, test accuracy {accuracy:.2%} "
              f"({time.perf_counter() - started:.0f} s)")  # fmt: skip


def drop_variants(zoo: Zoo) -> None:
    """Remove the cards of compressed variants a copied zoo already holds, so every figure comes from this run."""
    for card in zoo.cards():
        if card.parent_id is not None:
            (zoo.root / "cards" / f"{card.id}.json").unlink()


def side_by_side_latency_ms(first: Path, second: Path) -> tuple[float, float]:
    """Median batch-1 latency of two models, timed in interleaved rounds so both see the same machine load."""
    latency = benchmark_models_interleaved(
        {"first": first, "second": second}, threads=1, rounds=LATENCY_ROUNDS, runs_per_round=2
    )
    return latency["first"].median_ms, latency["second"].median_ms


def load_average() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def outcome(report: CompressionReport, variant_id: str) -> VariantOutcome | None:
    return next((o for o in report.accepted + report.rejected if o.variant_id == variant_id), None)


def print_tables(zoo: Zoo, report: CompressionReport, roots: list[ModelCard], scratch: Path) -> None:
    print(f"\nINT8 (static, per-channel int8 weights with reduce_range, MinMax on 256 train images; recipe picked per model "
          f"by measurement among {', '.join(DEFAULT_INT8_RECIPES)}) vs fp32, ORT CPU 1 thread, batch 1; {load_average()}")  # fmt: skip
    print("fp32 KB: the zoo's file; fp32c KB: the same model compacted like the INT8 file (size = int8 / fp32c)")
    header = (f"{'model':<18} {'MMACs':>6} {'recipe':<23} {'fp32 KB':>8} {'fp32c KB':>8} {'int8 KB':>8} {'size':>7} {'fp32 ms':>8} "
              f"{'int8 ms':>8} {'latency':>8} {'fp32 acc':>9} {'int8 acc':>9} {'drop pt':>8}  verdict")  # fmt: skip
    print(header)
    breakdowns = {}
    for root in roots:
        int8 = outcome(report, f"{root.id}-int8")
        if int8 is None or int8.measurement is None:
            print(f"{root.id:<14} (no INT8 variant measured)")
            continue
        fp32_measured, int8_measured = int8.parent_measurement, int8.measurement
        recipe = int8.notes[0].split()[1]
        fp32_compact = compacted_copy(zoo.model_path(root), scratch)
        int8_path = zoo.model_path(zoo.card(int8.variant_id)) if int8.accepted else None
        if int8_path is not None:
            fp32_ms, int8_ms = side_by_side_latency_ms(zoo.model_path(root), int8_path)
            breakdowns[root.id] = (size_breakdown(fp32_compact), size_breakdown(int8_path))
        else:
            fp32_ms, int8_ms = fp32_measured["latency_median_ms"], int8_measured["latency_median_ms"]
        drop = (fp32_measured["accuracy"] - int8_measured["accuracy"]) * 100
        verdict = "accepted" if int8.accepted else "rejected: " + "; ".join(int8.reasons)
        compact_bytes = fp32_compact.stat().st_size
        print(
            f"{root.id:<18} {root.macs / 1e6:>6.2f} {recipe:<23} {fp32_measured['size_bytes'] / 1024:>8.1f} {compact_bytes / 1024:>8.1f} "
            f"{int8_measured['size_bytes'] / 1024:>8.1f} {int8_measured['size_bytes'] / compact_bytes:>6.3f}x {fp32_ms:>8.3f} {int8_ms:>8.3f} "
            f"{int8_ms / fp32_ms:>7.2f}x {fp32_measured['accuracy']:>9.2%} {int8_measured['accuracy']:>9.2%} {drop:>8.2f}  {verdict}"
        )  # fmt: skip
        print(f"{'':<14} recipes tried: {int8.notes[0].split('(tried ', 1)[1].rstrip(')')}")
    print("\nSize breakdown in bytes (fp32c / int8); floor = (int8 weights + int32 biases + fp32 scales) / fp32 weights+biases")
    for model_id, (fp32_parts, int8_parts) in breakdowns.items():
        floor = (int8_parts["int8 weights"] + int8_parts["int32 biases"] + int8_parts["fp32 scales"]) / fp32_parts["fp32 weights+biases"]
        listed = ", ".join(f"{name} {fp32_parts[name]}/{int8_parts[name]}" for name in int8_parts)
        print(f"{model_id:<14} {listed}; floor {floor:.2f}x")
    print(f"\nChannel pruning (L1, per layer) + fine-tuning with distillation; gate: accuracy drop <= 1.0 point; {load_average()}")
    print(f"{'model':<14} {'ratio':>5} {'MMACs':>6} {'pruned':>7} {'MACs cut':>8} {'fp32 acc':>9} {'pruned acc':>10} {'drop pt':>8}  verdict")
    for root in roots:
        tried = [o for o in report.accepted + report.rejected if o.kind == "pruned" and o.parent_id == root.id and o.measurement]
        tried.sort(key=lambda o: o.variant_id.rsplit("-p", 1)[1], reverse=True)  # largest ratio first, as tried
        for pruned in tried:
            macs_cut = next(note for note in pruned.notes if note.startswith("MACs -"))[len("MACs -") :]
            drop = (pruned.parent_measurement["accuracy"] - pruned.measurement["accuracy"]) * 100
            ratio = pruned.variant_id.rsplit("-p", 1)[1]
            pruned_macs = f"{zoo.card(pruned.variant_id).macs / 1e6:.2f}" if pruned.accepted else "-"
            verdict = "accepted" if pruned.accepted else "rejected"
            print(f"{root.id:<14} {'0.' + ratio:>5} {root.macs / 1e6:>6.2f} {pruned_macs:>7} {macs_cut:>8} "
                  f"{pruned.parent_measurement['accuracy']:>9.2%} {pruned.measurement['accuracy']:>10.2%} {drop:>8.2f}  {verdict}")  # fmt: skip
    print("\nGoals: INT8 size <= 0.3x, latency <= 0.7x, drop <= 0.5 point; pruning >= 40% fewer MACs at <= 1.0 point drop")


def print_scaling(split: DatasetSplit, scratch: Path) -> None:
    """INT8 latency/size on larger untrained subnets, to show at what size the ratio is met and what hswish costs."""
    print(f"\nINT8 (qoperator-u8s8) vs fp32 on larger, UNTRAINED subnets (latency and size only; fp32 compacted); {load_average()}")
    print(f"{'subnet':<22} {'MMACs':>6} {'fp32c KB':>8} {'int8 KB':>8} {'size':>6} {'fp32 ms':>8} {'int8 ms':>8} {'latency':>8}")
    normalisation = Normalisation(mean=split.mean, std=split.std)
    calibration = normalise(split.train.x[:256], normalisation)
    for activation, width in (("relu6", 0.25), ("relu6", 0.5), ("relu6", 1.0), ("hswish", 1.0)):
        name = f"wide{width:g}-{activation}"
        torch.manual_seed(0)
        model = build_subnet(wide_arch(activation, width), split.dataset.num_classes, split.dataset.image_shape[0]).eval()
        fp32, int8 = scratch / f"{name}.onnx", scratch / f"{name}-int8.onnx"
        export_checked(model, (1, *split.dataset.image_shape), fp32, calibration[:4])
        quantize_int8(fp32, int8, calibration, quant_format="qoperator")
        fp32_ms, int8_ms = side_by_side_latency_ms(fp32, int8)
        macs = count_cost(model, (1, *split.dataset.image_shape)).macs
        fp32_bytes, int8_bytes = compacted_copy(fp32, scratch).stat().st_size, int8.stat().st_size
        print(f"{name:<22} {macs / 1e6:>6.1f} {fp32_bytes / 1024:>8.1f} {int8_bytes / 1024:>8.1f} "
              f"{int8_bytes / fp32_bytes:>5.2f}x {fp32_ms:>8.3f} {int8_ms:>8.3f} {int8_ms / fp32_ms:>7.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=None, help="compress a copy of this zoo instead of building one")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    split = split_dataset(load_dataset("mnist"), seed=0)
    with tempfile.TemporaryDirectory(prefix="fedzoo-bench-compress-") as scratch:
        root = Path(scratch) / "zoo"
        if arguments.zoo is not None:
            shutil.copytree(arguments.zoo, root)
            drop_variants(Zoo(root))
        else:
            build_zoo(root, split)
        zoo = Zoo(root)
        roots = [card for card in zoo.cards() if card.parent_id is None and card.precision == "fp32"]
        compress_started = time.perf_counter()
        report = compress_zoo(root, split, accuracy_tolerance_points=1.0, pruning_ratios=(0.5, 0.3), timed_runs=100)
        print(f"compress_zoo on {len(roots)} models: {time.perf_counter() - compress_started:.0f} s, "
              f"{len(report.accepted)} accepted, {len(report.rejected)} rejected")  # fmt: skip
        print_tables(zoo, report, roots, Path(scratch))
        print_scaling(split, Path(scratch))
    print(f"\ntotal {time.perf_counter() - started:.0f} s; {load_average()}")


if __name__ == "__main__":
    main()
