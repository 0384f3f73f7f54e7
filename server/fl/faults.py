"""Crash points: where the fault-injection tests kill a serving process in the middle of a round.

`FEDZOO_CRASH_AT=<point>:<marker file>` makes the process that reaches `<point>` first create the
marker file and SIGKILL itself, exactly once (the marker stays, so a restarted process carries on).
Unset, as in every deployment, a crash point costs one dictionary lookup. The points, in round order:

- `upload.stored`: an update's row is committed, the device has not heard back;
- `aggregation.claimed`: a worker claimed the round (its lease is in the database) and has done nothing;
- `aggregation.publishing`: the aggregate is computed and its blob stored, the closing write not made.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = ("upload.stored", "aggregation.claimed", "aggregation.publishing")
ENVIRONMENT_VARIABLE = "FEDZOO_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process here, once, if FEDZOO_CRASH_AT names this point."""
    point, _, marker = os.environ.get(ENVIRONMENT_VARIABLE, "").partition(":")
    if point != name or not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # crashed here once already
        return
    os.kill(os.getpid(), signal.SIGKILL)
