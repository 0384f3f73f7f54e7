"""The device's small JSON state file: server, device id, token and when that token expires.

Shared by the SDK (`FedzooClient(state_file=...)`, which rewrites it on every registration and token
rotation) and `fedzoo client`. Keys it does not know are kept, so other parts of the SDK can store theirs in
the same file. Written atomically (temporary file, then rename) and readable by the owner only: it holds a
credential.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedzoo.errors import InvalidInputError


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
    state = {**load_state(path), **changes}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(json.dumps(state, indent=2))
    os.replace(partial, path)
