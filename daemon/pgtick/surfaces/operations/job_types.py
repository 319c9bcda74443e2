"""One job type as the console's page shows it: its queue counts (the same read model as
``status``), the runs it is running and those waiting, its schedules, and its last 7 days
from the rollups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgtick import config as config_mod
from pgtick.config import values as config_values
from pgtick.errors import ConfigError, UsageError
from pgtick.storage.store import ClaimType, JobTypeStats, LimitChange, RunStore, RunSummary
from pgtick.surfaces.operations.controls import limits_in_force
from pgtick.surfaces.operations.rollup import TypeHistory, type_history
from pgtick.surfaces.operations.runs import list_runs
from pgtick.surfaces.operations.schedules import ScheduleView, schedule_views
from pgtick.surfaces.operations.status import JobTypeStatus, _workers_and_queues

# The job type page lists this many running and this many waiting runs (newest first); the
# runs page, filtered, has the rest.
JOB_TYPE_RUNS_SHOWN = 20
JOB_TYPE_UPCOMING = 3
WAITING_STATUSES = ("queued", "failed")
MAX_LIMIT = 2**31 - 1  # the limits are integer columns


@dataclass(frozen=True)
class JobTypeView:
    """A job type's page: ``status`` is its row of the overview (zeros when it has no queued,
    running or recently dead run), with the live daemons that handle it."""

    db_now: datetime
    status: JobTypeStatus
    running: list[RunSummary]
    waiting: list[RunSummary]
    schedules: list[ScheduleView]
    history: TypeHistory | None = None  # None: the rollups' read ran out of time


def check_job_type(name: str) -> str:
    """A job type name from a URL; UsageError for what no job type can be called."""
    try:
        return config_mod.job_type_name("job type", name)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def job_type_view(
    store: RunStore, job_type: str, *, heartbeat_seconds: float, limits: Sequence[ClaimType] = ()
) -> JobTypeView:
    """Everything the job type page shows, from one store (one snapshot under ``reading``)."""
    now = store.now()
    workers, types = _workers_and_queues(store, heartbeat_seconds, limits)
    found = next((t for t in types if t.stats.job_type == job_type), None)
    if found is None:  # no queued, running or recently dead run: zeros, and who handles it
        mine = next((t for t in limits if t.job_type == job_type), None)
        control = store.job_type_controls().get(job_type)
        served = sum(1 for w in workers if not w.stale and job_type in w.worker.job_types)
        idle = JobTypeStats(job_type, 0, None, 0, 0, 0, 0, 0)
        in_force = limits_in_force(job_type, mine, control)
        found = JobTypeStatus(idle, served, mine, None, in_force, control)
    running = list_runs(
        store, statuses=["running"], job_type=job_type, limit=JOB_TYPE_RUNS_SHOWN
    ).runs
    waiting = list_runs(
        store, statuses=list(WAITING_STATUSES), job_type=job_type, limit=JOB_TYPE_RUNS_SHOWN
    ).runs
    schedules = [
        v for v in schedule_views(store, now, JOB_TYPE_UPCOMING) if v.listing.job_type == job_type
    ]
    history = type_history(store, job_type, now)
    return JobTypeView(now, found, running, waiting, schedules, history)


def _limit(field: str, text: str | None) -> int | None:
    value = (text or "").strip()
    if not value:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise UsageError(f"{field}: a whole number from 1 to {MAX_LIMIT}, got {value[:20]!r}")
    return int(value)


def _rate(field: str, text: str | None) -> tuple[int, float] | None:
    value = (text or "").strip()
    if not value:
        return None
    try:
        return config_values.rate(field, value)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def limit_change(
    max_running: str | None,
    max_running_per_key: str | None,
    rate: str | None,
    rate_per_key: str | None,
) -> LimitChange:
    """The limits an operator typed (empty: leave that one as it is), as ``pgtick limits``
    takes them: whole numbers from 1, rates as ``N/second|minute|hour``; a UsageError naming
    the field otherwise."""
    return LimitChange(
        _limit("max_running", max_running),
        _limit("max_running_per_key", max_running_per_key),
        _rate("rate", rate),
        _rate("rate_per_key", rate_per_key),
    )
