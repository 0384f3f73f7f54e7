"""The accuracy gate: a variant is published only if it stays within an accuracy tolerance of its
parent and beats it on latency or on size. Rules are a table; every failed rule gives a reason."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from fedzoo.compress.measure import Measurement

# Latency is noisy on a shared machine: a variant must be this much faster for it to count as faster.
LATENCY_MARGIN = 0.05


@dataclass(frozen=True)
class GateDecision:
    accepted: bool
    reasons: list[str]  # why it was rejected (empty when accepted)
    notes: list[str]  # what it gained, for the log and the report


def _accuracy_drop_points(variant: Measurement, parent: Measurement) -> float:
    return (parent.accuracy - variant.accuracy) * 100.0


def _is_faster(variant: Measurement, parent: Measurement) -> bool:
    return variant.latency_median_ms < parent.latency_median_ms * (1.0 - LATENCY_MARGIN)


def _is_smaller(variant: Measurement, parent: Measurement) -> bool:
    return variant.size_bytes < parent.size_bytes


# (rule name, passes(variant, parent, tolerance_points), reason when it fails)
GATE_RULES: list[tuple[str, Callable[[Measurement, Measurement, float], bool], Callable[[Measurement, Measurement, float], str]]] = [
    (
        "accuracy",
        lambda variant, parent, tolerance: _accuracy_drop_points(variant, parent) <= tolerance,
        lambda variant, parent, tolerance: (
            f"accuracy {variant.accuracy:.2%} is {_accuracy_drop_points(variant, parent):.2f} points below the parent's "
            f"{parent.accuracy:.2%} (tolerance {tolerance:.2f})"
        ),
    ),
    (
        "gain",
        lambda variant, parent, _tolerance: _is_faster(variant, parent) or _is_smaller(variant, parent),
        lambda variant, parent, _tolerance: (
            f"neither faster ({variant.latency_median_ms:.3f} ms vs {parent.latency_median_ms:.3f} ms, needs "
            f"{LATENCY_MARGIN:.0%} less) nor smaller ({variant.size_bytes} vs {parent.size_bytes} bytes)"
        ),
    ),
]


def judge(variant: Measurement, parent: Measurement, tolerance_points: float = 1.0) -> GateDecision:
    """Apply every gate rule to a variant measured side by side with its parent."""
    reasons = [reason(variant, parent, tolerance_points) for _name, passes, reason in GATE_RULES if not passes(variant, parent, tolerance_points)]
    notes = [
        f"size {variant.size_bytes / parent.size_bytes:.2f}x",
        f"latency {variant.latency_median_ms / parent.latency_median_ms:.2f}x",
        f"accuracy drop {_accuracy_drop_points(variant, parent):+.2f} points",
    ]
    if not reasons and not _is_faster(variant, parent):
        notes.append("not faster than its parent: kept for its size only")
    return GateDecision(accepted=not reasons, reasons=reasons, notes=notes)


def pick_fastest(
    candidates: dict[str, Measurement],
    parent: Measurement,
    tolerance_points: float = 1.0,
    kernel_signatures: Mapping[str, Hashable] | None = None,
) -> str:
    """The candidate to put before the gate: among those within the accuracy tolerance, the fastest, and of
    those within LATENCY_MARGIN of it the smallest; if none is accurate enough, the most accurate.

    Candidates with equal `kernel_signatures` run the same kernels, so they are credited the best latency
    measured among them: a gap between two timings of one kernel list is machine noise (on the zoo it
    exceeded LATENCY_MARGIN), and it must not hand the pick to the larger file."""
    accurate = {name: m for name, m in candidates.items() if _accuracy_drop_points(m, parent) <= tolerance_points}
    if not accurate:
        return max(candidates, key=lambda name: candidates[name].accuracy)
    signatures = kernel_signatures or {}

    def latency_ms(name: str) -> float:
        signature = signatures.get(name, (name,))
        return min(m.latency_median_ms for other, m in accurate.items() if signatures.get(other, (other,)) == signature)

    fastest = min(latency_ms(name) for name in accurate)
    close = [name for name in accurate if latency_ms(name) <= fastest * (1.0 + LATENCY_MARGIN)]
    return min(close, key=lambda name: accurate[name].size_bytes)
