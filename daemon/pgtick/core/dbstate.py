"""The database-derived metrics: one aggregate query turned into gauge values.

Terminal-state counts are not counted per scrape (ten million finished rows take seconds):
when the stored counts are older than ``TERMINAL_RECOUNT_SECONDS`` a background thread
recounts them, and only one daemon of a fleet does so at a time.

A schedule is overdue when it is enabled and its most recent occurrence that should have
started by now has no run that started (or was deliberately skipped or cancelled); an
occurrence from before the schedule was created does not count. "Should have
started" allows the schedule's jitter plus a tolerance of one ticker interval (at least
``OVERDUE_MIN_TOLERANCE_SECONDS``), since runs of ``overlap = allow`` schedules are created on
ticks.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from pgtick.config import ScheduleConfig
from pgtick.errors import PgtickError
from pgtick.observability.database import DatabaseSnapshot
from pgtick.scheduling.cron import Cron, CronCache
from pgtick.storage.store import (
    ClaimType,
    FlowState,
    HorizonHolder,
    MetricsSnapshot,
    RunStore,
    ScheduleHealth,
)

TERMINAL_RECOUNT_SECONDS = 300.0
TERMINAL_RECOUNT_TIMEOUT_SECONDS = 120.0
STATEMENT_TIMEOUT_SECONDS = 0.5
POOL_TIMEOUT_SECONDS = 0.5
OVERDUE_MIN_TOLERANCE_SECONDS = 60.0
METRICS_POOL_SIZE = 2  # the aggregate query, and the occasional recount beside it

log = structlog.get_logger("pgtick.dbstate")


def overdue_grace_seconds(tick_interval_seconds: float, jitter_seconds: float) -> float:
    """How late a schedule's run may start before the schedule counts as overdue."""
    return max(OVERDUE_MIN_TOLERANCE_SECONDS, tick_interval_seconds) + jitter_seconds


def due_occurrences(
    schedules: Mapping[str, tuple[Cron | CronCache, float]], now: datetime
) -> dict[str, datetime | None]:
    """Per schedule name (cron, grace seconds): the latest occurrence that should have started
    by ``now``; the ``due_at`` that ``RunStore.metrics_snapshot`` asks about."""
    return {
        name: cron.latest_at_or_before(now - timedelta(seconds=grace))
        for name, (cron, grace) in schedules.items()
    }


def is_overdue(health: ScheduleHealth) -> bool:
    """The overdue rule of this module's docstring, on one snapshot row."""
    return not health.paused and health.due_started is False


class DatabaseProbe:
    """Reads the database-derived gauges (``DatabaseCollector``'s ``fetch``)."""

    def __init__(
        self,
        store: RunStore,
        schedules: Sequence[ScheduleConfig],
        tick_interval_seconds: float,
        *,
        recount_seconds: float = TERMINAL_RECOUNT_SECONDS,
        wall_clock: Callable[[], float] = time.time,
        limits: Sequence[ClaimType] = (),
    ) -> None:
        self._store = store
        self._limits = [t for t in limits if t.limited]  # flow control: pgtick_runs_waiting
        # Cached: asked at every read, the occurrences change once per occurrence.
        self._schedules = {
            s.name: (
                CronCache(Cron.parse(s.cron, s.timezone, s.name)),
                overdue_grace_seconds(tick_interval_seconds, s.jitter_seconds),
            )
            for s in schedules
        }
        self._recount_seconds = recount_seconds
        self._clock = wall_clock
        self._db_offset = 0.0  # database clock minus ours, from the previous read
        self._recounting = threading.Lock()
        self._holders = HolderAges()

    def __call__(self) -> DatabaseSnapshot:
        now = datetime.fromtimestamp(self._clock() + self._db_offset, UTC)
        due_at = due_occurrences(self._schedules, now)
        snap = self._store.metrics_snapshot(
            due_at,
            statement_timeout_seconds=STATEMENT_TIMEOUT_SECONDS,
            pool_timeout_seconds=POOL_TIMEOUT_SECONDS,
        )
        self._db_offset = snap.db_now - self._clock()
        counted = snap.terminal_counted_at
        if counted is None or snap.db_now - counted > self._recount_seconds:
            self._start_recount()
        flows = self._store.flow_state(
            self._limits, statement_timeout_seconds=STATEMENT_TIMEOUT_SECONDS
        )
        return dataclasses.replace(self._gauges(snap), **self._flow_gauges(flows))

    def _flow_gauges(self, flows: Sequence[FlowState]) -> dict[str, Any]:
        by_type = {f.job_type: f for f in flows}
        limits: dict[tuple[str, str], float] = {}
        in_use: dict[tuple[str, str], float] = {}
        for t in self._limits:
            f = by_type.get(t.job_type)
            if t.max_running is not None:
                limits[(t.job_type, "max_running")] = t.max_running
                in_use[(t.job_type, "max_running")] = f.running if f else 0
            if t.rate is not None:
                limits[(t.job_type, "rate")] = t.rate[0]
                in_use[(t.job_type, "rate")] = f.started if f else 0
        waiting = {(f.job_type, "concurrency"): f.waiting_concurrency for f in flows}
        waiting |= {(f.job_type, "rate"): f.waiting_rate for f in flows}
        return {"waiting": waiting, "limits": limits, "limits_in_use": in_use}

    def _gauges(self, snap: MetricsSnapshot) -> DatabaseSnapshot:
        db_now = datetime.fromtimestamp(snap.db_now, UTC)
        runs: dict[tuple[str, str], int] = dict(snap.terminal)
        for q in snap.queues:
            runs[(q.job_type, "queued")] = q.queued
            runs[(q.job_type, "running")] = q.running
            runs[(q.job_type, "failed")] = q.failed
        return DatabaseSnapshot(
            runs=runs,
            queue_depth={q.job_type: q.due for q in snap.queues},
            oldest_due_seconds={
                q.job_type: q.oldest_due_seconds
                for q in snap.queues
                if q.oldest_due_seconds is not None
            },
            stuck={q.job_type: q.stuck for q in snap.queues},
            schedule_last_success={
                s.name: s.last_success_at for s in snap.schedules if s.last_success_at is not None
            },
            schedule_next_run={
                name: upcoming.timestamp()
                for name, (cron, _) in self._schedules.items()
                if (upcoming := cron.next_after(db_now)) is not None
            },
            schedules_overdue=sum(1 for s in snap.schedules if is_overdue(s)),
            terminal_counted_at=snap.terminal_counted_at,
            horizon_age_seconds=self._holders.oldest(snap.horizon, snap.db_now),
            horizon_age_transactions=max((h.xid_age for h in snap.horizon), default=0),
            horizon_sessions_visible=snap.sees_all_sessions,
            dead_tuples=snap.dead_tuples,
            batches_open=snap.batches_open,
            waiting_after=snap.waiting_after,
        )

    def _start_recount(self) -> None:
        if self._recounting.acquire(blocking=False):
            threading.Thread(target=self._recount, name="pgtick-recount", daemon=True).start()

    def _recount(self) -> None:
        try:
            started = time.perf_counter()
            if self._store.refresh_terminal_counts(
                self._recount_seconds, TERMINAL_RECOUNT_TIMEOUT_SECONDS
            ):
                log.debug("terminal_runs_recounted", seconds=time.perf_counter() - started)
        except PgtickError as exc:
            log.warning("terminal_runs_recount_failed", error=str(exc))
        finally:
            self._recounting.release()


class HolderAges:
    """The age in seconds of horizon holders whose age the database does not tell (a
    replication slot, a walsender's hot_standby_feedback): counted from when this process
    first saw them holding, and again from zero when their transaction age drops (their
    xmin moved on). After a restart it starts over: an underestimate, never an overestimate."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # -> (first seen, xid age)

    def oldest(self, holders: Sequence[HorizonHolder], db_now: float) -> float:
        """The largest age among ``holders`` (0: none); forgets holders no longer listed."""
        listed = {(h.kind, h.ident) for h in holders}
        self._seen = {k: v for k, v in self._seen.items() if k in listed}
        return max((self.seconds(h, db_now) for h in holders), default=0.0)

    def seconds(self, holder: HorizonHolder, db_now: float) -> float:
        if holder.age_seconds is not None:
            return max(0.0, holder.age_seconds)
        key = (holder.kind, holder.ident)
        first, xid_age = self._seen.get(key, (db_now, holder.xid_age))
        if holder.xid_age < xid_age:
            first = db_now
        self._seen[key] = (first, holder.xid_age)
        return max(0.0, db_now - first)
