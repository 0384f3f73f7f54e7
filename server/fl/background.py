"""Round work that no request waits for: a zoo-wide round's aggregation and publication (re-extracting,
measuring, compressing and signing the whole zoo: seconds to minutes) runs on a daemon thread of the process
that claimed the round, so the upload that completed the round, and every device request after it, returns at once.

Nothing about the job lives only in this thread: the round's aggregation lease (renewed while the job runs)
is its claim, and its progress is written to the round (`fl_rounds.publication_json`). If the process dies mid-job,
the lease runs out and the next `advance()` (any request, or any worker's deadline watcher) claims the round
again and re-runs the job from the stored updates: nothing is published before the closing write, which is
conditional on still holding the lease, so a re-run publishes exactly once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundRounds:
    """Runs one job per claimed round on a daemon thread; `wait` lets a caller (a test, a shutdown) join them."""

    def __init__(self) -> None:
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def start(self, round_id: int, job: Callable[[], None]) -> None:
        def run() -> None:
            try:
                job()
            except Exception:  # the lease runs out and another advance re-runs the job
                log.exception("the background job of round %s failed; it is re-run when its lease runs out", round_id)
            finally:
                with self._lock:
                    self._threads.pop(round_id, None)

        thread = threading.Thread(target=run, name=f"fedzoo-fl-round-{round_id}", daemon=True)
        with self._lock:
            self._threads[round_id] = thread
        thread.start()

    def wait(self, timeout_s: float) -> None:
        """Join the jobs running now, each for at most `timeout_s`."""
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout_s)
