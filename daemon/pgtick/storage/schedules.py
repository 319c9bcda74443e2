"""Schedules: the config's definitions synced in, the ticker's materialization (a transaction
that holds the due schedules), and the operator's listing, pause, resume, trigger, backfill.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from pgtick.storage import db, sqlfile
from pgtick.storage.base import StoreBase


@dataclass(frozen=True)
class ScheduleDef:
    """A schedule as declared in the config file."""

    name: str
    job_type: str
    payload: Mapping[str, Any]
    cron: str
    timezone: str
    max_attempts: int | None
    catchup: str
    catchup_limit: int
    overlap: str
    jitter_seconds: float
    priority: int = 0  # of its runs
    on_pause: str = "hold"  # while its job type is paused: hold | skip
    follow: Mapping[str, Any] | None = None  # its runs' chain (None: the job type's)
    after_on: Mapping[str, Any] | None = None  # the schedule its runs wait for (0027)


@dataclass(frozen=True)
class ScheduleRow:
    """A row of ``schedules`` as the ticker sees it (with the database clock's now)."""

    id: int
    name: str
    job_type: str
    payload: Any
    cron: str
    timezone: str
    max_attempts: int | None
    catchup: str
    catchup_limit: int
    overlap: str
    jitter_seconds: float
    materialized_until: datetime | None
    db_now: datetime
    priority: int = 0
    on_pause: str = "hold"
    follow: Any = None  # its runs' chain (migration 0025; None: the job type's)
    after_on: Any = None  # {"schedule", "deadline_seconds", "missed"} (migration 0027)


@dataclass(frozen=True)
class ScheduleListing:
    """A schedule with its latest run, for ``pgtick schedules``."""

    id: int
    name: str
    job_type: str
    cron: str
    timezone: str
    paused: bool
    paused_reason: str | None  # 'operator', 'removed' (gone from config) or 'invalid'
    paused_detail: str | None  # why an invalid schedule was refused, one line
    overlap: str
    catchup: str
    materialized_until: datetime | None
    last_status: str | None
    last_scheduled_for: datetime | None
    last_finished_at: datetime | None
    last_success_at: datetime | None
    service: str | None = "default"  # whose config owns it; None: the database (runtime)
    on_pause: str = "hold"


@dataclass(frozen=True)
class Occurrence:
    """One run to materialize: the cron instant and when it should run (jitter applied)."""

    scheduled_for: datetime
    run_at: datetime


@dataclass(frozen=True)
class ScheduleRef:
    """The schedule a run came from, as ``pgtick show`` names it."""

    id: int
    name: str
    job_type: str
    cron: str
    timezone: str
    paused: bool
    paused_reason: str | None


@dataclass(frozen=True)
class ScheduleState:
    """A schedule's definition and pause state (``pgtick status``)."""

    name: str
    job_type: str
    cron: str
    timezone: str
    jitter_seconds: float
    paused: bool
    paused_reason: str | None
    paused_detail: str | None


_DEFINITION_KEYS = (
    "job_type",
    "cron",
    "timezone",
    "payload",
    "catchup",
    "catchup_limit",
    "overlap",
    "on_pause",
    "jitter_seconds",
    "max_attempts",
    "priority",
    "follow",
    "after_on",
)


def _definition(d: ScheduleDef) -> dict[str, Any]:
    """A definition as the schedule functions' parameters."""
    return {
        "name": d.name,
        "job_type": d.job_type,
        "cron": d.cron,
        "timezone": d.timezone,
        "payload": Jsonb(dict(d.payload)),
        "catchup": d.catchup,
        "catchup_limit": d.catchup_limit,
        "overlap": d.overlap,
        "on_pause": d.on_pause,
        "jitter_seconds": d.jitter_seconds,
        "max_attempts": d.max_attempts,
        "priority": d.priority,
        "follow": _json_or_none(d.follow),
        "after_on": _json_or_none(d.after_on),
    }


def _json_or_none(value: Mapping[str, Any] | None) -> Jsonb | None:
    """A chain or an ``after`` as the schedule functions take it (None: none)."""
    return None if value is None else Jsonb(dict(value))


class ScheduleQueries(StoreBase):
    """The schedules aggregate (``schedules``, and the runs it materializes)."""

    def sync_schedules(
        self, defs: Sequence[ScheduleDef], job_types: Sequence[str], service: str = "default"
    ) -> tuple[list[str], list[str], dict[str, str | None]]:
        """Upsert the config's schedules that are ``service``'s (or new); pause the service's
        vanished ones of these job types.

        Returns (names created or changed, names paused, {name: owner} of the config's names
        another service or (None) the database owns, left as they are).
        """
        with self._conn("sync_schedules") as conn, conn.transaction():
            changed = []
            for d in defs:
                row = conn.execute(
                    sqlfile.query("sync_schedule", conn.schema),
                    {
                        "name": d.name,
                        "job_type": d.job_type,
                        "payload": Jsonb(dict(d.payload)),
                        "cron": d.cron,
                        "timezone": d.timezone,
                        "max_attempts": d.max_attempts,
                        "catchup": d.catchup,
                        "catchup_limit": d.catchup_limit,
                        "overlap": d.overlap,
                        "jitter_seconds": d.jitter_seconds,
                        "priority": d.priority,
                        "on_pause": d.on_pause,
                        "service": service,
                        "follow": None if d.follow is None else Jsonb(dict(d.follow)),
                        "after_on": None if d.after_on is None else Jsonb(dict(d.after_on)),
                    },
                ).fetchone()
                if row is not None:
                    changed.append(row[0])
            names = [d.name for d in defs]
            paused = conn.execute(
                sqlfile.query("pause_vanished_schedules", conn.schema),
                {"job_types": list(job_types), "names": names, "service": service},
            ).fetchall()
            elsewhere = conn.execute(
                sqlfile.query("sync_owned_elsewhere", conn.schema),
                {"names": names, "service": service},
            ).fetchall()
        return changed, sorted(r[0] for r in paused), {str(n): o for n, o in elsewhere}

    def create_schedule(self, d: ScheduleDef, actor: str, via: str) -> int:
        """A schedule owned by the database (no config sync touches it); its id."""
        params = _definition(d) | {"actor": actor, "via": via}
        return int(self._all("schedules", "create_schedule", params)[0][0])

    def update_schedule(self, name: str, changes: Mapping[str, Any], actor: str, via: str) -> bool:
        """Change a database-owned schedule's settings named in ``changes`` (the keys of
        ``ScheduleDef``); False: none such."""
        params = dict.fromkeys(_DEFINITION_KEYS) | {"name": name, "actor": actor, "via": via}
        for key, value in changes.items():
            if key in ("follow", "after_on"):
                # None clears it: JSON null (SQL NULL would leave it as it is)
                params[key] = Jsonb(None if value is None else dict(value))
            elif key == "payload":
                params[key] = Jsonb(dict(value))
            else:
                params[key] = value
        return bool(self._all("schedules", "update_schedule", params)[0][0])

    def remove_schedule(self, name: str, actor: str, via: str) -> bool:
        """Remove a database-owned schedule (paused as removed); False: none such."""
        params = {"name": name, "actor": actor, "via": via}
        return bool(self._all("schedules", "remove_schedule", params)[0][0])

    @contextlib.contextmanager
    def materializing(self) -> Iterator[tuple[db.Connection, list[ScheduleRow]]]:
        """A transaction holding the enabled schedules that are due (``next_due_at`` reached or
        unknown) and that no other daemon holds now; the others are not even read."""
        with self._conn("tick") as conn, conn.transaction():
            rows = conn.execute(sqlfile.query("lock_due_schedules", conn.schema)).fetchall()
            yield conn, [ScheduleRow(*row) for row in rows]

    @staticmethod
    def after_source_on(conn: db.Connection, name: str) -> tuple[str, str] | None:
        """(cron, timezone) of schedule ``name``, which another waits for; None: none."""
        with db.wrap_errors("tick"):
            row = conn.execute(
                sqlfile.query("after_source", conn.schema), {"name": name}
            ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    @staticmethod
    def settle_waiting_on(conn: db.Connection) -> int:
        """The tick's sweep of runs waiting for another schedule (deadlines, misses)."""
        with db.wrap_errors("tick"):
            row = conn.execute(sqlfile.query("settle_waiting", conn.schema)).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def next_schedule_due_on(conn: db.Connection) -> tuple[datetime | None, datetime]:
        """(earliest ``next_due_at`` of the schedules not due at the transaction's start, the
        database's now), inside ``materializing``'s transaction: when the ticker wakes next."""
        with db.wrap_errors("tick"):
            row = conn.execute(sqlfile.query("next_schedule_due", conn.schema)).fetchone()
        assert row is not None
        return row[0], row[1]

    @staticmethod
    def pause_invalid_on(conn: db.Connection, schedule: ScheduleRow, detail: str) -> None:
        """Pause a schedule the ticker cannot compute, with the reason (inside
        ``materializing``'s transaction, which holds the row)."""
        with db.wrap_errors("tick"):
            conn.execute(
                sqlfile.query("pause_invalid_schedule", conn.schema),
                {"id": schedule.id, "detail": detail},
            )

    @staticmethod
    def materialize_on(
        conn: db.Connection,
        schedule: ScheduleRow,
        occurrences: Sequence[Occurrence],
        until: datetime,
        next_due_at: datetime | None,
        waits: Sequence[Mapping[str, Any] | None] = (),
    ) -> dict[str, int]:
        """Insert occurrences, move the cursor to ``until`` and remember when the schedule next
        needs a tick (None: at every tick); returns {status: count}. ``waits``: per
        occurrence, what it waits for (``after``; migration 0027)."""
        with db.wrap_errors("materialize"):
            rows = conn.execute(
                sqlfile.query("materialize", conn.schema),
                {
                    "schedule_id": schedule.id,
                    "job_type": schedule.job_type,
                    "payload": Jsonb(schedule.payload),
                    "max_attempts": schedule.max_attempts,
                    "priority": schedule.priority,
                    "skip": schedule.overlap == "skip",
                    "skip_paused": schedule.on_pause == "skip",
                    "follow": None if schedule.follow is None else Jsonb(schedule.follow),
                    "name": schedule.name,
                    "waits": [None if w is None else Jsonb(dict(w)) for w in waits]
                    or [None] * len(occurrences),
                    "scheduled_for": [o.scheduled_for for o in occurrences],
                    "run_at": [o.run_at for o in occurrences],
                    "until": until,
                    "next_due_at": next_due_at,
                },
            ).fetchall()
            if any(status == "queued" for status, _ in rows):
                conn.execute(sqlfile.query("notify", conn.schema), {"job_type": schedule.job_type})
                # Due at the minute's start, maybe behind a claimer's lower bound by now.
                conn.execute(sqlfile.query("notify_rescan", conn.schema))
        return {status: int(n) for status, n in rows}

    def list_schedules(self) -> list[ScheduleListing]:
        return [ScheduleListing(*r) for r in self._all("schedules", "list_schedules", {})]

    def get_schedule(self, name: str) -> dict[str, Any] | None:
        """One schedule's definition and state, or None."""
        with self._conn("schedules") as conn:
            cur = conn.execute(sqlfile.query("get_schedule", conn.schema), {"name": name})
            row = cur.fetchone()
            if row is None:
                return None
            columns = [c.name for c in cur.description or []]
        return dict(zip(columns, row, strict=True))

    def pause_schedule(self, name: str) -> bool:
        return bool(self._all("pause_schedule", "pause_schedule", {"name": name}))

    def resume_schedule(self, name: str) -> bool:
        return bool(self._all("resume_schedule", "resume_schedule", {"name": name}))

    def trigger_schedule(self, name: str) -> int | tuple[int, str] | None:
        """Enqueue a run of the schedule now; its id, or None if there is no such schedule,
        or (run id, status) of the run that is active when its overlap is "skip" (nothing
        enqueued: a skip schedule never has two runs active at once)."""
        with self._conn("trigger") as conn, conn.transaction():
            conn.execute(sqlfile.query("lock_schedule", conn.schema), {"name": name})
            active = conn.execute(
                sqlfile.query("schedule_active_run", conn.schema), {"name": name}
            ).fetchone()
            if active is not None:
                return int(active[0]), str(active[1])
            row = conn.execute(
                sqlfile.query("trigger_schedule", conn.schema), {"name": name}
            ).fetchone()
            if row is None:
                return None
            conn.execute(sqlfile.query("notify", conn.schema), {"job_type": row[1]})
        return int(row[0])

    def backfill_schedule(self, name: str, occurrences: Sequence[datetime]) -> list[int]:
        """Create runs for past occurrences that have none; returns the new ids."""
        with self._conn("backfill") as conn, conn.transaction():
            conn.execute(sqlfile.query("lock_schedule", conn.schema), {"name": name})
            rows = conn.execute(
                sqlfile.query("backfill_schedule", conn.schema),
                {"name": name, "occurrences": list(occurrences)},
            ).fetchall()
            if rows:
                conn.execute(sqlfile.query("notify", conn.schema), {"job_type": rows[0][1]})
                conn.execute(sqlfile.query("notify_rescan", conn.schema))  # due in the past
        return [int(r[0]) for r in rows]

    def schedule_of_run(self, schedule_id: int) -> ScheduleRef | None:
        rows = self._all("show", "schedule_of_run", {"id": schedule_id})
        return ScheduleRef(*rows[0]) if rows else None

    def schedule_states(self) -> list[ScheduleState]:
        return [ScheduleState(*row) for row in self._all("status", "status_schedules", {})]
