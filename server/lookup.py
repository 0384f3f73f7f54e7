"""The lookup: the most accurate model for a task that fits one device's latency and memory budgets.

Latency per (device, model) follows `fedzoo.server.latency`: this device's measured median, else the
card's latency for the device's class, else the predictor's group costs of the model dotted with the
device's group scales, times the model's fleet latency factor. All three are columns already in the
database, so the whole choice is one query: filter by task (index `ix_models_task_accuracy`; a compressed
variant retired by a zoo-wide round, `models.retired_by`, is never chosen: docs/zoo-federated.md, nor a card on
the operator's revocation list, `models.revoked_by_list`: `fedzoo.server.revocations`), compute the
latency with COALESCE, keep what fits, order by accuracy (then latency, then id) and take two rows: the
choice and the runner-up. `models.accuracy` is the server's measurement on a zoo plan's evaluation set once a
zoo-wide plan has measured the task's models (`models.evaluation_sha256`), else the card's: one set per task.

Uncertainty: each latency carries a log-space sigma (`fedzoo.server.online_calibration`: the device's
own, which telemetry shrinks, for predictions; small constants for measured medians and card figures).
With `latency_margin_sigmas` = k a model fits when latency x exp(k sigma) <= budget. With
`shortlist_max_models` the answer also lists the models ranked above the choice whose latency is within
exp(SHORTLIST_SIGMAS sigma) of the budget, then the choice: a device can time them and keep the first
that truly fits (`FedzooClient.lookup_confirmed`).

Memory: `estimate_memory_mb(card)` = weights twice (the file's bytes as loaded, plus the runtime's
prepacked copy) + peak activations + a fixed runtime overhead. Peak activations are the card's
`details["peak_activation_bytes"]` when the cloud recorded it, else `ACTIVATION_WIDENING` x the
input's float32 bytes (MobileNet-style stems widen the input ~16x at full resolution, and an op's
input and output are alive together, hence 2 x 16). When the request has no `memory_budget_mb`, the
device's `memory_mb` is the budget.

Failure answers: no model at all for the task is 404 `no_model_for_task`; models exist but none fits
is 409 `no_model_fits`, naming the closest one (the smallest worst overshoot of any budget).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from fedzoo.cards import ModelCard
from fedzoo.server.devices import AuthenticatedDevice
from fedzoo.server.errors import NoModelFits, NotFound
from fedzoo.server.online_calibration import CARD_CLASS_LOG_SIGMA, MEASURED_LOG_SIGMA, initial_log_sigma
from fedzoo.server.tables import COST_COLUMNS, FACTOR_COLUMNS, SCALE_COLUMNS

BYTES_PER_MB = 1024 * 1024
RUNTIME_OVERHEAD_MB = 16.0
WEIGHT_COPIES = 2
ACTIVATION_WIDENING = 32
FLOAT32_BYTES = 4
SHORTLIST_SIGMAS = 2.0  # the shortlist reaches models predicted up to exp(2 sigma) over the latency budget


def estimate_memory_mb(card: ModelCard) -> float:
    """Working memory (MiB) to run the card's model at batch 1; see the module docstring."""
    peak_activation_bytes = card.details.get("peak_activation_bytes")
    if not isinstance(peak_activation_bytes, (int, float)) or peak_activation_bytes <= 0:
        input_elements = math.prod(dim if isinstance(dim, int) else 1 for dim in card.input.shape)
        peak_activation_bytes = ACTIVATION_WIDENING * FLOAT32_BYTES * input_elements
    return RUNTIME_OVERHEAD_MB + (WEIGHT_COPIES * card.size_bytes + peak_activation_bytes) / BYTES_PER_MB


@dataclass(frozen=True)
class LookupQuery:
    task: str
    latency_budget_ms: float
    memory_budget_mb: float | None = None
    min_accuracy: float | None = None
    precision: str | None = None
    latency_margin_sigmas: float = 0.0
    shortlist_max_models: int | None = None


@dataclass(frozen=True)
class Candidate:
    model_id: str
    accuracy: float
    latency_ms: float
    latency_basis: str
    memory_mb: float
    card_json: str
    latency_log_sigma: float

    @property
    def latency_source(self) -> str:
        return "measured" if self.latency_basis == "device_telemetry" else "predicted"

    def margin_factor(self, query: LookupQuery) -> float:
        return math.exp(query.latency_margin_sigmas * self.latency_log_sigma)

    def summary(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "accuracy": self.accuracy,
            "latency_ms": self.latency_ms,
            "latency_source": self.latency_source,
            "latency_basis": self.latency_basis,
            "latency_log_sigma": round(self.latency_log_sigma, 6),
            "memory_mb": round(self.memory_mb, 3),
        }

    def shortlist_entry(self) -> dict[str, Any]:
        """The summary plus what a device needs to download the model (its blob digest and size)."""
        card = json.loads(self.card_json)
        return {**self.summary(), "sha256": card["sha256"], "size_bytes": card["size_bytes"]}


@dataclass(frozen=True)
class LookupResult:
    chosen: Candidate
    runner_up: Candidate | None
    reason: str
    shortlist: list[Candidate] | None = None

    def card(self) -> dict[str, Any]:
        return json.loads(self.chosen.card_json)


# What the latency of each basis reads like in a reason.
BASIS_WORDING = {
    "device_telemetry": "this device's own measured median",
    "card_device_class": "the card's latency for this device class",
    "predictor": "the latency predictor calibrated for this device",
}


def _candidates_sql(precision_filter: bool) -> str:
    """Every model of the task with this device's latency, its basis and its log-space uncertainty (the
    rules of the module docstring). The device's current scales (telemetry refines them; its class's
    factors apply while it has no telemetry) are read in the same query, from a one-row subquery joined
    first. Plain SQL, compiled once per variant: building it per request cost more than running it."""
    effective_scales = ", ".join(
        f"d.{scale} * COALESCE(CASE WHEN d.latency_reports = 0 THEN c.{factor} END, 1.0) AS {scale}"
        for scale, factor in zip(SCALE_COLUMNS, FACTOR_COLUMNS)
    )
    predicted = "COALESCE(m.latency_factor, 1.0) * (" + " + ".join(
        f"m.{cost} * s.{scale}" for cost, scale in zip(COST_COLUMNS, SCALE_COLUMNS)) + ")"
    return f"""
        SELECT m.id AS model_id, m.accuracy AS accuracy,
               COALESCE(measured.median_ms, by_class.median_ms, {predicted}) AS latency_ms,
               CASE WHEN measured.median_ms IS NOT NULL THEN 'device_telemetry'
                    WHEN by_class.median_ms IS NOT NULL THEN 'card_device_class'
                    ELSE 'predictor' END AS latency_basis,
               m.memory_mb AS memory_mb, m.card_json AS card_json,
               CASE WHEN measured.median_ms IS NOT NULL THEN {MEASURED_LOG_SIGMA!r}
                    WHEN by_class.median_ms IS NOT NULL THEN {CARD_CLASS_LOG_SIGMA!r}
                    ELSE s.log_sigma END AS latency_log_sigma
        FROM (SELECT {effective_scales}, COALESCE(d.latency_log_sigma, {initial_log_sigma()!r}) AS log_sigma
              FROM devices AS d LEFT JOIN class_latency_calibration AS c ON c.device_class = d.device_class
              WHERE d.id = :device_id) AS s
        CROSS JOIN models AS m
        LEFT JOIN measured_latency AS measured ON measured.model_id = m.id AND measured.device_id = :device_id
        LEFT JOIN model_class_latency AS by_class ON by_class.model_id = m.id AND by_class.device_class = :device_class
        WHERE m.task = :task AND m.retired_by IS NULL AND m.revoked_by_list IS NULL
              {"AND m.precision = :precision" if precision_filter else ""}"""


# A candidate fits when latency x exp(margin_sigmas x sigma) <= budget; without a margin, latency <= budget.
FITS = {False: "latency_ms <= :latency_budget_ms",
        True: "latency_ms * exp(:margin_sigmas * latency_log_sigma) <= :latency_budget_ms"}
OTHER_BUDGETS = "memory_mb <= :memory_budget_mb AND accuracy >= :min_accuracy"
CANDIDATES = {flag: text(_candidates_sql(flag)) for flag in (False, True)}
BEST_TWO = {
    (flag, margin): text(f"""SELECT * FROM ({_candidates_sql(flag)}) AS candidates
        WHERE {FITS[margin]} AND {OTHER_BUDGETS}
        ORDER BY accuracy DESC, latency_ms, model_id LIMIT 2""")
    for flag in (False, True) for margin in (False, True)
}
# The shortlist: what might truly fit, i.e. predicted within SHORTLIST_SIGMAS of the budget, ranked as above.
SHORTLIST = {
    flag: text(f"""SELECT * FROM ({_candidates_sql(flag)}) AS candidates
        WHERE latency_ms <= :latency_budget_ms * exp(:shortlist_sigmas * latency_log_sigma) AND {OTHER_BUDGETS}
          AND accuracy >= :chosen_accuracy
        ORDER BY accuracy DESC, latency_ms, model_id LIMIT :shortlist_limit""")
    for flag in (False, True)
}


def memory_budget_mb(device: AuthenticatedDevice, query: LookupQuery) -> float:
    return float(device.memory_mb) if query.memory_budget_mb is None else query.memory_budget_mb


def lookup(session: Session | Connection, device: AuthenticatedDevice, query: LookupQuery) -> LookupResult:
    """The best fitting model, the runner-up and, when asked, the shortlist; NotFound / NoModelFits when
    there is none."""
    budget_mb = memory_budget_mb(device, query)
    parameters = {
        "device_id": device.id, "device_class": device.device_class or "", "task": query.task,
        "precision": query.precision,
    }
    budgets = {
        **parameters, "latency_budget_ms": query.latency_budget_ms, "memory_budget_mb": budget_mb,
        "min_accuracy": query.min_accuracy if query.min_accuracy is not None else 0.0,
        "margin_sigmas": query.latency_margin_sigmas,
    }
    precision_filter = query.precision is not None
    with_margin = query.latency_margin_sigmas > 0.0
    rows = [Candidate(*row) for row in session.execute(BEST_TWO[precision_filter, with_margin], budgets)]
    if not rows:
        candidates = [Candidate(*row) for row in session.execute(CANDIDATES[precision_filter], parameters)]
        raise _nothing_fits(candidates, query, budget_mb)
    chosen = rows[0]
    runner_up = rows[1] if len(rows) > 1 else None
    margin = (f" with a margin of {query.latency_margin_sigmas:g} sigma (x{chosen.margin_factor(query):.3f})"
              if with_margin else "")
    reason = (
        f"most accurate {query.task} model that fits: accuracy {chosen.accuracy:.4f}, "
        f"{chosen.latency_ms:.3f} ms{margin} <= {query.latency_budget_ms:g} ms budget by "
        f"{BASIS_WORDING[chosen.latency_basis]}, {chosen.memory_mb:.1f} MB <= {budget_mb:g} MB"
    )
    shortlist = None
    if query.shortlist_max_models is not None:
        shortlist = _shortlist(session, precision_filter, budgets, chosen, query.shortlist_max_models)
    return LookupResult(chosen, runner_up, reason, shortlist)


def _shortlist(session: Session | Connection, precision_filter: bool, budgets: dict[str, Any], chosen: Candidate,
               max_models: int) -> list[Candidate]:
    """The candidates ranked above the choice that might truly fit, then the choice itself (at most
    `max_models` in all): a device times them in this order and keeps the first that fits."""
    above = [Candidate(*row) for row in session.execute(SHORTLIST[precision_filter], {
        **budgets, "shortlist_sigmas": SHORTLIST_SIGMAS, "chosen_accuracy": chosen.accuracy,
        "shortlist_limit": max_models,
    })]
    above = [candidate for candidate in above if candidate.model_id != chosen.model_id]
    ranked_above = [candidate for candidate in above if _ranks_before(candidate, chosen)]
    return ranked_above[:max_models - 1] + [chosen]


def _ranks_before(candidate: Candidate, chosen: Candidate) -> bool:
    return (-candidate.accuracy, candidate.latency_ms, candidate.model_id) < (
        -chosen.accuracy, chosen.latency_ms, chosen.model_id)


def _overshoot(candidate: Candidate, query: LookupQuery, budget_mb: float) -> float:
    """How far a candidate misses its worst budget, as a ratio (1.0 = exactly at the budget)."""
    ratios = [candidate.latency_ms / query.latency_budget_ms, candidate.memory_mb / budget_mb]
    if query.min_accuracy:
        ratios.append(query.min_accuracy / max(candidate.accuracy, 1e-9))
    return max(ratios)


def _nothing_fits(candidates: list[Candidate], query: LookupQuery, budget_mb: float) -> Exception:
    if not candidates:
        precision = f" in precision {query.precision}" if query.precision else ""
        return NotFound(f"no model is published for task {query.task!r}{precision}", field="task",
                        code="no_model_for_task")
    closest = min(candidates, key=lambda candidate: (_overshoot(candidate, query, budget_mb), -candidate.accuracy))
    return NoModelFits(
        f"none of the {len(candidates)} {query.task} models fits: the closest, {closest.model_id!r}, needs "
        f"{closest.latency_ms:.3f} ms (budget {query.latency_budget_ms:g}), {closest.memory_mb:.1f} MB "
        f"(budget {budget_mb:g}) and has accuracy {closest.accuracy:.4f}"
        + (f" (minimum {query.min_accuracy:g})" if query.min_accuracy is not None else ""),
        field="latency_budget_ms",
        closest=closest.summary(),
    )
