"""Evaluation and publication: the aggregate and its parent are measured on the round's evaluation set
(`fedzoo.server.fl.evaluation`); the aggregate is published as a new, signed model version only if it is
not worse than the gate's reference (by default the best version of the plan: no ratchet) by more than
`max_accuracy_drop`. Its metrics are the server's measurement."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from fedzoo.cards import Metrics, ModelCard
from fedzoo.edge.onnx_initializers import replace_initializers
from fedzoo.server import registry
from fedzoo.server.fl.base_models import RoundBase
from fedzoo.server.fl.evaluation import (
    GateReference, PublicationDecision, best_published, decide_publication, evaluate,
)
from fedzoo.server.fl.outcome import RoundOutcome
from fedzoo.server.fl.tables import FLRound
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import published_counts
from fedzoo.server.fl.stages.aggregation import Aggregate
from fedzoo.server.latency import LatencyEstimator
from fedzoo.signing import CardSigningKey, sign_card


@dataclass(frozen=True)
class Candidate:
    """An aggregate as a model: its ONNX bytes, the server's measurement of it and of its parent."""

    onnx_bytes: bytes
    measured: Metrics
    parent: Metrics


class Publication:
    """Measures a round's aggregate against its parent and publishes it as the next version."""

    def __init__(self, context: RoundContext, estimator: LatencyEstimator, signing_key: CardSigningKey) -> None:
        self.context, self.estimator = context, estimator
        self.signing_key = signing_key  # signs every version a round publishes
        self._measurements: dict[tuple[str, str], Metrics] = {}

    def candidate(self, base: RoundBase, aggregate: Aggregate, evaluation_sha256: str) -> Candidate:
        """The aggregate written into the base model, measured beside its parent on the evaluation set."""
        onnx_bytes = replace_initializers(base.onnx_bytes, {**aggregate.parameters, **aggregate.statistics})
        with self.context.store.open(evaluation_sha256) as stream:
            evaluation_npz = stream.read()
        measured = evaluate(onnx_bytes, base.card, evaluation_npz)
        return Candidate(onnx_bytes, measured, self._measured(base.card, base.onnx_bytes, evaluation_sha256,
                                                              evaluation_npz))

    def reference(self, plan_id: int, round_id: int, config: RoundConfig, base: RoundBase,
                  candidate: Candidate) -> GateReference:
        """What the aggregate must not fall below (minus the tolerance): see `PublicationGate`."""
        if config.gate.compare_with == "parent":
            return GateReference(base.card.id, candidate.parent.accuracy, "parent")
        with self.context.database.session() as session:
            if config.gate.compare_with == "anchor":
                card = ModelCard.from_dict(registry.get_card(session, config.gate.anchor_model_id))
                with self.context.store.open(card.sha256) as stream:
                    onnx_bytes = stream.read()
                with self.context.store.open(config.evaluation_sha256) as stream:
                    evaluation_npz = stream.read()
                measured = self._measured(card, onnx_bytes, config.evaluation_sha256, evaluation_npz)
                return GateReference(card.id, measured.accuracy, "anchor")
            earlier = session.execute(select(FLRound.base_model_id, FLRound.result_model_id, FLRound.outcome_json).where(
                FLRound.plan_id == plan_id, FLRound.id != round_id, FLRound.outcome_json.is_not(None))).all()
        return best_published(base.card.id, candidate.parent, [(base_id, result_id, json.loads(outcome))
                                                                for base_id, result_id, outcome in earlier])

    @staticmethod
    def decide(candidate: Candidate, reference: GateReference, max_accuracy_drop: float,
               outcome: RoundOutcome) -> PublicationDecision:
        """The accuracy gate; records the measurements, the reference and the decision in the round's outcome."""
        decision = decide_publication(candidate.measured, reference, max_accuracy_drop)
        outcome.evaluation, outcome.parent_evaluation = candidate.measured.model_dump(), candidate.parent.model_dump()
        outcome.gate = reference.as_dict()
        outcome.publication = {"published": decision.publish, "reason": decision.reason}
        return decision

    def _measured(self, card: ModelCard, onnx_bytes: bytes, evaluation_sha256: str, evaluation_npz: bytes) -> Metrics:
        """A published model (the parent, an anchor) measured on the same set as the aggregate (cached: both
        blobs are immutable)."""
        key = (card.sha256, evaluation_sha256)
        if key not in self._measurements:
            self._measurements[key] = evaluate(onnx_bytes, card, evaluation_npz)
        return self._measurements[key]

    def publish(self, session: Session, round_row: FLRound, base: RoundBase, sha256: str, size_bytes: int,
                measured: Metrics, outcome: RoundOutcome) -> ModelCard:
        """Register the aggregate as the line's next version: its metrics are the server's measurement; what the
        devices said about themselves travels in `details.federated.client_reported_metrics`; under DP its
        contributor counts are rounded (`published_counts`)."""
        clock = self.context.clock
        version = registry.next_line_version(session, base.card.line_id)  # another plan on this base may have published
        card = base.card.model_copy(update={
            "id": f"{base.card.family}-v{version}-r{round_row.id}"[:128],
            "version": version,
            "parent_id": base.card.id,
            "line": base.card.line_id,
            "sha256": sha256,
            "size_bytes": size_bytes,
            "metrics": measured,
            "created_at": clock(),
            "details": {**base.card.details, "federated": {
                "round_id": round_row.id, "round_number": round_row.number, "strategy": outcome.strategy,
                **published_counts(outcome),
                "metrics_source": "the server's evaluation set (held out, measured on the server)",
                "parent_evaluation": outcome.parent_evaluation,
                "client_reported_metrics": outcome.client_reported_metrics, "base_model_id": base.card.id,
                "gate": outcome.gate, **({"root_trust": outcome.root_trust} if outcome.root_trust is not None else {}),
                **({"privacy": outcome.privacy} if outcome.privacy is not None else {}),
                **({"defences": outcome.defences} if outcome.defences is not None else {}),
            }},
        })
        card = sign_card(ModelCard.from_dict(card.model_dump(exclude={"signature"})), self.signing_key, now=clock())
        registry.publish(session, self.context.store, self.estimator, card)
        return card
