"""The operator's verbs (runs, show, status, retry, cancel, prune) as plain functions over a
``RunStore``, returning dataclasses: the command line prints them, a web console can render
them. The state rules of retry and cancel live here, nowhere else. No printing, no parsing.

Times given as a ``timedelta`` are relative to the database clock (``--since 90m`` is 90
minutes before the database's now), so a client with a wrong clock still asks the right thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pgtick.errors import NotFoundError, UsageError
from pgtick.store import (
    STATUSES,
    Attempt,
    EffectKey,
    Run,
    RunQuery,
    RunStore,
    RunSummary,
    ScheduleRef,
)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 10_000

# A time argument: an instant, or a duration back from (or ahead of) the database's now.
When = datetime | timedelta


def check_statuses(statuses: Sequence[str], allowed: Sequence[str] = STATUSES) -> list[str]:
    """The given status names, refused with the valid ones listed when one is unknown."""
    for status in statuses:
        if status not in allowed:
            raise UsageError(
                f"--status: unknown status {status!r} (valid: {', '.join(allowed)})"
                if status not in STATUSES
                else f"--status: {status!r} is not allowed here (valid: {', '.join(allowed)})"
            )
    return list(dict.fromkeys(statuses))


def _ago(store: RunStore, when: When | None) -> datetime | None:
    """An instant from an argument where a duration means "that long ago"."""
    if when is None or isinstance(when, datetime):
        return when
    return store.now() - when


# -- runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPage:
    """One page of the listing; ``next_before`` is the next page's ``--before`` (None: last)."""

    runs: list[RunSummary]
    next_before: int | None


def list_runs(
    store: RunStore,
    *,
    statuses: Sequence[str] = (),
    job_type: str | None = None,
    schedule: str | None = None,
    since: When | None = None,
    before: int | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
) -> RunPage:
    """Runs newest first, one page below ``before``."""
    wanted = check_statuses(statuses)
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise UsageError(f"--limit: must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    if before is not None and before < 1:
        raise UsageError(f"--before: must be a run id (at least 1), got {before}")
    query = RunQuery(
        statuses=wanted or None,
        job_type=job_type,
        schedule=schedule,
        since=_ago(store, since),
        before=before,
        limit=limit + 1,
    )
    rows = store.list_runs(query)
    more = len(rows) > limit
    rows = rows[:limit]
    return RunPage(rows, rows[-1].id if more else None)


# -- show ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunDetail:
    """Everything known about one run: the row, each attempt, its schedule, its effects."""

    run: Run
    attempts: list[Attempt]
    schedule: ScheduleRef | None
    effects: list[EffectKey]
    db_now: datetime


def show_run(store: RunStore, run_id: int) -> RunDetail:
    """One run in full; NotFoundError when there is no such run."""
    if run_id < 1:
        raise UsageError(f"RUN_ID: not a run id: {run_id} (ids start at 1)")
    run = store.get_run(run_id)
    if run is None:
        raise NotFoundError(f"run {run_id} not found")
    schedule = None if run.schedule_id is None else store.schedule_of_run(run.schedule_id)
    return RunDetail(
        run, store.get_attempts(run_id), schedule, store.effect_keys(run_id), store.now()
    )
