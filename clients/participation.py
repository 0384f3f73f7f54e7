"""The device's part of federated learning: ask for work, train on private data, send back the delta.

One participation (Bonawitz et al. 2019's device side):

1. check in with `GET /v1/fl/task`; with no task, come back after the server's `retry_after_s`
   (pace steering), with ±20% jitter so a fleet does not return in lockstep;
2. download the round's model and training graph (resumable, sha256-checked, cached);
3. train locally with `fedzoo.edge.trainer`: the round's optimizer, epochs and batch size, and for
   FedProx the proximal term `mu * (w - w_global)` added to every gradient before the numpy step;
4. upload `trained - global` (float32 or INT8, `fedzoo.update_codec`) with the number of
   examples and the client's own loss and accuracy on its data; with a graph built with
   `batch_norm="training"`, the change of every BatchNorm running statistic travels along as
   `running.<name>`. In a private round the delta is first clipped (DP-FedAvg), and under SecAgg+ it is
   never uploaded: the device answers the protocol's stages instead (`fedzoo.clients.secure_participation`).

The data never leaves the device; only the delta does. The transport never re-sends a POST that
may have reached the server; `deliver_update` does, knowing the server keeps one update per device
and round: a 409 `duplicate_update` after a re-sent upload means the first got through, so it
counts as delivered.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedzoo.clients.client import FedzooClient
from fedzoo.clients.errors import ConflictError, IntegrityError, ServerUnavailableError
from fedzoo.clients.secure_participation import clip_for_privacy, decline, round_noise_policy, take_part_securely
from fedzoo.edge.local_training import LocalData, Parameters, train_locally
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.update_codec import Encoding, encode_update, split_statistics

DeltaTransform = Callable[[Parameters], Parameters]

@dataclass
class ParticipationResult:
    """What one check-in came to."""

    round_id: int | None
    outcome: str  # "accepted", "refused: <code>", "diverged" (nothing sent) or "no task"
    upload_bytes: int = 0
    num_examples: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    retry_after_s: float | None = None
    train_seconds: float = 0.0  # the local training's wall time (kept on the device; simulations measure overhead with it)


def run_task(
    client: FedzooClient, work: dict[str, Any], data: LocalData, encoding: Encoding = "fp32", seed: int = 0,
    transform: DeltaTransform | None = None, checked_in_for: tuple[str, str | None] | None = None,
) -> ParticipationResult:
    """Do the work of one task: download, train locally, upload. `transform` alters the delta before upload
    (only for simulating faulty or malicious devices). `checked_in_for`: the (task, family) the device asked for
    work on, where SecAgg+ stages check in again (default: the model card's; a zoo-wide round's training card
    names its subnet's task, not the zoo's)."""
    card = client.card(work["model_id"])
    if card.sha256 != work["model_sha256"] or card.training_graph != work["training_graph_sha256"]:
        raise IntegrityError(f"round {work['round_id']} names blobs that model {card.id!r}'s card does not")
    # through the card, so that pinned keys verify it before any of its bytes are used
    model = client.download_model(card).read_bytes()
    graph = client.download_training_graph(card).read_bytes()
    try:  # after the card verified (pinned card keys): its line is the one the terms are checked for
        policy = round_noise_policy(client, card.line_id, work.get("privacy"))
    except ProtocolViolation as violation:
        return ParticipationResult(work["round_id"], decline(client, work["round_id"], violation.reason,
                                                             str(violation)))
    started = time.perf_counter()
    delta, metrics = train_locally(graph, model, card, work["training"], data, seed)
    train_seconds = time.perf_counter() - started
    if transform is not None:
        delta = transform(delta)
    if work.get("privacy"):  # a private round aggregates the weights only: the running statistics stay the parent's
        delta, _statistics = split_statistics(delta)
    delta, within = clip_for_privacy(delta, work.get("privacy"))
    metadata = {"base_version": work["base_version"], "num_examples": len(data), "metrics": metrics}
    if not all(np.all(np.isfinite(value)) for value in delta.values()) or not all(map(math.isfinite, metrics.values())):
        # the server would refuse it (422); a model that diverged here is no update worth the bytes
        return ParticipationResult(work["round_id"], "diverged", 0, len(data), metrics, train_seconds=train_seconds)
    if work.get("privacy") and work["privacy"]["secure_aggregation"] is not None:
        task, family = checked_in_for or (card.task, card.family)
        check_in = lambda: client.fl_task(task, family)  # noqa: E731
        outcome, sent = take_part_securely(client, work, delta, len(data), check_in, within=within,
                                           policy=policy)
        return ParticipationResult(work["round_id"], outcome, sent, len(data), metrics, train_seconds=train_seconds)
    chosen = encoding if encoding in work["upload"]["encodings"] else "fp32"
    payload = encode_update(delta, chosen)
    outcome = deliver_update(client, work["upload"]["url"], metadata, payload)
    return ParticipationResult(work["round_id"], outcome, len(payload), len(data), metrics, train_seconds=train_seconds)


def deliver_update(client: FedzooClient, upload_url: str, metadata: dict[str, Any], payload: bytes) -> str:
    """Upload until the server has the update: "accepted" or "refused: <code>". Re-sending after a failure
    that may have reached the server (a timeout, a dropped connection, a server crash) is safe: the server
    keeps one update per device and round and answers a repeat with 409 `duplicate_update`, which means
    an earlier attempt got through."""
    policy, failures = client.http.retry, 0
    while True:
        try:
            client.upload_update(upload_url, metadata, payload)
            return "accepted"
        except ConflictError as error:
            return "accepted" if error.code == "duplicate_update" else f"refused: {error.code}"
        except ServerUnavailableError:
            failures += 1
            if failures == policy.max_attempts:
                raise
            client.http.sleep(policy.delay_s(failures - 1))


def participate_once(
    client: FedzooClient, task: str, data: LocalData, encoding: Encoding = "fp32", family: str | None = None,
    seed: int = 0,
) -> ParticipationResult:
    """One check-in, and the task's work if this device was selected."""
    answer = client.fl_task(task, family)
    if answer.get("task") is None:
        return ParticipationResult(None, "no task", retry_after_s=answer.get("retry_after_s"))
    return run_task(client, answer["task"], data, encoding, seed, checked_in_for=(task, family))


def participation_loop(
    client: FedzooClient, task: str, data: LocalData, max_participations: int, max_idle_s: float,
    encoding: Encoding = "fp32", family: str | None = None, sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> list[ParticipationResult]:
    """Keep checking in until `max_participations` rounds were worked on or `max_idle_s` passed without work."""
    rng = rng or random.Random()
    results: list[ParticipationResult] = []
    idle_since = time.monotonic()
    failures = 0
    while len(results) < max_participations and time.monotonic() - idle_since < max_idle_s:
        try:
            result = participate_once(client, task, data, encoding, family, seed=rng.randrange(2**31))
        except ServerUnavailableError:
            failures += 1
            sleep(client.http.retry.delay_s(min(failures, 8), rng=rng))
            continue
        failures = 0
        if result.round_id is None:
            sleep((result.retry_after_s or 1.0) * rng.uniform(0.8, 1.2))
            continue
        results.append(result)
        idle_since = time.monotonic()
    return results
