"""A device signs under each round id once: the memory that makes a "preparation" run of a round useless.

A lying server could run a round several times under one id, fail each run before unmasking, and replay the
survivor-set signatures it collected in the run that counts (issue #44). Signatures name the signer's fresh
stage-1 keys and nonce, so they do not verify across runs; on top of that an honest device takes part in a
round id at most once: `claim` is called before it signs anything, and refuses (`round_replayed`) a round id it
claimed before. This class keeps the memory in the process; the SDK's participation loop keeps it in the
device's state file (`fedzoo.clients.device_state.StateFileSignedRounds`), so it survives restarts.
"""

from __future__ import annotations

import hashlib

from fedzoo.secagg.errors import ProtocolViolation


COHORT_SEPARATOR = "/subnet-"  # a zoo-wide round's cohorts: `fl-round-<id>/subnet-<i>` (server.fl.secure_rounds)


def round_key(round_id: str) -> str:
    """What is remembered of a round id: 16 bytes of its SHA-256, hex (a device keeps thousands). The cohorts of
    one round share it (`fl-round-7/subnet-0` and `/subnet-1`): a device takes part in one cohort of a round, so a
    lying server cannot put it into two and difference their sums."""
    return hashlib.sha256(round_id.split(COHORT_SEPARATOR, 1)[0].encode()).hexdigest()[:32]


def replayed(round_id: str) -> ProtocolViolation:
    return ProtocolViolation(f"this device already took part in round {round_id!r}; it signs under a round id once",
                             reason="round_replayed")


class SignedRounds:
    """The round ids this device has signed under, in memory."""

    def __init__(self) -> None:
        self._claimed: set[str] = set()

    def claim(self, round_id: str) -> None:
        """Remember `round_id`, or raise ProtocolViolation (`round_replayed`) if it was claimed before."""
        key = round_key(round_id)
        if key in self._claimed:
            raise replayed(round_id)
        self._claimed.add(key)
