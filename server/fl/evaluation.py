"""What the server measures about a round's result, and what it merely records from the devices.

A new version is published (and so served by lookup) only with metrics the server measured itself on
the round's evaluation set, and only when it is not worse than the gate's reference by more than the round's
`max_accuracy_drop`; all models are measured on the same set, in the same way a device runs them. The reference
is by default the best version the plan has published (its base included), not the parent: compared with the
parent alone, drops each within the tolerance add up round after round (a ratchet).
The devices' own figures are kept as `client_reported_metrics`, for people to read, never for ranking.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedzoo.aggregation.strategies import ClientUpdate
from fedzoo.cards import Metrics, ModelCard

EVALUATION_BATCH = 256


def evaluate(onnx_bytes: bytes, card: ModelCard, evaluation_npz: bytes) -> Metrics:
    """Accuracy and cross-entropy of a model on a held-out `.npz` (x in [0, 1], y), run as a device runs it."""
    from fedzoo.edge.runtime import EdgeSession

    with np.load(io.BytesIO(evaluation_npz), allow_pickle=False) as archive:
        features, targets = archive["x"].astype(np.float32), archive["y"].astype(np.int64)
    session = EdgeSession(onnx_bytes, card)  # applies the card's normalisation
    logits = np.concatenate([session.run(features[start : start + EVALUATION_BATCH])
                             for start in range(0, len(features), EVALUATION_BATCH)])
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-log_probabilities[np.arange(len(targets)), targets].mean())
    accuracy = float((logits.argmax(axis=1) == targets).mean())
    return Metrics(accuracy=accuracy, loss=max(loss, 0.0) if math.isfinite(loss) else None, split="evaluation",
                   num_examples=len(targets))


@dataclass(frozen=True)
class PublicationDecision:
    """Whether the aggregate may be published, and why, from the two measurements."""

    publish: bool
    reason: str


@dataclass(frozen=True)
class GateReference:
    """The model a candidate is compared with, and its accuracy on the round's evaluation set."""

    model_id: str
    accuracy: float
    kind: str  # "best", "anchor" or "parent" (PublicationGate.compare_with), or what else it is, in words

    def as_dict(self) -> dict[str, object]:
        return {"compare_with": self.kind, "model_id": self.model_id, "accuracy": self.accuracy}


def best_published(parent_id: str, parent: Metrics, plan_outcomes: Sequence[tuple[str, str | None, dict]]
                   ) -> GateReference:
    """The most accurate version of the plan so far: the parent, or any base or result an earlier round of the
    plan measured on the same evaluation set. `plan_outcomes`: (base model id, result model id, outcome)."""
    best = GateReference(parent_id, parent.accuracy, "best")
    for base_id, result_id, outcome in plan_outcomes:
        for model_id, measured in ((base_id, outcome.get("parent_evaluation")),
                                   (result_id, outcome.get("evaluation"))):
            if model_id is not None and measured and measured["accuracy"] > best.accuracy:
                best = GateReference(model_id, measured["accuracy"], "best")
    return best


def decide_publication(candidate: Metrics, reference: GateReference, max_accuracy_drop: float) -> PublicationDecision:
    """Publish unless the candidate's accuracy is below the reference's by more than `max_accuracy_drop`."""
    floor = reference.accuracy - max_accuracy_drop
    label = {"best": "the plan's best version"}.get(reference.kind, f"the {reference.kind}")
    against = f"{label} {reference.model_id} ({reference.accuracy:.4f})"
    if candidate.accuracy + 1e-12 < floor:
        return PublicationDecision(False, f"accuracy {candidate.accuracy:.4f} on the server's evaluation set is below "
                                          f"{against} minus the tolerance {max_accuracy_drop:g}")
    return PublicationDecision(True, f"accuracy {candidate.accuracy:.4f} on the server's evaluation set against "
                                     f"{against} (tolerance {max_accuracy_drop:g})")


def client_reported_metrics(updates: Sequence[ClientUpdate]) -> dict[str, float]:
    """Per metric name, the mean the devices reported, weighted by their counted examples. Weights are
    normalised first, so figures near the float range (a loss of 1e308) cannot overflow the sum."""
    names = sorted({name for update in updates for name in update.metrics})
    means = {}
    for name in names:
        reporting = [update for update in updates if name in update.metrics]
        values = [update.metrics[name] for update in reporting]
        total = float(sum(update.num_examples for update in reporting))
        try:
            mean = math.fsum((update.num_examples / total) * update.metrics[name] for update in reporting)
        except OverflowError:  # only when every figure sits at the very top of the float range
            mean = max(values)
        means[name] = min(max(mean, min(values)), max(values))  # a mean lies within what was averaged
    return means
