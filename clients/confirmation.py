"""Device-confirmed lookup: the server's shortlist, timed on the device itself.

The server's latency for a model this device never ran is a prediction with an uncertainty; near the
budget it may be wrong either way (a model predicted to fit does not, or a more accurate one predicted
not to fit does). So the device asks for the shortlist (the models ranked above the server's choice whose
prediction is within the uncertainty of the budget, then the choice), times them most accurate first with
`fedzoo.edge.benchmark` for a few runs, and keeps the first whose measured median fits: the most
accurate one that truly fits. Every timing is reported as telemetry, so the server recalibrates this
device (and the next lookup knows the measured medians). When every shortlisted model turns out too slow,
the device asks again: the server now has their measured medians and chooses among the rest.

Only this device's own timings confirm anything: an entry the server labels "measured" is timed like any
prediction (a lying server could label any model measured and fitting), and a model timed earlier in this
lookup counts with the median the device measured, never the server's figure.

Every shortlisted model is timed through its card, exactly as `FedzooClient.download_model` loads a model:
with pinned keys the card must verify (signature, expiry, no rollback of its line) before a byte is
downloaded, the bytes must hash to the card's signed sha256 (never the shortlist's word), and a cached file is
hashed again, all before onnxruntime opens it.

`ConfirmationPolicy` bounds what confirmation may spend: models timed, bytes downloaded, seconds (a model
whose timing would not fit the seconds left, by its predicted latency, is skipped). The answer says what
was measured, what was skipped and why, and whether the chosen model's fit was measured (`confirmed`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedzoo.clients.client import FedzooClient

SESSION_SETUP_S = 0.05  # what creating an onnxruntime session of a small model costs, on top of its runs


@dataclass(frozen=True)
class ConfirmationPolicy:
    """What one confirmed lookup may spend."""

    max_models: int = 4  # the shortlist's length (the server caps it at 16)
    max_download_bytes: int = 64 * 1024 * 1024
    max_seconds: float = 2.0
    warmup_runs: int = 3
    timed_runs: int = 15
    max_lookups: int = 3  # asking again after every shortlisted model measured too slow
    threads: int = 1


def confirmed_lookup(client: FedzooClient, query: dict[str, Any], policy: ConfirmationPolicy) -> dict[str, Any]:
    """The most accurate model that measured within `query["latency_budget_ms"]` on this device, with what
    was measured; the server's last choice, unconfirmed, when the policy ran out first."""
    from fedzoo.edge.benchmark import benchmark_model

    started = time.monotonic()
    budget_ms = query["latency_budget_ms"]
    bytes_before = client.downloaded_bytes
    measurements: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    measured_ms: dict[str, float] = {}  # model id -> the median this device measured, in this lookup
    answer: dict[str, Any] = {}
    for lookups in range(1, policy.max_lookups + 1):
        answer = client.lookup(**query, shortlist_max_models=policy.max_models)
        for entry in answer["shortlist"]:
            own_median_ms = measured_ms.get(entry["model_id"])
            if own_median_ms is not None:  # the server's "measured" label is no timing of this device's
                if own_median_ms <= budget_ms:
                    return _answer(client, answer, entry, own_median_ms, True, measurements, skipped,
                                   lookups, started, bytes_before)
                continue
            reason = _over_policy(client, entry, policy, started, bytes_before)
            if reason:
                skipped.append({"model_id": entry["model_id"], "reason": reason})
                continue
            path = client.download_model(client.card(entry["model_id"]))  # verified, hashed: only then timed
            measurement = benchmark_model(path, threads=policy.threads, warmup_runs=policy.warmup_runs,
                                          timed_runs=policy.timed_runs)
            client.report_latency(entry["model_id"], measurement.median_ms, measurement.p90_ms, policy.threads)
            measured_ms[entry["model_id"]] = measurement.median_ms
            fits = measurement.median_ms <= budget_ms
            measurements.append({"model_id": entry["model_id"], "predicted_ms": entry["latency_ms"],
                                 "measured_ms": measurement.median_ms, "fits": fits, "runs": measurement.runs})
            if fits:
                return _answer(client, answer, entry, measurement.median_ms, True, measurements, skipped,
                               lookups, started, bytes_before)
        if skipped or not measurements:
            break  # the policy stopped it, not the measurements: asking again would not help
    chosen = answer["shortlist"][-1]
    return _answer(client, answer, chosen, chosen["latency_ms"], False, measurements, skipped, lookups, started,
                   bytes_before)


def _over_policy(client: FedzooClient, entry: dict[str, Any], policy: ConfirmationPolicy, started: float,
                 bytes_before: int) -> str | None:
    """Why timing this shortlisted model would break the policy, or None."""
    cached = client.cache.get(entry["sha256"]) is not None
    if not cached and client.downloaded_bytes - bytes_before + entry["size_bytes"] > policy.max_download_bytes:
        return f"download of {entry['size_bytes']} bytes over the policy's {policy.max_download_bytes}"
    expected_s = SESSION_SETUP_S + (policy.warmup_runs + policy.timed_runs) * entry["latency_ms"] / 1000.0
    left_s = policy.max_seconds - (time.monotonic() - started)
    if expected_s > left_s:
        return f"timing would take about {expected_s:.2f} s, {max(left_s, 0.0):.2f} s left of the policy's"
    return None


def _answer(client: FedzooClient, answer: dict[str, Any], entry: dict[str, Any], latency_ms: float,
            confirmed: bool, measurements: list[dict[str, Any]], skipped: list[dict[str, Any]], lookups: int,
            started: float, bytes_before: int) -> dict[str, Any]:
    model = answer["model"] if entry["model_id"] == answer["model"]["id"] else client.card_json(entry["model_id"])
    return {
        "model": model, "latency_ms": latency_ms, "confirmed": confirmed,
        "latency_source": "measured" if confirmed else entry["latency_source"],
        "measurements": measurements, "skipped": skipped, "lookups": lookups,
        "seconds_spent": time.monotonic() - started, "bytes_downloaded": client.downloaded_bytes - bytes_before,
        "server_answer": answer,
    }
