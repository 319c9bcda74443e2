"""The internal ticker: turns schedules into runs; there is no external cron.

Every tick (aligned to the wall clock, every ``ticker.interval``) and at an early wake before
the next occurrence, each enabled schedule's occurrences in ``(materialized_until, horizon]``
become runs, and the cursor moves in the same transaction. The cursor, not the presence of
rows, remembers what was created, so pruning runs never re-creates anything.

* ``overlap = allow``: the horizon is ``now + lookahead``; runs exist before they are due.
* ``overlap = skip``: whether an occurrence overlaps a previous run can only be known when it
  comes due, so the horizon is ``now`` and the ticker wakes at each occurrence; the run is
  inserted as ``queued`` or ``skipped`` in that instant.

After downtime, occurrences older than ``MISSED_AFTER_TICKS`` ticks are "missed" and handled
per ``catchup``: ``latest`` keeps the most recent, ``all`` the most recent ``catchup_limit``,
``none`` none. Occurrences that came due within that window are simply on time.

A tick reads and locks only the schedules that need it: each materialization stores the
schedule's next wake in ``next_due_at``, and the early wake is the earliest of those. A row
this version cannot compute (a cron, time zone or setting its config file would refuse, written
by another version or by hand) is paused as ``invalid`` with the reason; it never stops the tick.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from pgtick.config import ScheduleConfig, TickerConfig, config_from_mapping
from pgtick.core import after
from pgtick.errors import ConfigError, DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.scheduling.cron import Cron, jitter_offset
from pgtick.storage.db import retry_delay
from pgtick.storage.store import Occurrence, RunStore, ScheduleDef, ScheduleRow

MISSED_AFTER_TICKS = 2
MIN_WAIT_SECONDS = 0.05
EPSILON = timedelta(microseconds=1)

log = structlog.get_logger("pgtick.ticker")


@functools.lru_cache(maxsize=1024)
def cron_for(expr: str, timezone: str, name: str) -> Cron:
    """Parsed crons are cached: the ticker asks for the same ones every tick."""
    return Cron.parse(expr, timezone, name)


@functools.lru_cache(maxsize=1024)
def _refusal(
    name: str,
    job_type: str,
    cron: str,
    timezone: str,
    catchup: str,
    catchup_limit: int,
    overlap: str,
    jitter_seconds: float,
) -> str | None:
    table = {
        "job_type": job_type,
        "cron": cron,
        "timezone": timezone,
        "catchup": catchup,
        "catchup_limit": catchup_limit,
        "overlap": overlap,
        "jitter": jitter_seconds,
    }
    try:
        config_from_mapping({"schedules": {name: table}})
    except ConfigError as exc:
        return str(exc)
    return None


def refusal(row: ScheduleRow) -> str | None:
    """Why this version would refuse the row's schedule in its config file (one line naming the
    key), or None: rows are checked exactly as the config file is, by the config's own code."""
    return _refusal(
        row.name,
        row.job_type,
        row.cron,
        row.timezone,
        row.catchup,
        row.catchup_limit,
        row.overlap,
        row.jitter_seconds,
    )


def schedule_def(cfg: ScheduleConfig, type_priority: int = 0) -> ScheduleDef:
    """The database form of a ``[schedules.NAME]`` table; its runs get the schedule's
    priority, else ``type_priority`` (its job type's)."""
    return ScheduleDef(
        name=cfg.name,
        job_type=cfg.job_type,
        payload=dict(cfg.payload),
        cron=cfg.cron,
        timezone=cfg.timezone,
        max_attempts=cfg.max_attempts,
        catchup=cfg.catchup,
        catchup_limit=cfg.catchup_limit,
        overlap=cfg.overlap,
        jitter_seconds=cfg.jitter_seconds,
        priority=cfg.priority if cfg.priority is not None else type_priority,
        on_pause=cfg.on_pause,
        follow=cfg.follow,
        after_on=cfg.after_on,
    )


@dataclass(frozen=True)
class Plan:
    """What one tick does for one schedule."""

    occurrences: list[Occurrence]
    until: datetime  # the new cursor
    missed: int  # missed occurrences found (at least; capped by the search)
    next_wake: datetime | None  # database time at which this schedule needs a tick


def with_jitter(cron: Cron, name: str, jitter_seconds: float, at: datetime) -> Occurrence:
    """The run for occurrence ``at``: run_at delayed by the schedule's deterministic jitter."""
    if jitter_seconds <= 0:
        return Occurrence(at, at)
    offset = jitter_offset(name, at, jitter_seconds, cron.next_after(at))
    return Occurrence(at, at + timedelta(seconds=offset))


def _missed(
    cron: Cron, cursor: datetime, cut: datetime, catchup: str, limit: int
) -> tuple[list[datetime], int]:
    """Occurrences in (cursor, cut] to create per ``catchup``, and how many were missed."""
    if catchup == "none":
        first = cron.next_after(cursor)
        return [], int(first <= cut)
    wanted = 1 if catchup == "latest" else limit
    found: list[datetime] = []
    at = cut
    while len(found) <= wanted:
        latest = cron.latest_at_or_before(at)
        if latest is None or latest <= cursor:
            break
        found.append(latest)
        at = latest - EPSILON
    # Searching stops one past the limit: a count above the limit means "more were missed".
    return sorted(found[:wanted]), len(found)


def plan(
    row: ScheduleRow,
    *,
    lookahead_seconds: float,
    tick_seconds: float,
) -> Plan:
    """Decide which occurrences to create for one schedule at the database time ``row.db_now``.

    Pure: the same function serves the ticker, the tests and ``pgtick schedules next``'s
    agreement test.
    """
    cron = cron_for(row.cron, row.timezone, row.name)
    now = row.db_now
    cursor = row.materialized_until or now
    skip = row.overlap == "skip"
    horizon = now if skip else now + timedelta(seconds=lookahead_seconds)
    cut = now - timedelta(seconds=MISSED_AFTER_TICKS * tick_seconds)
    times: list[datetime] = []
    missed = 0
    if cursor < cut and skip and row.jitter_seconds > 0:
        # The cursor waits before a jittered occurrence not due yet (below): it is missed only
        # once its run_at is older than the cut, not because the cursor is.
        first = with_jitter(cron, row.name, row.jitter_seconds, cron.next_after(cursor))
        if first.run_at > cut:
            cut = cursor
    if cursor < cut:
        times, missed = _missed(cron, cursor, cut, row.catchup, row.catchup_limit)
        if row.catchup == "latest" and any(t <= now for t in cron.occurrences(cut, now)):
            times = []  # an on-time occurrence is the most recent one
        cursor = cut
    times += list(cron.occurrences(cursor, horizon)) if horizon > cursor else []
    occurrences = [with_jitter(cron, row.name, row.jitter_seconds, t) for t in times]
    until = max(horizon, row.materialized_until or horizon)
    if skip:
        # Only what is due now; a jittered occurrence not yet due waits, cursor before it.
        pending = [o for o in occurrences if o.run_at > now]
        occurrences = [o for o in occurrences if o.run_at <= now]
        if pending:
            until = pending[0].scheduled_for - EPSILON
    upcoming = with_jitter(cron, row.name, row.jitter_seconds, cron.next_after(until))
    next_wake = upcoming.run_at
    if not skip:
        next_wake = upcoming.run_at - timedelta(seconds=lookahead_seconds)
    return Plan(occurrences, until, missed, next_wake)


@dataclass(frozen=True)
class TickResult:
    schedules: int
    created: int
    skipped: int
    next_wake: datetime | None  # database time of the earliest early wake needed


class Ticker:
    """Materializes schedules on every tick and at early wakes, until stopped."""

    def __init__(
        self,
        store: RunStore,
        schedules: Sequence[ScheduleConfig],
        job_types: Sequence[str],
        cfg: TickerConfig,
        metrics: Metrics,
        wall_clock: Callable[[], float] = time.time,
        priorities: Mapping[str, int] | None = None,
        service: str = "default",
    ) -> None:
        self._store = store
        self._service = service  # whose schedules this daemon's config sync owns
        priorities = priorities or {}
        self._defs = [schedule_def(s, priorities.get(s.job_type, 0)) for s in schedules]
        self._job_types = list(job_types)
        self._cfg = cfg
        self._metrics = metrics
        self._clock = wall_clock
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.last_tick_at: float | None = None
        self._db_offset = 0.0  # database clock minus wall clock, seconds
        self._next_wake: datetime | None = None

    def sync(self) -> None:
        """Upsert the config's schedules; pause those of our service and job types that
        vanished. A name another service or the database owns is left as it is, loudly."""
        changed, paused, elsewhere = self._store.sync_schedules(
            self._defs, self._job_types, self._service
        )
        for name, owner in elsewhere.items():
            log.warning(
                "schedule_owned_elsewhere",
                schedule=name,
                owner=f"service {owner}" if owner is not None else "the database",
                service=self._service,
                message="not synced: its name belongs to another owner; rename it in this "
                "config, or move it (docs/scheduling.md, Who owns a schedule)",
            )
        if changed:
            log.info("schedules_synced", changed=changed)
        if paused:
            log.warning("schedules_paused_gone_from_config", names=paused)

    def tick(self) -> TickResult:
        """One materialization pass over the due schedules no other daemon is doing."""
        created = skipped = 0
        with self._store.materializing() as (conn, rows):
            for row in rows:
                p = self._plan(row)
                if isinstance(p, str):
                    RunStore.pause_invalid_on(conn, row, p)
                    log.error("schedule_invalid", schedule=row.name, error=p)
                    continue
                if p.missed > len(p.occurrences) and row.catchup != "none":
                    log.warning(
                        "schedule_missed_occurrences",
                        schedule=row.name,
                        missed=p.missed,
                        catching_up=len(p.occurrences),
                    )
                elif p.missed and row.catchup == "none":
                    log.info("schedule_missed_occurrences", schedule=row.name, catchup="none")
                waits = after.waits(conn, row, p.occurrences)
                counts = RunStore.materialize_on(
                    conn, row, p.occurrences, p.until, p.next_wake, waits
                )
                created += counts.get("queued", 0)
                skipped += counts.get("skipped", 0)
            RunStore.settle_waiting_on(conn)  # after's deadlines and misses (composition.md)
            next_wake, db_now = RunStore.next_schedule_due_on(conn)
            self._db_offset = db_now.timestamp() - self._clock()
        self.last_tick_at = time.monotonic()
        self._metrics.last_tick.set(self._clock())
        self._next_wake = next_wake
        if created or skipped:
            log.debug("ticked", created=created, skipped=skipped)
        return TickResult(len(rows), created, skipped, next_wake)

    def _plan(self, row: ScheduleRow) -> Plan | str:
        """The row's plan, or the one-line reason this version cannot compute it."""
        reason = refusal(row)
        if reason is not None:
            return reason
        try:
            return plan(
                row,
                lookahead_seconds=self._cfg.lookahead_seconds,
                tick_seconds=self._cfg.interval_seconds,
            )
        except (ConfigError, ValueError, OverflowError) as exc:
            # Accepted by the config's checks, yet not computable (croniter finds no next
            # occurrence, datetime's calendar ends): still this row's problem, not the tick's.
            return f"schedules.{row.name}: {exc}"

    def seconds_to_next_tick(self) -> float:
        """Until the next aligned tick or the earliest early wake, whichever is first."""
        now = self._clock()
        interval = self._cfg.interval_seconds
        aligned = math.floor(now / interval + 1) * interval
        wake = aligned
        if self._next_wake is not None:
            wake = min(wake, self._next_wake.timestamp() - self._db_offset)
        return max(MIN_WAIT_SECONDS, wake - now)

    def run(self) -> None:
        failures = 0
        while not self.stop_event.wait(self.seconds_to_next_tick() if not failures else 0):
            self.alive_at = time.monotonic()
            try:
                self.tick()
                if failures:
                    self._metrics.outage.succeeded("tick")
                failures = 0
            except DatabaseError as exc:
                failures += 1
                self._metrics.db_error("tick")
                delay = retry_delay(failures)
                if not self._metrics.outage.failed("tick", exc, delay):
                    log.warning("tick_failed", error=str(exc), retry_in=delay)
                if self.stop_event.wait(delay):
                    return
