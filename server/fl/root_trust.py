"""The server's own data as the root of trust: FLTrust (Cao et al., NDSS 2021, "FLTrust: Byzantine-robust
Federated Learning via Trust Bootstrapping").

The operator gives the server a small root *training* set (`RoundConfig.root_trust.root_sha256`, kept apart
from the evaluation set). Each round the server trains its own update on it from the round's base model,
with the round's training settings, exactly as a device would. Then, for every update that passed screening:

- its **cosine similarity** with the server's update is its trust: at most `min_cosine` (0 by default, FLTrust's
  ReLU) and it is left out; above, its bounded weight is multiplied by the cosine (down-weighted the less it
  agrees). A flipped or sign-flipped delta points away from the root update and is left out; a label-flipped one
  agrees less and counts less;
- its **magnitude** is bounded by `max_norm_ratio` x the server update's norm (FLTrust rescales every update to
  that norm; we only scale down, so that a tiny update's noise is not amplified): a boosted "model replacement"
  update keeps at most an honest update's length.

The rest is aggregated and evaluated as usual, so a round with a few harmful updates publishes its honest part.
Under SecAgg+ the server sees only the sum: `check_aggregate` applies the same test to the round's mean delta,
which can refuse the round but cannot tell which device hurt it (docs/privacy.md, "Robust rounds under SecAgg+").
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedzoo.aggregation.direction import cosine_between, delta_norm
from fedzoo.aggregation.screening import Screened, joined, scaled
from fedzoo.aggregation.strategies import Parameters
from fedzoo.cards import ModelCard
from fedzoo.edge.local_training import LocalData, train_locally
from fedzoo.errors import InvalidInputError
from fedzoo.server.fl.schemas import RootTrust, TrainingConfig
from fedzoo.update_codec import split_statistics


@dataclass(frozen=True)
class RootUpdate:
    """The server's own update on the root set, and what it took to train."""

    delta: Parameters
    norm: float
    num_examples: int
    seconds: float


def cosine(delta: Parameters, root: RootUpdate) -> float:
    """Cosine similarity of a delta with the root update over every trainable parameter (0 for a zero delta)."""
    return cosine_between(delta, root.delta)


def train_root_update(model: bytes, training_graph: bytes, card: ModelCard, training: TrainingConfig,
                      root_npz: bytes, seed: int) -> RootUpdate:
    """Train the base model on the root set as a device would; the delta of its trainable parameters."""
    started = time.perf_counter()
    with np.load(io.BytesIO(root_npz), allow_pickle=False) as archive:
        data = LocalData(archive["x"].astype(np.float32), archive["y"].astype(np.int64))
    delta, _metrics = train_locally(training_graph, model, card, training.model_dump(), data, seed)
    parameters, _statistics = split_statistics(delta)
    norm = delta_norm(parameters)
    if not math.isfinite(norm) or norm == 0.0:
        raise InvalidInputError(f"the server's update on the root set has norm {norm}: it cannot score updates "
                                "(give a root set the model can still learn from)", field="root_trust.root_sha256")
    return RootUpdate(parameters, norm, len(data), time.perf_counter() - started)


def score_updates(decisions: list[Screened], root: RootUpdate, settings: RootTrust) -> list[Screened]:
    """Every screened update scored against the root update: left out, or weighted by its cosine and bounded
    in norm; the decisions come back in the order given, each with its reason."""
    limit = settings.max_norm_ratio * root.norm
    scored = []
    for decision in decisions:
        update = decision.update
        if update is None:
            scored.append(decision)
            continue
        similarity = cosine(update.load_delta(), root)
        if similarity <= settings.min_cosine:
            reason = (f"cosine {similarity:.3f} with the server's update on its root set is at most "
                      f"{settings.min_cosine:g}: left out")
            scored.append(Screened(decision.original, "rejected", joined(decision.reason, reason), None, similarity))
            continue
        weight = update.num_examples * similarity
        notes = [f"cosine {similarity:.3f} with the server's root update: weight {update.num_examples:g} x "
                 f"{similarity:.3f} = {weight:.4g}"]
        outcome = decision.outcome
        if update.norm > limit:
            factor = limit / update.norm
            update = replace(update, load_delta=scaled(update.load_delta, factor), norm=limit)
            notes.append(f"norm scaled by {factor:.3g} to {settings.max_norm_ratio:g} x the root update's "
                         f"{root.norm:.4g}")
            outcome = "clipped"
        scored.append(Screened(decision.original, outcome, joined(decision.reason, *notes),
                               replace(update, num_examples=weight), similarity))
    return scored


def summary(root: RootUpdate, decisions: list[Screened], settings: RootTrust) -> dict[str, Any]:
    """What the round's outcome says about the root-set scoring."""
    cosines = [decision.root_cosine for decision in decisions if decision.root_cosine is not None]
    return {"root_examples": root.num_examples, "root_update_norm": root.norm, "min_cosine": settings.min_cosine,
            "left_out": sum(decision.root_cosine is not None and decision.update is None for decision in decisions),
            "median_cosine": float(np.median(cosines)) if cosines else None, "seconds": round(root.seconds, 4)}


def check_aggregate(base: Parameters, aggregate: Parameters, root: RootUpdate,
                    settings: RootTrust) -> tuple[Parameters, dict[str, Any]]:
    """Under SecAgg+ only the round's mean delta is visible: refuse it (InvalidInputError) when it points away
    from the root update, and scale it down to the norm bound; returns the parameters and what was found."""
    delta = {name: aggregate[name].astype(np.float64) - base[name] for name in base}
    similarity = cosine(delta, root)
    if similarity <= settings.min_cosine:
        raise InvalidInputError(f"the aggregate's cosine {similarity:.3f} with the server's update on its root set "
                                f"is at most {settings.min_cosine:g}: some update in the sum is harmful, and "
                                "under secure aggregation the server cannot leave it out", field="root_trust")
    norm, limit = delta_norm(delta), settings.max_norm_ratio * root.norm
    factor = min(1.0, limit / norm) if norm > 0 else 1.0
    bounded = {name: (base[name] + factor * delta[name]).astype(np.float32) for name in base}
    return bounded, {"aggregate_cosine": similarity, "aggregate_norm": norm, "scaled_by": factor,
                     "root_examples": root.num_examples, "root_update_norm": root.norm,
                     "seconds": round(root.seconds, 4)}
