"""A round's outcome: what the round's stages found (counts, screening, defences, privacy, the gate's decision),
written by each stage as it runs and stored once as the round's `outcome_json` (read by the round views, the
operator CLI and the dashboard). A section no stage filled is absent from the JSON, never null: a round refused
at screening has no `gate`, a round that is not private no `privacy`."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class UpdateCounts:
    """How many updates the server accepted and how many went into the aggregate, with their examples (None
    in a private round: the server sees only the sum)."""

    accepted_updates: int
    aggregated_updates: int
    num_examples: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"accepted_updates": self.accepted_updates, "aggregated_updates": self.aggregated_updates,
                "num_examples": self.num_examples}


@dataclass
class ScreeningTally:
    """The screening decisions counted by outcome, with the norm bound they met: one bound for the round
    (`norm_limit`; the DP clip norm in a private round, None there without DP) or, in a zoo-wide round, one per
    subnet (`per_subnet_norm_limit`, by training model id)."""

    counted: int
    clipped: int
    rejected: int
    norm_limit: float | None = None
    per_subnet_norm_limit: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        limit: dict[str, Any] = ({"per_subnet_norm_limit": self.per_subnet_norm_limit}
                                 if self.per_subnet_norm_limit is not None else {"norm_limit": self.norm_limit})
        return {**limit, "counted": self.counted, "clipped": self.clipped, "rejected": self.rejected}


@dataclass
class SecureAggregationTally:
    """A SecAgg+ round's protocol settings and who survived, dropped or misbehaved (by client index); with several
    cohorts, their totals (the settings: the weakest cohort's) and each cohort's own tally."""

    num_clients: int
    neighbour_count: int
    threshold: int
    levels: int
    clip_range: float
    survivors: int
    dropped: int
    misbehaving: dict[str, str]
    cohorts: list[dict[str, Any]] | None = None  # one SecAgg+ instance per subnet (zoo-wide rounds): each one's tally

    def to_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)
                if getattr(self, item.name) is not None or item.name != "cohorts"}


ZOO_PUBLICATION_FIELDS = ("models", "new_versions", "retired_from_lookup", "publication_s")


@dataclass
class ZooRound:
    """A zoo-wide round: the supernet, which zoo models its devices trained, the per-element coverage, time and
    bytes (from aggregation), then each zoo model's gate and the versions published (from publication)."""

    supernet_id: str
    devices_per_zoo_model: dict[str, int]
    min_coverage: int
    coverage_step_exponent: float
    devices_per_subnet: float
    coverage: dict[str, Any]
    aggregation_s: float
    bytes: dict[str, float]
    models: list[dict[str, Any]] | None = None
    new_versions: int | None = None
    retired_from_lookup: list[str] | None = None
    publication_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)
                if getattr(self, item.name) is not None or item.name not in ZOO_PUBLICATION_FIELDS}


@dataclass
class RoundOutcome:
    """Everything a round records, in the order the stored JSON lists it. None: the stage that writes the
    field did not run (or, for the optional defences, found nothing to record)."""

    failure: str | None = None  # why a failed round failed
    metrics: dict[str, Any] | None = None  # a published round: the new model's card metrics
    counts: UpdateCounts | None = None  # stored as three top-level fields
    upload_bytes: int | None = None
    screening: ScreeningTally | None = None
    weight_bound: dict[str, Any] | None = None
    client_reported_metrics: dict[str, Any] | None = None
    per_subnet_defences: dict[str, dict[str, Any]] | None = None  # zoo-wide rounds
    direction_screening: dict[str, Any] | None = None
    root_trust: dict[str, Any] | None = None
    defences: dict[str, Any] | None = None
    strategy: str | None = None
    zoo: ZooRound | None = None
    secure_aggregation: SecureAggregationTally | None = None
    privacy: dict[str, Any] | None = None
    privacy_ledger: dict[str, Any] | None = None
    running_statistics: dict[str, int] | None = None
    server_seconds: float | None = None
    evaluation: dict[str, Any] | None = None
    parent_evaluation: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    publication: dict[str, Any] | None = None
    refused_model_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The stored outcome: the fields set, sections as JSON objects, the counts flattened."""
        record: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if isinstance(value, UpdateCounts):
                record.update(value.to_dict())
            elif isinstance(value, (ScreeningTally, SecureAggregationTally, ZooRound)):
                record[item.name] = value.to_dict()
            else:
                record[item.name] = value
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
