"""What the operator looks at: ``status`` (workers, queues per job type, schedules and the
problems among them) and the console's overview, from the same reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pgtick.core import dbstate
from pgtick.errors import PgtickError, ScheduleError
from pgtick.scheduling.cron import Cron
from pgtick.storage.store import (
    ClaimType,
    FlowState,
    HorizonHolder,
    JobTypeControl,
    JobTypeStats,
    RollupBucket,
    RunStore,
    ScheduleHealth,
    ScheduleState,
    WorkerRow,
)
from pgtick.surfaces.operations.charts import queue_depth_per_type
from pgtick.surfaces.operations.controls import (
    Limits,
    describe,
    effective_limits,
    limits_in_force,
    paused_types,
)
from pgtick.surfaces.operations.flow import describe_limits
from pgtick.surfaces.operations.rollup import day_totals
from pgtick.surfaces.operations.schedules import ScheduleView, schedule_views

# A worker whose last heartbeat is older than this many heartbeat intervals is marked stale
# and does not count as serving its job types.
STALE_AFTER_HEARTBEATS = 3
# status reads the metrics' aggregate query; an operator can wait longer than a scrape.
STATUS_TIMEOUT_SECONDS = 30.0
# The overview's chart: succeeded runs per minute over this many minutes.
THROUGHPUT_MINUTES = 60
# A snapshot holding the MVCC horizon longer than this is a problem (status exits 5): the
# PgtickVacuumBlocked alert's threshold; `status --horizon-threshold` changes it.
DEFAULT_HORIZON_THRESHOLD_SECONDS = 900.0
NO_MONITOR_NOTE = (
    "role {user!r} cannot see the age, state and client of other roles' sessions (no "
    "pg_monitor): one holding the MVCC horizon is named without its age, and not judged "
    "against the threshold; `pgtick grants ROLE --monitor` adds the grant"
)


@dataclass(frozen=True)
class Horizon:
    """Who holds the database's MVCC horizon, as far as this role can see."""

    holder: HorizonHolder | None  # the oldest, None: nothing visible holds it
    sees_all_sessions: bool
    threshold_seconds: float

    @property
    def problem(self) -> str | None:
        """One line when the holder is older than the threshold (or is a slot nobody uses)."""
        h = self.holder
        if h is None:
            return None
        if h.kind == "slot" and h.state == "inactive":
            return (
                f"inactive replication slot {h.ident} holds the MVCC horizon "
                f"({h.xid_age} transactions old)"
            )
        if h.age_seconds is None or h.age_seconds <= self.threshold_seconds:
            return None
        return f"{describe_holder(h)} holds the MVCC horizon for {h.age_seconds:.0f}s"


def describe_holder(h: HorizonHolder) -> str:
    """``session pid 123 (user app, application 'report', from 10.0.0.5, idle in
    transaction)``, ``replication slot standby1 (physical, active)``, ``prepared transaction
    'gid' (user app)``."""
    if h.kind == "slot":
        return f"replication slot {h.ident} ({h.application}, {h.state})"
    if h.kind == "prepared":
        return f"prepared transaction {h.ident!r} (user {h.user})"
    if h.state is None:  # another role's session, seen without pg_monitor
        return f"session pid {h.ident} (user {h.user}, application {h.application!r})"
    where = h.client or "local socket"
    kind = "" if h.backend_type in (None, "client backend") else f"{h.backend_type} "
    return (
        f"{kind}session pid {h.ident} (user {h.user}, application {h.application!r}, "
        f"from {where}, {h.state})"
    )


@dataclass(frozen=True)
class WorkerStatus:
    worker: WorkerRow
    stale: bool


@dataclass(frozen=True)
class JobTypeStatus:
    """A job type's queue and how many live daemons handle it; for a type with limits (in the
    config this was read with), what they allow and what they hold back now."""

    stats: JobTypeStats
    live_workers: int
    limits: ClaimType | None = None
    flow: FlowState | None = None
    # Each limit with its source (config, or runtime: `pgtick limits`), and the pause.
    in_force: Limits | None = None
    control: JobTypeControl | None = None

    @property
    def limits_text(self) -> str:
        """``max_running 3 (config), rate 60/second (runtime)`` ('' without limits)."""
        if self.in_force is not None:
            return describe(self.in_force)
        return describe_limits(self.limits) if self.limits is not None else ""

    @property
    def paused(self) -> bool:
        return self.control is not None and self.control.paused

    @property
    def held_back_text(self) -> str:
        """``12 on concurrency, 4 on rate`` ('' when nothing waits on a limit)."""
        f = self.flow
        if f is None:
            return ""
        parts = [f"{f.waiting_concurrency} on concurrency"] if f.waiting_concurrency else []
        parts += [f"{f.waiting_rate} on rate"] if f.waiting_rate else []
        return ", ".join(parts)

    @property
    def unserved(self) -> bool:
        """Due runs that no live daemon will claim."""
        return self.stats.due > 0 and self.live_workers == 0


@dataclass(frozen=True)
class ScheduleStatus:
    state: ScheduleState
    next_at: datetime | None  # None: paused, or a cron this version cannot compute
    last_success_at: datetime | None
    overdue: bool
    error: str | None  # why next_at could not be computed


@dataclass(frozen=True)
class Status:
    """One look at the whole system; ``problems`` is what needs an operator now."""

    db_now: datetime
    stale_after_seconds: float
    workers: list[WorkerStatus]
    job_types: list[JobTypeStatus]
    schedules: list[ScheduleStatus]
    problems: list[str]
    horizon: Horizon
    notes: list[str]  # what status could not see, and why
    paused: list[JobTypeControl] = field(default_factory=list)  # job types paused, by name

    @property
    def healthy(self) -> bool:
        return not self.problems


def _parsed(states: Sequence[ScheduleState]) -> dict[str, Cron | ScheduleError]:
    out: dict[str, Cron | ScheduleError] = {}
    for s in states:
        try:
            out[s.name] = Cron.parse(s.cron, s.timezone, s.name)
        except ScheduleError as exc:
            out[s.name] = exc
    return out


def _workers_and_queues(
    store: RunStore, heartbeat_seconds: float, limits: Sequence[ClaimType] = ()
) -> tuple[list[WorkerStatus], list[JobTypeStatus]]:
    """Registered daemons (stale after a few missed heartbeats) and each job type's queue with
    how many live daemons handle it, its limits in force (``limits``: the config's, with what
    operators changed at runtime) and its pause: what `status` and the console's overview
    both show."""
    controls = store.job_type_controls()
    config_limits = {t.job_type: t for t in limits}
    limits = effective_limits(limits, controls)
    stale_after = STALE_AFTER_HEARTBEATS * heartbeat_seconds
    workers = [WorkerStatus(w, w.heartbeat_age_seconds > stale_after) for w in store.list_workers()]
    served: dict[str, int] = {}
    for w in workers:
        if not w.stale:
            for job_type in w.worker.job_types:
                served[job_type] = served.get(job_type, 0) + 1
    by_type = {t.job_type: t for t in limits}
    flows = {f.job_type: f for f in store.flow_state(limits)}
    job_types = [
        JobTypeStatus(
            t,
            served.get(t.job_type, 0),
            by_type.get(t.job_type),
            flows.get(t.job_type),
            limits_in_force(t.job_type, config_limits.get(t.job_type), controls.get(t.job_type)),
            controls.get(t.job_type),
        )
        for t in store.job_type_stats()
    ]
    return workers, job_types


def status(
    store: RunStore,
    *,
    heartbeat_seconds: float,
    tick_interval_seconds: float,
    horizon_threshold_seconds: float = DEFAULT_HORIZON_THRESHOLD_SECONDS,
    limits: Sequence[ClaimType] = (),
    timeout_seconds: float = STATUS_TIMEOUT_SECONDS,
) -> Status:
    """Workers, queues per job type and schedules, with the problems among them: stuck runs,
    overdue schedules, due runs of a job type no live daemon handles, and a snapshot holding
    the MVCC horizon past ``horizon_threshold_seconds``. The one source of the ATTENTION
    items: ``pgtick status`` prints them, the console's banner shows them (``timeout_seconds``
    bounds the metrics query: an operator waits longer than a page)."""
    workers, job_types = _workers_and_queues(store, heartbeat_seconds, limits)

    states = store.schedule_states()
    crons = _parsed(states)
    now = store.now()
    graced = {
        s.name: (cron, dbstate.overdue_grace_seconds(tick_interval_seconds, s.jitter_seconds))
        for s in states
        if isinstance(cron := crons[s.name], Cron)
    }
    snap = store.metrics_snapshot(
        dbstate.due_occurrences(graced, now),
        statement_timeout_seconds=timeout_seconds,
        pool_timeout_seconds=timeout_seconds,
    )
    health: dict[str, ScheduleHealth] = {h.name: h for h in snap.schedules}
    schedules = [_schedule_status(s, crons[s.name], health.get(s.name), now) for s in states]

    problems = [
        f"{t.stats.stuck} stuck run(s) of {t.stats.job_type} (running with an expired lease)"
        for t in job_types
        if t.stats.stuck
    ]
    problems += [f"schedule {s.state.name} is overdue" for s in schedules if s.overdue]
    problems += [
        f"{t.stats.due} due run(s) of {t.stats.job_type} and no live daemon handles it"
        for t in job_types
        if t.unserved
    ]
    horizon = Horizon(
        snap.horizon[0] if snap.horizon else None,
        snap.sees_all_sessions,
        horizon_threshold_seconds,
    )
    if horizon.problem is not None:
        problems.append(horizon.problem)
    # The note only where it changes what status says: a session of another role holds the
    # horizon and its age is hidden (not on every call of a role without pg_monitor).
    hidden = horizon.holder is not None and horizon.holder.kind == "session"
    hidden = hidden and horizon.holder is not None and horizon.holder.age_seconds is None
    notes = (
        []
        if snap.sees_all_sessions or not hidden
        else [NO_MONITOR_NOTE.format(user=store.current_user())]
    )
    stale_after = STALE_AFTER_HEARTBEATS * heartbeat_seconds
    paused = paused_types(store.job_type_controls())
    return Status(now, stale_after, workers, job_types, schedules, problems, horizon, notes, paused)


def _schedule_status(
    state: ScheduleState, cron: Cron | ScheduleError, health: ScheduleHealth | None, now: datetime
) -> ScheduleStatus:
    last_ok = None
    if health is not None and health.last_success_at is not None:
        last_ok = datetime.fromtimestamp(health.last_success_at, UTC)
    if isinstance(cron, ScheduleError):
        return ScheduleStatus(state, None, last_ok, False, str(cron))
    next_at, error = None, None
    if not state.paused:
        try:
            next_at = cron.next_after(now)
        except ScheduleError as exc:
            error = str(exc)
    overdue = health is not None and dbstate.is_overdue(health)
    return ScheduleStatus(state, next_at, last_ok, overdue, error)


def _idle_types(
    workers: Sequence[WorkerStatus],
    job_types: Sequence[JobTypeStatus],
    limits: Sequence[ClaimType],
    controls: Mapping[str, JobTypeControl],
) -> list[JobTypeStatus]:
    """The job types live daemons handle (their config's) that have no queued, running or
    recently dead run: zeros, so that the overview lists every job type, busy or not."""
    present = {t.stats.job_type for t in job_types}
    served: dict[str, int] = {}
    for w in workers:
        if not w.stale:
            for name in w.worker.job_types:
                served[name] = served.get(name, 0) + 1
    by_type = {t.job_type: t for t in limits}
    return [
        JobTypeStatus(
            JobTypeStats(name, 0, None, 0, 0, 0, 0, 0),
            served[name],
            by_type.get(name),
            None,
            limits_in_force(name, by_type.get(name), controls.get(name)),
            controls.get(name),
        )
        for name in sorted(set(served) - present)
    ]


@dataclass(frozen=True)
class Overview:
    """The console's front page: queues per job type, throughput, workers, schedules.
    ``succeeded_per_minute`` is oldest minute first; None when it could not be read in time."""

    db_now: datetime
    job_types: list[JobTypeStatus]
    workers: list[WorkerStatus]
    schedules: list[ScheduleView]
    succeeded_per_minute: list[int] | None
    # per job type, (succeeded, dead) per minute, oldest first; None when out of time
    finished_per_type: dict[str, tuple[list[int], list[int]]] | None = None
    # per job type, runs due and waiting at each minute, oldest first; None when out of time
    queue_depth_per_type: dict[str, list[int]] | None = None
    # per job type, its last 24 hours from the rollups (absent: nothing in them); None when
    # out of time
    day_totals: dict[str, RollupBucket] | None = None


def overview(
    store: RunStore,
    *,
    heartbeat_seconds: float,
    next_count: int = 1,
    limits: Sequence[ClaimType] = (),
) -> Overview:
    """What the console's overview shows, read from one store (one snapshot under
    ``RunStore.reading``); a chart's query that runs out of time leaves that chart empty."""
    now = store.now()
    workers, job_types = _workers_and_queues(store, heartbeat_seconds, limits)
    job_types = job_types + _idle_types(workers, job_types, limits, store.job_type_controls())
    schedules = schedule_views(store, now, next_count)
    try:
        per_minute: list[int] | None = store.succeeded_per_minute(THROUGHPUT_MINUTES)
    except PgtickError:
        per_minute = None
    try:
        per_type = store.finished_per_type_minute(THROUGHPUT_MINUTES)
    except PgtickError:
        per_type = None
    try:
        depth: dict[str, list[int]] | None = queue_depth_per_type(store, THROUGHPUT_MINUTES)
    except PgtickError:
        depth = None
    day = day_totals(store, [t.stats.job_type for t in job_types], now)
    return Overview(now, job_types, workers, schedules, per_minute, per_type, depth, day)
