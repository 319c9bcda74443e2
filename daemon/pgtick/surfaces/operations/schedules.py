"""The operator's verbs on schedules: list, pause, resume, trigger, the next occurrences and
backfill. What is computed is what the ticker computes: its parsed crons and its jitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from itertools import islice

from pgtick import config as config_mod
from pgtick.config import Config
from pgtick.core import ticker
from pgtick.errors import ConfigError, NotFoundError, PgtickError, ScheduleError, UsageError
from pgtick.scheduling.cron import Cron
from pgtick.storage.store import RunStore, ScheduleListing
from pgtick.surfaces.operations.audit import Actor, record
from pgtick.surfaces.operations.setup import open_store

# `schedules next --count` and `schedules backfill` refuse more occurrences than this: a typo in
# a range ("2016" for "2026") should not enqueue ten years of runs.
MAX_OCCURRENCES = 10_000
# schedules.paused_reason of a schedule the daemon paused because it vanished from its config,
# and of one it paused because it cannot compute it (the reason is in paused_detail).
PAUSED_REASON_REMOVED = "removed"
PAUSED_REASON_INVALID = "invalid"


@dataclass(frozen=True)
class ScheduleView:
    """A schedule with its next occurrences (none when paused or not computable)."""

    listing: ScheduleListing
    upcoming: list[datetime]
    zone: str
    error: str | None  # why the occurrences could not be computed


def schedule_views(store: RunStore, now: datetime, count: int) -> list[ScheduleView]:
    """Every schedule with its latest runs and next ``count`` occurrences after ``now``."""
    views = []
    for listing in store.list_schedules():
        upcoming: list[datetime] = []
        error = None
        try:
            cron = Cron.parse(listing.cron, listing.timezone, listing.name)
            if not listing.paused:
                upcoming = cron.next_n(now, count)
        except ScheduleError as exc:
            error = str(exc)
        views.append(ScheduleView(listing, upcoming, listing.timezone, error))
    return views


def pause_schedule(store: RunStore, name: str, *, actor: Actor | None = None) -> None:
    """Pause a schedule (the operator's reason); NotFoundError when there is none."""
    if not store.pause_schedule(name):
        raise _not_found(name)
    record(store, actor, "schedule_pause", name)


def resume_schedule(store: RunStore, name: str, *, actor: Actor | None = None) -> None:
    """Resume a schedule from now; NotFoundError when there is none."""
    if not store.resume_schedule(name):
        raise _not_found(name)
    record(store, actor, "schedule_resume", name)


def trigger_schedule(store: RunStore, name: str, *, actor: Actor | None = None) -> int:
    """Enqueue a run of the schedule now; its id. NotFoundError when there is none; PgtickError
    when its overlap is "skip" and a run of it is active."""
    run_id = store.trigger_schedule(name)
    if run_id is None:
        raise _not_found(name)
    if isinstance(run_id, tuple):
        active, status = run_id
        raise PgtickError(
            f'schedule {name!r} has run {active} {status} and its overlap is "skip": not '
            "triggered (`pgtick enqueue` adds a run whatever the overlap)"
        )
    record(store, actor, "trigger", name, run_ids=[run_id])
    return run_id


def _not_found(name: str) -> NotFoundError:
    return NotFoundError(f"schedule {name!r} not found")


def _iso(value: datetime, *, whole_seconds: bool = False) -> str:
    utc = value.astimezone(UTC)
    return (utc.replace(microsecond=0) if whole_seconds else utc).isoformat()


def _cron(name: str, expr: str, timezone: str) -> Cron:
    """The ticker's own parsed cron, so that what is shown is what gets materialized."""
    try:
        return ticker.cron_for(expr, timezone, name)
    except ScheduleError as exc:
        raise ScheduleError(f"schedule {name!r}: {exc}") from None


# -- listing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleLine:
    """A schedule of the listing with its next occurrence (None when paused, or when a newer
    pgtick stored an expression this one refuses: the listing still shows it)."""

    listing: ScheduleListing
    next_at: datetime | None
    db_now: datetime  # the database clock when listed: a table shows times next to it


def _next_at(listing: ScheduleListing, now: datetime) -> datetime | None:
    if listing.paused:
        return None
    try:
        return ticker.cron_for(listing.cron, listing.timezone, listing.name).next_after(now)
    except ScheduleError:
        return None


def list_schedules(store: RunStore) -> list[ScheduleLine]:
    """Every schedule with its latest run and its next occurrence after the database's now."""
    listings = store.list_schedules()
    now = store.now()
    return [ScheduleLine(listing, _next_at(listing, now), now) for listing in listings]


# -- next occurrences ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upcoming:
    """A schedule's next occurrences, each with the delay its jitter adds to the run."""

    zone: tzinfo
    occurrences: list[tuple[datetime, float]]  # (occurrence, run_at - occurrence in seconds)


def _schedule_for_next(cfg: Config, name: str, dsn_override: str | None) -> tuple[Cron, float]:
    """The cron and jitter of the schedule to show: from the config file when it is declared
    there, with no database at all (the config is the source of truth for its schedules); else
    from the database."""
    declared = cfg.schedules.get(name)
    if declared is not None:
        return _cron(declared.name, declared.cron, declared.timezone), declared.jitter_seconds
    try:
        dsn = config_mod.resolve_dsn(cfg.database, dsn_override)
    except ConfigError as exc:
        where = cfg.path or "the config file"
        raise ConfigError(
            f"schedule {name!r} is not declared in {where}; to look it up in the database: {exc}"
        ) from None
    with open_store(dsn, cfg.database.schema) as store:
        row = store.get_schedule(name)
    if row is None:
        where = f" ({cfg.path})" if cfg.path else ""
        raise NotFoundError(
            f"schedule {name!r} not found in the config file{where} or the database"
        )
    jitter = float(row["jitter_seconds"] or 0.0)
    return _cron(name, str(row["cron"]), str(row["timezone"])), jitter


def upcoming(
    cfg: Config,
    name: str,
    start: datetime,
    count: int,
    *,
    dsn_override: str | None = None,
) -> Upcoming:
    """The next ``count`` occurrences after ``start`` of a schedule from the config file, or,
    when the file does not declare it, from the database (the DSN is resolved only then)."""
    if count > MAX_OCCURRENCES:
        raise UsageError(f"--count: at most {MAX_OCCURRENCES}, got {count}")
    cron, jitter = _schedule_for_next(cfg, name, dsn_override)
    return Upcoming(
        cron.zone,
        [
            (at, (ticker.with_jitter(cron, name, jitter, at).run_at - at).total_seconds())
            for at in cron.next_n(start, count)
        ],
    )


# -- backfill --------------------------------------------------------------------------------------


def backfill_window(start: datetime, end: datetime, start_text: str) -> tuple[datetime, datetime]:
    """The range as ``Cron.occurrences`` takes it, (after, until], from an inclusive
    [start, end]; checked before any database is asked."""
    if start >= end:
        raise UsageError(f"--from must be before --to (got --from {_iso(start)}, --to {_iso(end)})")
    try:
        return start - ticker.EPSILON, end  # occurrences are whole seconds
    except OverflowError:
        raise UsageError(f"--from: too early: {start_text!r}") from None


@dataclass(frozen=True)
class Backfilled:
    created: int
    existing: int  # occurrences that already had a run
    overlap: str  # the schedule's: "skip" does not hold backfilled runs back
    job_type: str


def backfill(
    store: RunStore, name: str, after: datetime, end: datetime, *, actor: Actor | None = None
) -> Backfilled:
    """Create runs for the schedule's past occurrences in (after, end] that have none."""
    row = store.get_schedule(name)
    if row is None:
        raise _not_found(name)
    now = store.now()
    if end > now:
        raise UsageError(
            f"--to: {_iso(end)} is after the database's now ({_iso(now, whole_seconds=True)})"
            "; backfill creates past occurrences, the ticker creates the rest"
        )
    cron = _cron(name, str(row["cron"]), str(row["timezone"]))
    occurrences = list(islice(cron.occurrences(after, end), MAX_OCCURRENCES + 1))
    if len(occurrences) > MAX_OCCURRENCES:
        raise UsageError(
            f"--from/--to: more than {MAX_OCCURRENCES} occurrences of {name} in that "
            "range; backfill it in parts"
        )
    created = store.backfill_schedule(name, occurrences) if occurrences else []
    args = {"from": after.isoformat(), "to": end.isoformat()}
    record(store, actor, "backfill", name, args, run_ids=created)
    return Backfilled(
        len(created), len(occurrences) - len(created), str(row["overlap"]), str(row["job_type"])
    )
