"""The device's part of a private round: DP clipping, and the four SecAgg+ stages over REST.

Under DP-FedAvg (`task.privacy.clip_norm`) the device clips its delta before anything leaves it. Under
SecAgg+ (`task.privacy.secure_aggregation`) it never uploads the delta: it quantises it into the round's
ring (`fedzoo.secagg.encoding`, levels = 127 is the int8 encoding's range), then answers each stage
the server shows it at check-in (`GET /v1/fl/task`) with `fedzoo.secagg.SecAggClient`, whose secrets live
in this process only and die with the round; it signs with the device's long-term key (`client.signing_key`,
made at registration), and takes part in a round id once (`client.signed_rounds`, kept in the state file).
It accepts a neighbour's key only with the operator's certificate for it, checked against the operator key set the
device pins (`FedzooClient(operator_keys=...)`) and the newest signed revocation list it has seen
(`fedzoo.clients.neighbour_trust`); a device without an operator key set declines every SecAgg+ round
(`operator_keys_required`): a key only the server vouches for could be the server's own. The device refuses a server
that breaks the protocol, e.g. one that relays keys without their owner's signature, runs a round id it took part in
before, draws the graph without its nonce, shows it a survivor set fewer than t neighbours signed, or sends parameters
outside the device's own `SecAggBounds`: `ProtocolViolation`, reported as the outcome `refused: <reason>` and
told to the server (`POST /v1/fl/rounds/<id>/decline`), which records it; so is a round of a protocol version
it does not speak. Under distributed DP the device adds its own share of the noise to its ring input, and refuses a
request calibrated for more honest survivors than the signed config's floor guarantees, or one its `NoisePolicy` does
not accept: its owner's, made stricter by the operator's signed privacy terms for the round's line
(`round_noise_policy`, `fedzoo.privacy_terms`), which a default device holding operator keys fetches and applies
before every task. With adaptive clipping (`task.privacy.unclipped_bit`) it appends whether its delta was within the
clip norm before clipping (1 or 0, in clip_range units) as one more coordinate of the vector it masks: the server
learns only how many were.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fedzoo.clients.client import FedzooClient
from fedzoo.aggregation.private import with_unclipped_bit
from fedzoo.capabilities import SECURE_AGGREGATION_VERSION
from fedzoo.clients.errors import APIError, ConflictError, ServerUnavailableError
from fedzoo.dp.clipping import clip_delta
from fedzoo.errors import CardSignatureError, InvalidInputError
from fedzoo.dp.distributed import (DistributedNoise, NoisePolicy, check_noise_request, check_task_privacy,
                                   noised_ring_input)
from fedzoo.secagg import SecAggClient, SecAggConfig, example_weight, flatten, quantise
from fedzoo.secagg.bounds import SecAggBounds
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.framing import rest_reply

Parameters = dict[str, np.ndarray]
CheckIn = Callable[[], dict[str, Any]]
log = logging.getLogger(__name__)


def clip_for_privacy(delta: Parameters, privacy: dict[str, Any] | None) -> tuple[Parameters, bool]:
    """The delta clipped to the round's DP clip norm (unchanged without DP), and whether it was within the bound
    already (adaptive clipping's "unclipped" bit)."""
    if privacy is None or privacy.get("clip_norm") is None:
        return delta, True
    return clip_delta(delta, privacy["clip_norm"])


def ring_input(delta: Parameters, config: SecAggConfig, privacy: dict[str, Any], num_examples: int,
               policy: NoisePolicy = NoisePolicy(), bounds: SecAggBounds = SecAggBounds(),
               within: bool = True) -> np.ndarray:
    """The device's input to SecAgg+: the clipped, weighted, quantised delta and its weight (equal under DP), with
    adaptive clipping (`privacy.unclipped_bit`) followed by whether the delta was `within` the clip norm before
    clipping (`with_unclipped_bit`); under distributed DP (`privacy.distributed_noise`) rounded within the norm
    bound and noised by this device (`fedzoo.dp.distributed`), after checking the request against the signed config
    (the honest survivors its floor guarantees under the device's `bounds`) and the device's `policy`."""
    if privacy.get("clip_norm") is not None:
        noise = privacy.get("distributed_noise")
        request = DistributedNoise.from_dict(noise) if noise is not None else None
        check_noise_request(request, bounds.honest_survivors(config), policy)
        if request is not None:
            return noised_ring_input(flatten(delta), privacy["clip_norm"], config.levels, config.modulus_bits, request)
    weight = 1.0 if privacy["equal_weights"] else example_weight(num_examples, privacy["max_examples"])
    vector = flatten(delta)
    if privacy.get("unclipped_bit"):
        vector = with_unclipped_bit(vector, within, config.clip_range)
    return quantise(vector, config, weight)


def protocol_config(data: dict[str, Any]) -> SecAggConfig:
    """The round's SecAggConfig as the server sent it; ProtocolViolation (`malformed`, as the Java SDK says) for one
    no SecAgg+ instance may run, e.g. a cohort of fewer than 3 (a lying server's cohort of one around a victim)."""
    try:
        return SecAggConfig.from_dict(data)
    except InvalidInputError as error:
        raise ProtocolViolation(f"the round's SecAgg+ configuration is invalid: {error}",
                                reason="malformed") from None


def answer_stage(protocol: SecAggClient, stage: str, request: dict[str, Any], vector: np.ndarray
                 ) -> dict[str, Any] | bytes:
    """This device's reply to one stage, as the REST endpoint takes it (`fedzoo.secagg.framing.rest_reply`)."""
    if stage == "advertise_keys":
        return rest_reply(protocol.advertise_keys())
    if stage == "masked_input":
        return rest_reply(protocol.masked_input(request, vector))
    return rest_reply(getattr(protocol, stage)(request))


def round_noise_policy(client: FedzooClient, line_id: str, privacy: dict[str, Any] | None) -> NoisePolicy:
    """Before training on `line_id`: the `NoisePolicy` this round must meet (the owner's, made stricter by the
    operator's privacy terms, fetched first where the device pins operator keys), with the task checked against
    it (`check_task_privacy`); `ProtocolViolation` `bad_privacy_terms` for served terms no operator key signed, or
    older than (or different under the version of) the terms held, and the task's refusal otherwise."""
    if client.neighbour_trust is not None:
        try:
            client.refresh_privacy_terms()
        except CardSignatureError as error:
            raise ProtocolViolation(f"the server's privacy terms are refused ({error.reason}): {error}",
                                    reason="bad_privacy_terms") from None
    policy = client.noise_policy_for(line_id)
    check_task_privacy(privacy, policy)
    return policy


def take_part_securely(client: FedzooClient, work: dict[str, Any], delta: Parameters, num_examples: int,
                       check_in: CheckIn, sleep: Callable[[float], None] = time.sleep,
                       bounds: SecAggBounds = SecAggBounds(), trusted_signing_keys: frozenset[bytes] | None = None,
                       within: bool = True, policy: NoisePolicy | None = None) -> tuple[str, int]:
    """Answer every SecAgg+ stage the server asks of this device; returns (outcome, bytes sent). `bounds` are the
    device's own limits on the round's parameters; `policy` the noise it requires (`round_noise_policy`; default
    the owner's `client.noise_policy`); `trusted_signing_keys`, where the operator ships the enrolled
    devices' public keys, are the only neighbour keys it accepts (docs/privacy.md, "Threat model"); `within`:
    whether the delta was within the DP clip norm before clipping (sent, masked, with adaptive clipping).

    Outcomes: "accepted" (this device's unmask reply is stored), "refused: <reason>" (the device refused
    the server, or the server refused a reply), "dropped out" (the round went on without it)."""
    protocol: SecAggClient | None = None
    vector: np.ndarray | None = None
    sent = 0
    version = work["privacy"]["secure_aggregation"].get("version")
    if version != SECURE_AGGREGATION_VERSION:
        return decline(client, work["round_id"], "unsupported_secure_aggregation",
                       f"the round speaks SecAgg+ version {version}; this device speaks {SECURE_AGGREGATION_VERSION}"
                       ), sent
    while True:
        secure = work["privacy"]["secure_aggregation"]
        if secure["stage"] not in ("selection", "done") and secure["client"] is None:
            return "refused: not_in_cohort", sent
        if secure["request"] is not None:
            if client.signing_key is None:
                return "refused: signing_key_required", sent
            if client.neighbour_trust is None:
                return decline(client, work["round_id"], "operator_keys_required",
                               "this device has no operator key set to check its neighbours' certificates against "
                               "(FedzooClient(operator_keys=...), docs/privacy.md)"), sent
            try:
                if protocol is None:
                    config = protocol_config(secure["config"])
                    certificates = client.neighbour_trust.policy(client.served_revocation_list())
                    protocol = SecAggClient(config, secure["client"], client.signing_key, bounds, trusted_signing_keys,
                                            client.signed_rounds, certificates)
                    vector = ring_input(delta, config, work["privacy"], num_examples,
                                        client.noise_policy if policy is None else policy, bounds, within)
                reply = answer_stage(protocol, secure["stage"], secure["request"], vector)
            except ProtocolViolation as violation:
                log.warning("round %s: this device refuses the server's %s request: %s", work["round_id"],
                            secure["stage"], violation)
                return decline(client, work["round_id"], violation.reason, str(violation)), sent
            outcome = _deliver(client, secure["reply_url"], reply)
            sent += len(reply) if isinstance(reply, bytes) else len(json.dumps(reply).encode())
            if outcome is not None:
                return outcome, sent
            if secure["stage"] == "unmask":
                return "accepted", sent
        elif secure["stage"] == "done":
            return "dropped out", sent
        sleep(secure["retry_after_s"])
        answer = check_in()
        if answer.get("task") is None or answer["task"]["round_id"] != work["round_id"]:
            return "dropped out", sent
        work = answer["task"]


def decline(client: FedzooClient, round_id: int, reason: str, message: str) -> str:
    """Tell the server why this device stops (the round records it); "refused: <reason>" either way: a server
    that broke the protocol may not listen."""
    try:
        client.decline_task(round_id, reason, message)
    except (APIError, ServerUnavailableError) as error:
        log.warning("round %s: the server did not record this device's refusal (%s): %s", round_id, reason, error)
    return f"refused: {reason}"


def _deliver(client: FedzooClient, reply_url: str, reply: dict[str, Any] | bytes) -> str | None:
    """Send a reply until the server has it (None) or refuses it ("refused: <code>"); a 409 duplicate_reply
    after a re-send means the first attempt got through."""
    policy, failures = client.http.retry, 0
    while True:
        try:
            client.secure_reply(reply_url, reply)
            return None
        except ConflictError as error:
            return None if error.code == "duplicate_reply" else f"refused: {error.code}"
        except ServerUnavailableError:
            failures += 1
            if failures == policy.max_attempts:
                raise
            client.http.sleep(policy.delay_s(failures - 1))
