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

A run whose row another session holds locked is skipped, never waited for (one lock must not
hold up the renewal of every other lease), so its lease can end under us. The reapers leave
such a lease to a holder whose heartbeat is recent and came no earlier than just before the
lease's end (storage.maintenance.HOLDER_ALIVE_SECONDS): while runs are skipped so, the loop
beats for them alone (the same statement, given those leases only) every
BLOCKED_BEAT_SECONDS and just before each of their leases ends, between its full beats; the
first beat after the lock goes renews the lease.

A worker process (``worker.processes`` above 1) holding no run sends no beat: its supervisor
marks every such process alive in one statement (service/beats.py), so an idle daemon's
queries do not grow with its processes. Its first claim confirms its leases as of its sending
(lifecycle.accept); the supervisor asks for a beat when the workers row has gone (``ask``).
"""

from __future__ import annotations

import threading
import time

import structlog

from pgtick.core.worker import Worker
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage.db import retry_delay
from pgtick.storage.store import (
    HOLDER_ALIVE_SECONDS,
    LEASE_END_SLACK_SECONDS,
    RunStore,
    WorkerInfo,
)

MIN_WAIT_SECONDS = 0.05
# While another session holds a run's row locked, beat at least this often: the reapers take
# a lease that ended from a holder whose last beat is older than HOLDER_ALIVE_SECONDS.
BLOCKED_BEAT_SECONDS = HOLDER_ALIVE_SECONDS / 5

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
        # A worker process's supervisor beats for it while it holds no run (service/beats.py).
        self.idle_beats_elsewhere = False
        self._asked = False  # the supervisor asked for a beat of our own (ask)
        # Set at a process's exit: the workers row is removed while the beats go on renewing
        # the leases of handlers still running (service/work.py, exit_releasing).
        self.leaving = False
        # Set when a run with a timeout starts (or to stop): its deadline may come before the
        # wake-up this loop went to sleep for.
        self._nudged = threading.Event()
        worker.life.on_deadline = self._nudged.set
        self.alive_at = time.monotonic()
        self.last_success_at: float | None = None
        # Runs the last beat skipped, row-locked by another session, and the ends (monotonic,
        # sorted) of their leases as last renewed.
        self._blocking: list[int] = []
        self._lease_ends: list[float] = []
        self._full_due = 0.0  # monotonic: when a beat of every lease is due
        self._full_sent_at = self.alive_at  # when the last one was sent

    def stop(self) -> None:
        self.stop_event.set()
        self._nudged.set()

    def ask(self) -> None:
        """Beat now, even holding no run: the supervisor found the workers row gone (another
        daemon's reaper forgot us), and our beat registers again."""
        self._asked = True
        self._nudged.set()

    def beat(self, *, only_blocked: bool = False) -> None:
        """One heartbeat: extend every held lease and report the ones found gone; then give
        back the claimed runs that waited too long for a thread. ``only_blocked``: a beat
        between two full ones for the runs the last beat found row-locked by another session
        only, which says this daemon is alive and renews them once the lock has gone."""
        life = self._worker.life
        blocked = not life.may_claim()
        sent_at = time.monotonic()
        leases = life.leases()
        asked, self._asked = self._asked, False
        if not leases and self.idle_beats_elsewhere and not asked and not self.leaving:
            return  # nothing to renew, and the supervisor keeps the workers row alive
        if only_blocked:
            leases = {rid: leases[rid] for rid in self._blocking if rid in leases}
        else:
            self._full_sent_at = sent_at
        beat = self._store.heartbeat(self._worker.worker_id, list(leases.values()))
        if not beat.registered and not self.leaving:
            # Silent for long (an outage): another daemon's reaper forgot us. Come back.
            self._store.register_worker(self._info)
            log.info("worker_registered_again", worker_id=self._info.id)
        # A cancelled run is renewed (or busy) while its handler may run, yet its handler is
        # told to stop: it counts as gone for the lifecycle, which keeps it until it lets go.
        gone = (set(leases) - beat.held - beat.busy) | (beat.cancelled & set(leases))
        if gone:
            attempts = {rid: leases[rid].attempt for rid in gone}
            self._worker.giveback.let_go(life.lost(gone, beat.cancelled & gone, attempts))
        # A beat of the blocked runs only re-checked nothing else: with them renewed, every
        # lease is known renewed as of the last full beat.
        blocking = life.confirm(
            self._full_sent_at if only_blocked else sent_at, beat.held, beat.busy
        )
        # Row-locked by another transaction that is not our own result being written (an
        # operator's, a session's FOR UPDATE): not renewed, looked at again soon (beaten);
        # claims wait until a beat renews every lease. Logged when the set changes.
        self._lease_ends = sorted(life.lease_ends(blocking))
        if blocking and blocking != self._blocking:
            log.warning("heartbeat_skipped_locked_runs", run_ids=blocking)
        elif self._blocking and not blocking:
            log.info("heartbeat_locked_runs_cleared", run_ids=self._blocking)
        self._blocking = blocking
        if blocked:
            self._worker.wake()  # the dispatcher waited for this beat to claim again
        self.last_success_at = time.monotonic()
        self._worker.giveback.release_stale(self._store)

    def beaten(self, now: float, *, full: bool) -> float:
        """A beat (``full``: of every lease) at ``now`` went through: when to beat next. The
        full beat an interval after the last; while runs are skipped for another session's
        row lock, a beat for them at most BLOCKED_BEAT_SECONDS later, and just before the next
        of their leases ends (half LEASE_END_SLACK_SECONDS before), so that the reapers see
        this daemon beat at that lease's end and leave the run to it."""
        if full:
            self._full_due = now + self._interval
        if not self._blocking:
            return self._full_due
        soon = min(self._full_due, now + BLOCKED_BEAT_SECONDS)
        for end in self._lease_ends:
            aim = end - LEASE_END_SLACK_SECONDS / 2
            if aim > now + MIN_WAIT_SECONDS:
                return min(aim, soon)
        return soon

    def run(self) -> None:
        failures = 0
        next_beat = time.monotonic() + self._interval
        while not self.stop_event.is_set():
            now = time.monotonic()
            self.alive_at = now
            if now >= next_beat or self._asked:
                try:
                    # Else a beat of the row-locked runs only.
                    full = now >= self._full_due or self._asked
                    self.beat(only_blocked=not full)
                    if failures:
                        log.info("heartbeat_recovered", after_failures=failures)
                        self._metrics.outage.succeeded("heartbeat")
                    failures = 0
                    next_beat = self.beaten(now, full=full)
                except DatabaseError as exc:
                    failures += 1
                    self._metrics.db_error("heartbeat")
                    delay = min(self._interval, retry_delay(failures))
                    if not self._metrics.outage.failed("heartbeat", exc, delay):
                        log.warning("heartbeat_failed", error=str(exc), retry_in=delay)
                    next_beat = now + delay
            self._nudged.clear()  # before looking: a run started after this wakes us
            deadline = self._worker.giveback.expire_timeouts()
            wake_at = next_beat if deadline is None else min(next_beat, deadline)
            self._nudged.wait(max(MIN_WAIT_SECONDS, wake_at - time.monotonic()))
