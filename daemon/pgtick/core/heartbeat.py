"""Lease renewal for everything this process holds, in one statement per beat.

The heartbeat uses a store of its own (a one-connection pool): handlers holding connections
in ``ctx.transaction()`` can never make it wait for one and lose leases.

The same loop enforces Python handlers' timeouts, since it already wakes on a timer, and
gives back runs claimed ahead that no thread could start for a while. After a database outage
the first successful beat re-checks every held lease: runs that came back missing were lost
while we were away, and their handlers are told to stop. Until a beat has confirmed the
leases, the dispatcher claims nothing and no claimed run is started (the lifecycle judges it
from the time of the last successful beat), so a beat that cannot reach the database fails
fast rather than waiting for a connection.
"""

from __future__ import annotations

import threading
import time

import structlog

from pgtick.core.worker import Worker
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage.db import retry_delay
from pgtick.storage.store import RunStore, WorkerInfo

MIN_WAIT_SECONDS = 0.05

log = structlog.get_logger("pgtick.heartbeat")


class Heartbeat:
    """Renews leases every ``interval`` seconds until stopped."""

    def __init__(
        self,
        store: RunStore,
        worker: Worker,
        interval_seconds: float,
        metrics: Metrics,
        info: WorkerInfo,
    ) -> None:
        self._store = store
        self._info = info
        self._worker = worker
        self._interval = interval_seconds
        self._metrics = metrics
        self.stop_event = threading.Event()
        # Set when a run with a timeout starts (or to stop): its deadline may come before the
        # wake-up this loop went to sleep for.
        self._nudged = threading.Event()
        worker.life.on_deadline = self._nudged.set
        self.alive_at = time.monotonic()
        self.last_success_at: float | None = None

    def stop(self) -> None:
        self.stop_event.set()
        self._nudged.set()

    def beat(self) -> None:
        """One heartbeat: extend every held lease and report the ones found gone; then give
        back the claimed runs that waited too long for a thread."""
        life = self._worker.life
        blocked = not life.may_claim()
        sent_at = time.monotonic()
        leases = life.leases()
        beat = self._store.heartbeat(self._worker.worker_id, list(leases.values()))
        if not beat.registered:
            # Silent for long (an outage): another daemon's reaper forgot us. Come back.
            self._store.register_worker(self._info)
            log.info("worker_registered_again", worker_id=self._info.id)
        gone = set(leases) - beat.held - beat.busy
        if gone:
            attempts = {rid: leases[rid].attempt for rid in gone}
            self._worker.let_go(life.lost(gone, beat.cancelled & gone, attempts))
        blocking = life.confirm(sent_at, beat.held, beat.busy)
        if blocking:
            # Row-locked by another transaction that is not our own result being written (an
            # operator's, a session's FOR UPDATE): not renewed, looked at again next beat;
            # claims wait until a beat renews every lease.
            log.warning("heartbeat_skipped_locked_runs", run_ids=blocking)
        if blocked:
            self._worker.wake()  # the dispatcher waited for this beat to claim again
        self.last_success_at = time.monotonic()
        self._worker.release_stale(self._store)

    def run(self) -> None:
        failures = 0
        next_beat = time.monotonic() + self._interval
        while not self.stop_event.is_set():
            now = time.monotonic()
            self.alive_at = now
            if now >= next_beat:
                try:
                    self.beat()
                    if failures:
                        log.info("heartbeat_recovered", after_failures=failures)
                    failures = 0
                    next_beat = now + self._interval
                except DatabaseError as exc:
                    failures += 1
                    self._metrics.db_error("heartbeat")
                    delay = min(self._interval, retry_delay(failures))
                    log.warning("heartbeat_failed", error=str(exc), retry_in=delay)
                    next_beat = now + delay
            self._nudged.clear()  # before looking: a run started after this wakes us
            deadline = self._worker.expire_timeouts()
            wake_at = next_beat if deadline is None else min(next_beat, deadline)
            self._nudged.wait(max(MIN_WAIT_SECONDS, wake_at - time.monotonic()))
