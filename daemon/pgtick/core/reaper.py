"""Recovers runs whose daemon died or froze (and lets go of the cancelled ones such a daemon
still held), forgets dead daemons, applies retention, and keeps the rollups current
(core.rollup).

A pass looks only at leases that ended since the previous complete pass (``REAP_MARGIN_SECONDS``
earlier), and every ``FULL_REAP_SECONDS`` at all of them: while a snapshot held elsewhere keeps
vacuum from removing anything, the lease index holds an ended lease for every run finished
since, and a pass over all of them would grow with the time the snapshot is held.

Any number of daemons reap at once: the reaper's SELECT uses SKIP LOCKED, and its UPDATE
re-checks the lease, so a run is reaped once.

A lease that ended is not taken while its holder is alive (storage.maintenance's
HOLDER_ALIVE_SECONDS says how that is told): a holder skips a run whose row another session
holds locked, so such a lease can end under a daemon that runs its handler and would renew it
at its next beat. A run skipped so (or whose row is locked) keeps the next pass's range from
moving past its lease, so it is taken as soon as it may be; it is never waited for.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

import structlog

from pgtick.config import RetentionConfig
from pgtick.core.backoff import Backoff
from pgtick.core.handlers import JobType
from pgtick.core.rollup import Rollup
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage.db import retry_delay
from pgtick.storage.store import REAP_BATCH_ROWS, RunStore, rollup_retention

# Retention runs every this often, or an eighth of the shortest retention (at least every
# PRUNE_MIN_SECONDS): a table kept 2 minutes but pruned every 5 would hold up to 7 minutes of
# runs, and its size would swing with the passes instead of staying steady.
PRUNE_EVERY_SECONDS = 300.0
PRUNE_MIN_SECONDS = 10.0
PRUNES_PER_RETENTION = 8
# A pass looks at leases that ended since the previous complete pass began, less this margin
# (database clock; a lease renewed or given up while that pass ran is locked, not lost) ...
REAP_MARGIN_SECONDS = 5.0
# ... and every this often at every lease: for one that ended before a pass but became
# visible after it (a claim whose transaction waited longer than its lease, then its daemon
# died), or one another reaper held and then failed to reap.
FULL_REAP_SECONDS = 600.0
WORKER_GONE_AFTER_HEARTBEATS = 10  # a workers row is stale after this many missed beats
WORKER_REAP_EVERY_SECONDS = 60.0

log = structlog.get_logger("pgtick.reaper")


def prune_interval(retention: RetentionConfig) -> float:
    """How often retention runs: see ``PRUNE_EVERY_SECONDS``."""
    shortest = min(retention.by_status().values())
    return min(PRUNE_EVERY_SECONDS, max(PRUNE_MIN_SECONDS, shortest / PRUNES_PER_RETENTION))


class Reaper:
    """Every ``interval`` seconds: reap expired leases; every few minutes (sooner with a short
    retention): prune old runs."""

    def __init__(
        self,
        store: RunStore,
        job_types: Mapping[str, JobType],
        interval_seconds: float,
        heartbeat_seconds: float,
        retention: RetentionConfig,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._job_types = job_types
        self._interval = interval_seconds
        self._worker_gone_seconds = heartbeat_seconds * WORKER_GONE_AFTER_HEARTBEATS
        self._retention = retention
        self._metrics = metrics
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.prune_every = prune_interval(retention)
        # The daemon's start runs the first pass (it creates the partitions finished runs go
        # to), before any claim.
        self._next_prune = time.monotonic() + self.prune_every
        self._next_worker_reap = time.monotonic()
        self._since: datetime | None = None  # leases that ended before were all looked at
        self._next_full = -math.inf  # monotonic: the first pass looks at every lease
        self.full_passes = 0
        self.rollup = Rollup(retention.by_status())

    def _delay_for(self, job_type: str, attempt: int) -> float:
        """Retry delay after lost attempt ``attempt``: none after an isolated crash, so the
        run is running again within lease + reaper interval; then the job type's backoff
        one step behind, so a run that keeps killing its daemon is throttled."""
        if attempt <= 1:
            return 0.0
        jt = self._job_types.get(job_type)
        policy = jt.backoff if jt is not None else Backoff()
        return policy.delay(attempt - 1)

    def reap_once(self, store: RunStore | None = None) -> int:
        """One pass; returns how many runs were recovered. Daemons gone silent are forgotten
        once a minute at most (a worker row is reaped only after many missed heartbeats)."""
        store = store or self._store
        full = time.monotonic() >= self._next_full
        since = None if full else self._since
        # The clock first: the pass below sees every lease that ended before it.
        look = store.reap_look(since)
        reaped = store.reap(self._delay_for, REAP_BATCH_ROWS, since) if look.due else []
        if len(reaped) < REAP_BATCH_ROWS:  # complete: the next pass starts about here ...
            self._since = look.now - timedelta(seconds=REAP_MARGIN_SECONDS)
            if look.oldest is not None:  # ... or at a lease it could not take (yet)
                self._since = min(self._since, look.oldest)
            if full:
                self._next_full = time.monotonic() + FULL_REAP_SECONDS
                self.full_passes += 1
        for run in reaped:
            log.warning(
                "run_reaped",
                run_id=run.id,
                job_type=run.job_type,
                status=run.status,
                holder=run.worker_id,
                runs_again=run.status == "failed",
            )
        # Cancelled runs whose daemon died before it let go of them: free them for retry.
        let_go = store.reap_cancelled()
        if let_go:
            log.info("cancelled_runs_let_go", count=let_go, reason="lease expired")
        if time.monotonic() >= self._next_worker_reap:
            store.reap_workers(self._worker_gone_seconds)
            self._next_worker_reap = time.monotonic() + WORKER_REAP_EVERY_SECONDS
        return len(reaped)

    def reap_holder(self, worker_id: str) -> int:
        """A worker process of this daemon died (worker.processes above 1): recover its runs
        now, by its worker id, rather than after their leases. Only Python handlers' runs: a
        command's process group may outlive the worker process, so its runs wait for their
        leases as after a daemon's death. Returns how many runs were recovered."""
        python_types = sorted(n for n, jt in self._job_types.items() if jt.command is None)
        reaped, let_go = self._store.reap_holder(worker_id, python_types, self._delay_for)
        for run in reaped:
            log.warning(
                "run_reaped",
                run_id=run.id,
                job_type=run.job_type,
                status=run.status,
                holder=run.worker_id,
                runs_again=run.status == "failed",
                reason="worker process died",
            )
        if let_go:
            log.info("cancelled_runs_let_go", count=let_go, reason="worker process died")
        self._store.deregister_worker(worker_id)
        return len(reaped)

    def prune_once(self) -> int:
        """Drop the partitions of terminal runs (and their attempts and output) older than
        their status's retention, and create those ahead; returns the runs dropped."""
        total = 0
        # The rollups' partitions too (their keys beside the statuses').
        retention = rollup_retention(self._retention.by_status())
        for change in self._store.maintain_partitions(retention):
            if change.action == "busy":
                log.info("partition_busy", table=change.table, reason="lock wait, next pass")
            elif change.action == "created":
                log.debug("partition_created", table=change.table, moved=change.rows)
            else:
                log.info(f"partition_{change.action}", table=change.table, rows=change.rows)
                if change.status is not None:
                    total += change.rows
        if total:
            log.info("runs_pruned", count=total)
        audited = self._store.prune_audit_log(self._retention.audit_seconds)
        if audited:
            log.info("audit_log_pruned", count=audited)
        # The next pass an interval after this one ended, whoever ran it (the daemon's start
        # runs the first, which can take seconds on a loaded server).
        self._next_prune = time.monotonic() + self.prune_every
        return total

    def run(self) -> None:
        """Reap on a pinned connection (re-pinned after errors): an idle daemon's reaper costs
        one short transaction per interval, not a pool check as well."""
        failures = 0
        while not self.stop_event.is_set():
            try:
                with self._store.pinned("reap") as store:
                    while not self.stop_event.is_set():
                        self.alive_at = time.monotonic()
                        self.reap_once(store)
                        if time.monotonic() >= self._next_prune:
                            self.prune_once()
                        if self.rollup.due():
                            self.rollup.run_once(store)
                        if failures:
                            self._metrics.outage.succeeded("reap")
                        failures = 0
                        self.stop_event.wait(self._interval)
            except DatabaseError as exc:
                self.alive_at = time.monotonic()  # retrying is progress
                # After an outage (perhaps a failover to a server whose clock differs), the
                # next pass looks at every lease rather than from a bound on the old clock.
                self._next_full = -math.inf
                failures += 1
                self._metrics.db_error("reap")
                wait = min(self._interval, retry_delay(failures))
                if not self._metrics.outage.failed("reap", exc, wait):
                    log.warning("reap_failed", error=str(exc), retry_in=wait)
                self.stop_event.wait(wait)
