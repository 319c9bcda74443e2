"""The supervisor's beat for its idle worker processes (``worker.processes`` above 1).

A worker process's heartbeat renews the leases it holds and marks its workers row alive
(core/heartbeat.py). Holding no run, it has nothing to renew, and N idle processes beating
each would make an idle daemon's queries grow with N (issue 47: at most one a second
whatever N). So a process holding no run sends no beat, and the supervisor marks every such
process alive in one statement per heartbeat interval. Which ones: those whose status (sent
every second) says they hold no run and came within ``children.STATUS_FRESH_SECONDS``. A
frozen or dying process stops talking, so the supervisor stops beating for it at once: the
reapers judge its liveness as they would judge its own beats. A process that claims beats
for itself from then on; a row another daemon's reaper removed (after an outage) is not made
again here: the process is asked to beat, and its beat registers it again.
"""

from __future__ import annotations

import threading

import structlog

from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.service.children import Children
from pgtick.storage.db import retry_delay
from pgtick.storage.store import RunStore

log = structlog.get_logger("pgtick.service")


class IdleBeats:
    """Beats for the idle worker processes every ``interval_seconds`` until stopped."""

    def __init__(
        self, store: RunStore, children: Children, interval_seconds: float, metrics: Metrics
    ) -> None:
        self._store = store
        self._children = children
        self._interval = interval_seconds
        self._metrics = metrics
        self.stop_event = threading.Event()

    def beat_once(self) -> int:
        """One beat of the idle processes; returns how many rows it marked alive."""
        ids = self._children.idle_worker_ids()
        if not ids:
            return 0
        found = self._store.beat_workers(ids)
        for worker_id in sorted(set(ids) - found):
            self._children.ask_beat(worker_id)
        return len(found)

    def run(self) -> None:
        failures = 0
        wait = self._interval
        while not self.stop_event.wait(wait):
            try:
                self.beat_once()
            except DatabaseError as exc:
                failures += 1
                self._metrics.db_error("heartbeat")
                wait = min(self._interval, retry_delay(failures))
                if not self._metrics.outage.failed("heartbeat", exc, wait):
                    log.warning("heartbeat_failed", error=str(exc), retry_in=wait)
            else:
                if failures:
                    self._metrics.outage.succeeded("heartbeat")
                failures, wait = 0, self._interval
