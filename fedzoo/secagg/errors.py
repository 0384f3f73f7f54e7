"""What goes wrong in a SecAgg+ round, as two kinds: a client refusing the server, and a round that cannot finish."""

from __future__ import annotations

from fedzoo.errors import FedzooError


class ProtocolViolation(FedzooError):
    """A client refuses a server message that would break the protocol or its privacy.

    `reason` is one stable word both SDKs report the same way (shared test vectors):
    `wrong_stage`, `malformed`, `not_a_survivor`, `too_few_neighbours`, `too_few_survivors`, `bad_signature`
    (a neighbour's keys or survivor-set signature do not verify), `too_few_signatures` (fewer than t neighbours
    signed this client's survivor set), `inconsistent_survivors` (unmasking for another set than the one it
    signed), `config_out_of_bounds` (parameters outside the device's own `SecAggBounds`), `round_replayed` (a round id
    the device took part in before: `signed_rounds`), `uncertified_key` (a neighbour's key without the operator's
    valid certificate for the device the server names, or one device seated twice), `revoked_key` (a key the
    operator's revocation list names), `bad_revocations` (a revocation list the operator did not sign, or older than
    the one the device kept); under distributed DP (`fedzoo.dp.distributed.check_noise_request`)
    `noise_survivors_above_floor` (noise calibrated for more honest survivors than the signed config guarantees),
    `noise_not_distributed` (central noise where the device's policy requires its own), `noise_below_floor` (a noise
    multiplier below the device's floor).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RoundAborted(FedzooError):
    """The server cannot unmask the sum (too few shares, or a client dealt inconsistent shares).

    Nothing is output: no partial or wrong sum ever leaves the server. `clients` names who caused it.
    """

    def __init__(self, message: str, clients: list[int]) -> None:
        super().__init__(message)
        self.clients = clients
