"""A background deadline check, so a round past its deadline closes or fails without waiting for traffic.

The round service already advances overdue rounds whenever a request comes in (`RoundService.advance`);
with no devices calling, a round would sit `collecting` after its deadline and the next round of the plan
would never open. The serving process (each gunicorn worker, the simulation's loopback server) therefore
runs one `DeadlineWatcher` thread that calls `advance()` every `interval_s`. Several watchers on one
database are safe: failing and aggregating a round are both conditional claims, so one of them wins.
"""

from __future__ import annotations

import logging
import threading

from flask import Flask

from fedzoo.server.fl.rounds import RoundService
from fedzoo.server.fl.routes import SERVICE_KEY

DEADLINE_CHECK_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


class DeadlineWatcher:
    """A daemon thread advancing the rounds of one service every `interval_s` seconds until `stop()`."""

    def __init__(self, service: RoundService, interval_s: float = DEADLINE_CHECK_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.service, self.interval_s = service, interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fedzoo-fl-deadlines", daemon=True)

    def start(self) -> DeadlineWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop checking, and let the background round jobs of this process finish (a thread left inside
        onnxruntime at interpreter teardown aborts the process; one cut off is re-run by another worker)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.service.background.wait(timeout_s=30)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.service.advance()
            except Exception:  # a failed check must not end the thread; the next one retries
                log.exception("background deadline check failed")


def start_deadline_watcher(app: Flask, interval_s: float = DEADLINE_CHECK_INTERVAL_S) -> DeadlineWatcher:
    """Start the background deadline check for the app's round service; the caller stops it on shutdown."""
    return DeadlineWatcher(app.extensions[SERVICE_KEY], interval_s).start()
