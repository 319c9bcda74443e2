"""Recovers runs whose daemon died or froze, forgets dead daemons, and applies retention.

Any number of daemons reap at once: the reaper's SELECT uses SKIP LOCKED, and its UPDATE
re-checks the lease, so a run is reaped once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import structlog

from pgtick.backoff import Backoff
from pgtick.config import RetentionConfig
from pgtick.db import retry_delay
from pgtick.errors import DatabaseError
from pgtick.handlers import JobType
from pgtick.metrics import Metrics
from pgtick.store import RunStore

PRUNE_EVERY_SECONDS = 300.0
WORKER_GONE_AFTER_HEARTBEATS = 10  # a workers row is stale after this many missed beats

log = structlog.get_logger("pgtick.reaper")


class Reaper:
    """Every ``interval`` seconds: reap expired leases; every few minutes: prune old runs."""

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
        self._next_prune = time.monotonic() + PRUNE_EVERY_SECONDS

    def _delay_for(self, job_type: str, attempt: int) -> float:
        """Retry delay after lost attempt ``attempt``: none after an isolated crash, so the
        run is running again within lease + reaper interval; then the job type's backoff
        one step behind, so a run that keeps killing its daemon is throttled."""
        if attempt <= 1:
            return 0.0
        jt = self._job_types.get(job_type)
        policy = jt.backoff if jt is not None else Backoff()
        return policy.delay(attempt - 1)

    def reap_once(self) -> int:
        """One pass; returns how many runs were recovered."""
        reaped = self._store.reap(self._delay_for)
        for run in reaped:
            log.warning("run_reaped", run_id=run.id, job_type=run.job_type, status=run.status)
        self._store.reap_workers(self._worker_gone_seconds)
        return len(reaped)

    def prune_once(self) -> int:
        """Delete terminal runs older than their status's retention."""
        r = self._retention
        total = 0
        for status, seconds in (
            ("succeeded", r.succeeded_seconds),
            ("dead", r.dead_seconds),
            ("cancelled", r.cancelled_seconds),
            ("skipped", r.skipped_seconds),
        ):
            total += self._store.prune(status, seconds)
        if total:
            log.info("runs_pruned", count=total)
        return total

    def run(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            self.alive_at = time.monotonic()
            try:
                self.reap_once()
                if time.monotonic() >= self._next_prune:
                    self.prune_once()
                    self._next_prune = time.monotonic() + PRUNE_EVERY_SECONDS
                failures = 0
                wait = self._interval
            except DatabaseError as exc:
                failures += 1
                self._metrics.db_error("reap")
                wait = min(self._interval, retry_delay(failures))
                log.warning("reap_failed", error=str(exc), retry_in=wait)
            self.stop_event.wait(wait)
