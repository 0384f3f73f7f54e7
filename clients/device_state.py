"""The device's small JSON state file: server, device id, token and when that token expires, the pinned keys,
the newest card version accepted per model line, and the SecAgg+ round ids the device took part in.

Shared by the SDK (`FedzooClient(state_file=...)`, which rewrites it on every registration and token
rotation) and `fedzoo client`. Keys it does not know are kept, so other parts of the SDK can store theirs in
the same file. It belongs in a durable state directory, never in the download cache: clearing a cache must not
reset what the device accepted. Every change is a read-modify-write under an exclusive lock on `<file>.lock`,
written atomically (temporary file, then rename), so two processes of one app never lose each other's change.
Readable by the owner only: it holds a credential.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedzoo.errors import InvalidInputError
from fedzoo.secagg.signed_rounds import SignedRounds, replayed, round_key

SIGNED_ROUNDS_STATE = "secagg_signed_rounds"  # round keys (`signed_rounds.round_key`) of every SecAgg+ round taken


def load_state(path: Path) -> dict[str, Any]:
    """The saved state, or {} when there is none yet."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"client state {path} is not valid JSON ({error}); delete it and register again",
                                field="state") from None


def update_state(path: Path, changes: dict[str, Any]) -> None:
    """Merge `changes` into the saved state."""
    change_state(path, lambda _state: changes)


def change_state(path: Path, changes_for: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Merge `changes_for(current state)` into the saved state, atomically with respect to other processes:
    a compare-and-swap when `changes_for` raises on a state it must not overwrite. Returns the new state."""
    with _locked(path):
        state = load_state(path)
        state = {**state, **changes_for(state)}
        partial = path.with_name(path.name + ".tmp")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(json.dumps(state, indent=2))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
        return state


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


class StateFileSignedRounds(SignedRounds):
    """The SecAgg+ round ids this device took part in, kept in its state file (so a restarted app, or a second
    process of it, refuses a round id it signed under before). Keyed by the state's server as well: another
    server's round of the same name is another round."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def claim(self, round_id: str) -> None:
        def claimed(state: dict[str, Any]) -> dict[str, Any]:
            key = round_key(f"{state.get('server', '')} {round_id}")
            taken = state.get(SIGNED_ROUNDS_STATE, [])
            if key in taken:
                raise replayed(round_id)
            return {SIGNED_ROUNDS_STATE: [*taken, key]}

        change_state(self.path, claimed)
