"""RunStore: one typed method per named query in ``sql/queries.sql``; the only caller of it.

Methods take and return plain values and frozen dataclasses; psycopg errors leave as
``DatabaseError`` (via ``db.wrap_errors``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg_pool
from psycopg.types.json import Jsonb

from pgtick.storage import db, sqlfile

TERMINAL_STATUSES = ("succeeded", "dead", "cancelled", "skipped")
ACTIVE_STATUSES = ("queued", "running", "failed")
STATUSES = ("queued", "running", "succeeded", "failed", "dead", "cancelled", "skipped")
PRUNE_BATCH_ROWS = 1000
REAP_BATCH_ROWS = 500


@dataclass(frozen=True)
class NewRun:
    """A run to enqueue."""

    job_type: str
    payload: Mapping[str, Any] | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None


@dataclass(frozen=True)
class ClaimType:
    """What a claimer tells the database about a job type it handles."""

    job_type: str
    lease_seconds: float
    max_attempts: int


@dataclass(frozen=True)
class ClaimedRun:
    """A run this worker now holds."""

    id: int
    job_type: str
    payload: Any
    attempt: int
    max_attempts: int
    scheduled_for: datetime | None
    idempotency_key: str | None
    run_at: datetime
    schedule_id: int | None
    started_at: datetime
    locked_until: datetime


@dataclass(frozen=True)
class Failure:
    """One failed attempt to record; ``retry_in_seconds`` None means give up (dead)."""

    run_id: int
    error: str
    error_type: str
    detail: str
    retry_in_seconds: float | None


@dataclass(frozen=True)
class FailResult:
    id: int
    status: str
    run_at: datetime


@dataclass(frozen=True)
class Beat:
    """What one heartbeat found."""

    held: set[int]  # leases extended
    registered: bool  # the workers row still exists
    cancelled: set[int]  # given runs an operator cancelled


@dataclass(frozen=True)
class ReapedRun:
    id: int
    status: str
    job_type: str


@dataclass(frozen=True)
class Run:
    """A row of ``runs``."""

    id: int
    schedule_id: int | None
    scheduled_for: datetime | None
    job_type: str
    payload: Any
    idempotency_key: str | None
    status: str
    run_at: datetime
    attempts: int
    max_attempts: int | None
    locked_by: str | None
    locked_until: datetime | None
    last_error: str | None
    error_type: str | None
    started_at: datetime | None
    finished_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Attempt:
    """A row of ``attempts``."""

    run_id: int
    attempt: int
    worker_id: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None
    error_type: str | None


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    version: str
    threads: int
    job_types: Sequence[str]


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


@dataclass(frozen=True)
class Occurrence:
    """One run to materialize: the cron instant and when it should run (jitter applied)."""

    scheduled_for: datetime
    run_at: datetime


@dataclass(frozen=True)
class JobTypeStats:
    """One job type's live queue, exact and on the database clock (shared read model)."""

    job_type: str
    due: int  # queued/failed with run_at <= now(), not claimed
    oldest_due_seconds: float | None
    scheduled: int  # queued with run_at > now()
    running: int
    stuck: int  # running with locked_until < now()
    awaiting_retry: int  # failed with run_at > now()
    dead_recent: int  # dead with finished_at > now() - 24 h


@dataclass(frozen=True)
class QueueCounts:
    """One job type's non-terminal runs, counted exactly (metrics)."""

    job_type: str
    queued: int
    running: int
    failed: int
    due: int
    oldest_due_seconds: float | None
    stuck: int


@dataclass(frozen=True)
class ScheduleHealth:
    """A configured schedule as the metrics see it; times are Unix seconds."""

    name: str
    paused: bool
    last_success_at: float | None
    due_started: bool | None  # None: no occurrence asked about


@dataclass(frozen=True)
class MetricsSnapshot:
    """The result of the one aggregate query behind the database-derived metrics."""

    db_now: float
    queues: list[QueueCounts]
    terminal: dict[tuple[str, str], int]
    terminal_counted_at: float | None
    schedules: list[ScheduleHealth]


@dataclass(frozen=True)
class RunSummary:
    """One line of the operator's run listing; ``db_now`` is the database clock at the read."""

    id: int
    job_type: str
    status: str
    attempts: int
    max_attempts: int | None
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    schedule: str | None
    db_now: datetime


@dataclass(frozen=True)
class RunQuery:
    """Filters of the run listing; None means no filter. ``limit`` is the page size."""

    statuses: Sequence[str] | None = None
    job_type: str | None = None
    schedule: str | None = None
    since: datetime | None = None
    before: int | None = None
    limit: int = 50


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
class EffectKey:
    """A side effect a run recorded (``effects``)."""

    key: str
    created_at: datetime


@dataclass(frozen=True)
class WorkerRow:
    """A registered daemon as ``pgtick status`` shows it."""

    id: str
    hostname: str
    pid: int
    version: str
    threads: int
    job_types: list[str]
    started_at: datetime
    heartbeat_age_seconds: float
    busy: int


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


Pool = psycopg_pool.ConnectionPool[db.Connection]


class Notifications:
    """A dedicated LISTEN connection (outside the pool): the job types named by NOTIFYs."""

    def __init__(self, conn: db.Connection) -> None:
        self._conn = conn

    def next(self, timeout: float) -> list[str]:
        """The payload of the next NOTIFY, waiting up to ``timeout`` seconds ([] if none)."""
        with db.wrap_errors("listen"):
            return [n.payload for n in self._conn.notifies(timeout=timeout, stop_after=1)]


@contextlib.contextmanager
def listening(dsn: str, schema: str) -> Iterator[Notifications]:
    """Open a LISTEN connection on the schema's channel; errors are DatabaseError."""
    with db.wrap_errors("listen"):
        conn = db.connect_raw(dsn, application_name="pgtick-listener")
    try:
        with db.wrap_errors("listen"):
            conn.execute(sqlfile.with_schema("listen", schema))
        yield Notifications(conn)
    finally:
        with contextlib.suppress(Exception):  # the connection may be broken already
            conn.close()


def enqueue_on(
    conn: db.Connection,
    schema: str,
    run: NewRun,
) -> int:
    """Enqueue through ``<schema>.enqueue()`` on the caller's connection and transaction."""
    with db.wrap_errors("enqueue"):
        row = conn.execute(
            sqlfile.with_schema("enqueue_qualified", schema), _enqueue_params(run)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _enqueue_params(run: NewRun) -> dict[str, Any]:
    return {
        "job_type": run.job_type,
        "payload": Jsonb(dict(run.payload) if run.payload is not None else {}),
        "run_at": run.run_at,
        "idempotency_key": run.idempotency_key,
        "max_attempts": run.max_attempts,
    }


class RunStore:
    """Typed access to the pgtick schema through a connection pool."""

    def __init__(self, pool: Pool, pinned: db.Connection | None = None) -> None:
        self.pool = pool
        self._pinned = pinned

    @contextlib.contextmanager
    def pinned(self, operation: str) -> Iterator[RunStore]:
        """A store bound to one pooled connection, for a hot loop.

        The pool checks a connection when it is handed out; a loop that keeps one saves that
        round trip on every statement. After a DatabaseError the loop leaves this block, the
        pool drops the broken connection, and the loop pins a fresh one.
        """
        with db.wrap_errors(operation), self.pool.connection() as conn:
            yield RunStore(self.pool, conn)

    @contextlib.contextmanager
    def _conn(self, operation: str) -> Iterator[db.Connection]:
        if self._pinned is not None:
            with db.wrap_errors(operation):
                yield self._pinned
            return
        with db.wrap_errors(operation), self.pool.connection() as conn:
            yield conn

    def _all(self, operation: str, query: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with self._conn(operation) as conn:
            return conn.execute(sqlfile.query(query), params).fetchall()

    # -- clock -----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The database clock."""
        value: datetime = self._all("now", "db_now", {})[0][0]
        return value

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self, run: NewRun) -> int:
        """Add one run (or return the existing one for its idempotency key)."""
        rows = self._all("enqueue", "enqueue", _enqueue_params(run))
        return int(rows[0][0])

    def enqueue_many(self, runs: Sequence[NewRun]) -> list[int]:
        """Add many runs in one statement; ids in input order, existing ids for taken keys."""
        if not runs:
            return []
        # The same key twice in one batch is one run: send it once.
        first_by_key: dict[str, int] = {}
        unique: list[NewRun] = []
        slot: list[int] = []
        for run in runs:
            key = run.idempotency_key
            if key is not None and key in first_by_key:
                slot.append(first_by_key[key])
                continue
            if key is not None:
                first_by_key[key] = len(unique)
            slot.append(len(unique))
            unique.append(run)
        params = {
            "job_types": [r.job_type for r in unique],
            "payloads": [Jsonb(dict(r.payload) if r.payload is not None else {}) for r in unique],
            "run_ats": [r.run_at for r in unique],
            "keys": [r.idempotency_key for r in unique],
            "max_attempts": [r.max_attempts for r in unique],
        }
        with self._conn("enqueue") as conn, conn.transaction():
            rows = conn.execute(sqlfile.query("enqueue_many"), params).fetchall()
            ids: list[int | None] = [inserted or existing for _, inserted, existing in rows]
            missing = [unique[i].idempotency_key for i, v in enumerate(ids) if v is None]
            if missing:
                found = dict(
                    conn.execute(sqlfile.query("run_ids_by_keys"), {"keys": missing}).fetchall()
                )
                ids = [
                    v if v is not None else found[unique[i].idempotency_key]
                    for i, v in enumerate(ids)
                ]
            for job_type in sorted({r.job_type for r in unique}):
                conn.execute(sqlfile.query("notify"), {"job_type": job_type})
        return [int(ids[i]) for i in slot]  # type: ignore[arg-type]

    # -- claiming and finishing -----------------------------------------------------------

    def claim(self, worker_id: str, types: Sequence[ClaimType], limit: int) -> list[ClaimedRun]:
        """Claim up to ``limit`` due runs of the given types in one statement."""
        if limit <= 0 or not types:
            return []
        params = {
            "worker_id": worker_id,
            "job_types": [t.job_type for t in types],
            "leases": [t.lease_seconds for t in types],
            "max_attempts": [t.max_attempts for t in types],
            "limit": limit,
        }
        return [ClaimedRun(*row) for row in self._all("claim", "claim", params)]

    def next_due_in(self, job_types: Sequence[str]) -> float | None:
        """Seconds until the earliest runnable run of these types is due (None: none)."""
        rows = self._all("next_due", "next_due", {"job_types": list(job_types)})
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def heartbeat(self, worker_id: str, leases: Mapping[int, float]) -> Beat:
        """Extend the given leases; says which are still held (the others are gone), which of
        the gone ones an operator cancelled, and whether this worker's row still exists."""
        params = {
            "worker_id": worker_id,
            "ids": list(leases),
            "leases": list(leases.values()),
        }
        [(held, registered, cancelled)] = self._all("heartbeat", "heartbeat", params)
        return Beat(set(held), bool(registered), set(cancelled))

    def succeed(self, worker_id: str, run_ids: Sequence[int]) -> set[int]:
        """Mark runs succeeded if this worker still holds them; returns those it did."""
        with self._conn("succeed") as conn:
            return self.succeed_on(conn, worker_id, run_ids)

    @staticmethod
    def succeed_on(conn: db.Connection, worker_id: str, run_ids: Sequence[int]) -> set[int]:
        """``succeed`` on a given connection (inside a handler's transaction)."""
        with db.wrap_errors("succeed"):
            rows = conn.execute(
                sqlfile.query("succeed"), {"worker_id": worker_id, "ids": list(run_ids)}
            ).fetchall()
        return {row[0] for row in rows}

    def fail(self, worker_id: str, failures: Sequence[Failure]) -> list[FailResult]:
        """Record failed attempts: ``failed`` with a retry time, or ``dead``."""
        if not failures:
            return []
        with self._conn("fail") as conn:
            return self._fail_on(conn, worker_id, failures)

    def finish(
        self, worker_id: str, succeeded: Sequence[int], failures: Sequence[Failure]
    ) -> tuple[set[int], list[FailResult]]:
        """Write a batch of results all or nothing, so a failure part-way leaves nothing
        written and the batch can be retried as it is: one statement when the batch holds
        one kind (atomic by itself, no BEGIN/COMMIT round trips), else one transaction.
        Returns what the lease guard let through: the succeeded ids and the failures."""
        with self._conn("complete") as conn:
            if succeeded and failures:
                with conn.transaction():
                    done = self.succeed_on(conn, worker_id, succeeded)
                    return done, self._fail_on(conn, worker_id, failures)
            if failures:
                return set(), self._fail_on(conn, worker_id, failures)
            return self.succeed_on(conn, worker_id, succeeded), []

    @staticmethod
    def _fail_on(
        conn: db.Connection, worker_id: str, failures: Sequence[Failure]
    ) -> list[FailResult]:
        params = {
            "worker_id": worker_id,
            "ids": [f.run_id for f in failures],
            "errors": [f.error for f in failures],
            "error_types": [f.error_type for f in failures],
            "details": [f.detail for f in failures],
            "delays": [f.retry_in_seconds for f in failures],
        }
        with db.wrap_errors("fail"):
            return [FailResult(*row) for row in conn.execute(sqlfile.query("fail"), params)]

    def release(self, worker_id: str, run_ids: Sequence[int]) -> set[int]:
        """Give held runs back (queued, attempt not counted); returns those released."""
        if not run_ids:
            return set()
        rows = self._all("release", "release", {"worker_id": worker_id, "ids": list(run_ids)})
        return {row[0] for row in rows}

    def reap(
        self,
        delay_for: Callable[[str, int], float],
        limit: int = REAP_BATCH_ROWS,
    ) -> list[ReapedRun]:
        """Fail or kill runs whose lease expired, in one short transaction; wakes idle daemons
        for the runs that are claimable again."""
        with self._conn("reap") as conn, conn.transaction():
            rows = conn.execute(sqlfile.query("reap_select"), {"limit": limit}).fetchall()
            if not rows:
                return []
            ids = [row[0] for row in rows]
            delays = [
                None if attempts >= (max_attempts or 1) else delay_for(job_type, attempts)
                for _, job_type, attempts, max_attempts, _ in rows
            ]
            done = [
                ReapedRun(*row)
                for row in conn.execute(
                    sqlfile.query("reap_mark"), {"ids": ids, "delays": delays}
                ).fetchall()
            ]
            # A first lost attempt is claimable at once: wake idle daemons now rather than
            # at their next poll, so recovery takes lease + reaper interval, not + a poll.
            for job_type in sorted({r.job_type for r in done if r.status == "failed"}):
                conn.execute(sqlfile.query("notify"), {"job_type": job_type})
        return done

    # -- operator actions -----------------------------------------------------------------

    def retry(self, run_ids: Sequence[int]) -> list[int]:
        """failed/dead/cancelled -> queued now; returns the ids that changed."""
        with self._conn("retry") as conn, conn.transaction():
            rows = conn.execute(sqlfile.query("retry"), {"ids": list(run_ids)}).fetchall()
            for job_type in sorted({row[1] for row in rows}):
                conn.execute(sqlfile.query("notify"), {"job_type": job_type})
        return sorted(row[0] for row in rows)

    def cancel(self, run_ids: Sequence[int]) -> list[int]:
        """Non-terminal -> cancelled; returns the ids that changed."""
        return sorted(row[0] for row in self._all("cancel", "cancel", {"ids": list(run_ids)}))

    def prune(self, status: str, older_than_seconds: float, batch: int = PRUNE_BATCH_ROWS) -> int:
        """Delete terminal runs of ``status`` finished longer ago than given, in batches."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"only terminal runs are pruned, not {status!r}")
        total = 0
        while True:
            with self._conn("prune") as conn:
                cur = conn.execute(
                    sqlfile.query("prune"),
                    {"status": status, "older_than": older_than_seconds, "batch": batch},
                )
                deleted = cur.rowcount
            total += deleted
            if deleted < batch:
                return total

    def count_prunable(self, status: str, older_than_seconds: float) -> int:
        """How many runs ``prune`` would delete now."""
        params = {"status": status, "older_than": older_than_seconds}
        return int(self._all("prune", "count_prunable", params)[0][0])

    # -- reading ----------------------------------------------------------------------------

    def get_run(self, run_id: int) -> Run | None:
        rows = self._all("get_run", "get_run", {"id": run_id})
        return Run(*rows[0]) if rows else None

    def get_attempts(self, run_id: int) -> list[Attempt]:
        return [Attempt(*row) for row in self._all("get_attempts", "get_attempts", {"id": run_id})]

    def schedule_of_run(self, schedule_id: int) -> ScheduleRef | None:
        rows = self._all("show", "schedule_of_run", {"id": schedule_id})
        return ScheduleRef(*rows[0]) if rows else None

    def effect_keys(self, run_id: int) -> list[EffectKey]:
        return [EffectKey(*row) for row in self._all("show", "effect_keys", {"run_id": run_id})]

    def run_statuses(self, run_ids: Sequence[int]) -> dict[int, str]:
        """The status of each run that exists among ``run_ids``."""
        rows = self._all("run_statuses", "run_statuses", {"ids": list(run_ids)})
        return {int(i): str(status) for i, status in rows}

    def count_bulk(self, status: str, job_type: str, since: datetime | None) -> int:
        params = {"status": status, "job_type": job_type, "since": since}
        return int(self._all("count_bulk", "count_bulk", params)[0][0])

    def bulk_ids(
        self, status: str, job_type: str, since: datetime | None, after: int, batch: int
    ) -> list[int]:
        """The next ``batch`` ids of count_bulk's runs above ``after``."""
        params = {
            "status": status,
            "job_type": job_type,
            "since": since,
            "after": after,
            "batch": batch,
        }
        return [int(r[0]) for r in self._all("bulk_ids", "bulk_ids", params)]

    def list_workers(self) -> list[WorkerRow]:
        return [WorkerRow(*row) for row in self._all("status", "list_workers", {})]

    def schedule_states(self) -> list[ScheduleState]:
        return [ScheduleState(*row) for row in self._all("status", "status_schedules", {})]

    def list_runs(self, q: RunQuery) -> list[RunSummary]:
        """Up to ``q.limit`` runs, newest first, below ``q.before`` (keyset pagination)."""
        statuses = None if q.statuses is None else list(q.statuses)
        terminal_only = statuses is not None and all(s in TERMINAL_STATUSES for s in statuses)
        params = {
            "statuses": statuses,
            "job_type": q.job_type,
            "schedule": q.schedule,
            "since": q.since,
            "before": q.before,
            "limit": q.limit,
        }
        name = "list_finished_runs" if terminal_only else "list_runs"
        return [RunSummary(*row) for row in self._all("list_runs", name, params)]

    # -- workers and effects ----------------------------------------------------------------

    def register_worker(self, info: WorkerInfo) -> None:
        with self._conn("register_worker") as conn:
            conn.execute(
                sqlfile.query("register_worker"),
                {
                    "id": info.id,
                    "hostname": info.hostname,
                    "pid": info.pid,
                    "version": info.version,
                    "threads": info.threads,
                    "job_types": list(info.job_types),
                },
            )

    def deregister_worker(self, worker_id: str) -> None:
        with self._conn("deregister_worker") as conn:
            conn.execute(sqlfile.query("deregister_worker"), {"id": worker_id})

    def reap_workers(self, older_than_seconds: float) -> list[str]:
        rows = self._all("reap_workers", "reap_workers", {"older_than": older_than_seconds})
        return [row[0] for row in rows]

    @staticmethod
    def effect_once_on(conn: db.Connection, key: str, run_id: int | None) -> bool:
        """True only the first time ``key`` is recorded (on the given connection)."""
        with db.wrap_errors("effect_once"):
            row = conn.execute(
                sqlfile.query("effect_once"), {"key": key, "run_id": run_id}
            ).fetchone()
        return row is not None

    def effect_once(self, key: str, run_id: int | None) -> bool:
        with self._conn("effect_once") as conn:
            return self.effect_once_on(conn, key, run_id)

    # -- schedules ---------------------------------------------------------------------------

    def sync_schedules(
        self, defs: Sequence[ScheduleDef], job_types: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """Upsert the config's schedules; pause vanished ones of these job types.

        Returns (names created or changed, names paused).
        """
        with self._conn("sync_schedules") as conn, conn.transaction():
            changed = []
            for d in defs:
                row = conn.execute(
                    sqlfile.query("sync_schedule"),
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
                    },
                ).fetchone()
                if row is not None:
                    changed.append(row[0])
            paused = conn.execute(
                sqlfile.query("pause_vanished_schedules"),
                {"job_types": list(job_types), "names": [d.name for d in defs]},
            ).fetchall()
        return changed, sorted(r[0] for r in paused)

    @contextlib.contextmanager
    def materializing(self) -> Iterator[tuple[db.Connection, list[ScheduleRow]]]:
        """A transaction holding the enabled schedules that are due (``next_due_at`` reached or
        unknown) and that no other daemon holds now; the others are not even read."""
        with self._conn("tick") as conn, conn.transaction():
            rows = conn.execute(sqlfile.query("lock_due_schedules")).fetchall()
            yield conn, [ScheduleRow(*row) for row in rows]

    @staticmethod
    def next_schedule_due_on(conn: db.Connection) -> tuple[datetime | None, datetime]:
        """(earliest ``next_due_at`` of the schedules not due at the transaction's start, the
        database's now), inside ``materializing``'s transaction: when the ticker wakes next."""
        with db.wrap_errors("tick"):
            row = conn.execute(sqlfile.query("next_schedule_due")).fetchone()
        assert row is not None
        return row[0], row[1]

    @staticmethod
    def pause_invalid_on(conn: db.Connection, schedule: ScheduleRow, detail: str) -> None:
        """Pause a schedule the ticker cannot compute, with the reason (inside
        ``materializing``'s transaction, which holds the row)."""
        with db.wrap_errors("tick"):
            conn.execute(
                sqlfile.query("pause_invalid_schedule"), {"id": schedule.id, "detail": detail}
            )

    @staticmethod
    def materialize_on(
        conn: db.Connection,
        schedule: ScheduleRow,
        occurrences: Sequence[Occurrence],
        until: datetime,
        next_due_at: datetime | None,
    ) -> dict[str, int]:
        """Insert occurrences, move the cursor to ``until`` and remember when the schedule next
        needs a tick (None: at every tick); returns {status: count}."""
        with db.wrap_errors("materialize"):
            rows = conn.execute(
                sqlfile.query("materialize"),
                {
                    "schedule_id": schedule.id,
                    "job_type": schedule.job_type,
                    "payload": Jsonb(schedule.payload),
                    "max_attempts": schedule.max_attempts,
                    "skip": schedule.overlap == "skip",
                    "scheduled_for": [o.scheduled_for for o in occurrences],
                    "run_at": [o.run_at for o in occurrences],
                    "until": until,
                    "next_due_at": next_due_at,
                },
            ).fetchall()
            if any(status == "queued" for status, _ in rows):
                conn.execute(sqlfile.query("notify"), {"job_type": schedule.job_type})
        return {status: int(n) for status, n in rows}

    def list_schedules(self) -> list[ScheduleListing]:
        return [ScheduleListing(*r) for r in self._all("schedules", "list_schedules", {})]

    def get_schedule(self, name: str) -> dict[str, Any] | None:
        """One schedule's definition and state, or None."""
        with self._conn("schedules") as conn:
            cur = conn.execute(sqlfile.query("get_schedule"), {"name": name})
            row = cur.fetchone()
            if row is None:
                return None
            columns = [c.name for c in cur.description or []]
        return dict(zip(columns, row, strict=True))

    def pause_schedule(self, name: str) -> bool:
        return bool(self._all("pause_schedule", "pause_schedule", {"name": name}))

    def resume_schedule(self, name: str) -> bool:
        return bool(self._all("resume_schedule", "resume_schedule", {"name": name}))

    def trigger_schedule(self, name: str) -> int | None:
        """Enqueue a run of the schedule now; its id, or None if there is no such schedule."""
        with self._conn("trigger") as conn, conn.transaction():
            row = conn.execute(sqlfile.query("trigger_schedule"), {"name": name}).fetchone()
            if row is None:
                return None
            conn.execute(sqlfile.query("notify"), {"job_type": row[1]})
        return int(row[0])

    def backfill_schedule(self, name: str, occurrences: Sequence[datetime]) -> list[int]:
        """Create runs for past occurrences that have none; returns the new ids."""
        with self._conn("backfill") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query("backfill_schedule"),
                {"name": name, "occurrences": list(occurrences)},
            ).fetchall()
            if rows:
                conn.execute(sqlfile.query("notify"), {"job_type": rows[0][1]})
        return [int(r[0]) for r in rows]

    @contextlib.contextmanager
    def connection(self, operation: str = "connection") -> Iterator[db.Connection]:
        """A pooled connection for callers that need a transaction of their own."""
        with self._conn(operation) as conn:
            yield conn

    # -- observability ---------------------------------------------------------------------

    def job_type_stats(self) -> list[JobTypeStats]:
        """Per job type with any active or recently dead run, ordered by job type."""
        return [
            JobTypeStats(
                job_type=r[0],
                due=int(r[1]),
                oldest_due_seconds=None if r[2] is None else float(r[2]),
                scheduled=int(r[3]),
                running=int(r[4]),
                stuck=int(r[5]),
                awaiting_retry=int(r[6]),
                dead_recent=int(r[7]),
            )
            for r in self._all("job_type_stats", "job_type_stats", {})
        ]

    def metrics_snapshot(
        self,
        due_at: Mapping[str, datetime | None],
        *,
        statement_timeout_seconds: float,
        pool_timeout_seconds: float,
    ) -> MetricsSnapshot:
        """The database-derived metrics in one statement, bounded in time both while waiting
        for a connection and while the statement runs (a scrape must not hang on the database).
        ``due_at`` maps schedule names to the occurrence that should have started by now."""
        params = {"names": list(due_at), "due_at": list(due_at.values())}
        with (
            db.wrap_errors("metrics"),
            self.pool.connection(timeout=pool_timeout_seconds) as conn,
            conn.transaction(),
        ):
            conn.execute(
                sqlfile.query("set_local_statement_timeout"),
                {"ms": max(1, round(statement_timeout_seconds * 1000))},
            )
            row = conn.execute(sqlfile.query("metrics_snapshot"), params).fetchone()
        assert row is not None
        db_now, queues, terminal, counted_at, schedules = row
        return MetricsSnapshot(
            db_now=float(db_now),
            queues=[
                QueueCounts(t, int(q), int(r), int(f), int(d), o, int(s))
                for t, q, r, f, d, o, s in queues
            ],
            terminal={(t, s): int(n) for t, s, n in terminal},
            terminal_counted_at=None if counted_at is None else float(counted_at),
            schedules=[ScheduleHealth(n, bool(p), ls, ds) for n, p, ls, ds in schedules],
        )

    def refresh_terminal_counts(self, max_age_seconds: float, timeout_seconds: float) -> bool:
        """Recount runs in terminal states if the counts are older than ``max_age_seconds``
        and no other daemon is recounting; True if this call recounted."""
        with self._conn("recount") as conn, conn.transaction():
            claimed = conn.execute(
                sqlfile.query("claim_terminal_counts_refresh"), {"max_age": max_age_seconds}
            ).fetchall()
            if not claimed:
                return False
            conn.execute(
                sqlfile.query("set_local_statement_timeout"),
                {"ms": max(1, round(timeout_seconds * 1000))},
            )
            conn.execute(sqlfile.query("recount_terminal_runs"))
        return True

    # -- the web console ---------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(
        self, operation: str, *, statement_timeout_seconds: float, pool_timeout_seconds: float
    ) -> Iterator[RunStore]:
        """A store pinned to one connection in a read-only transaction whose statements are
        bounded in time: a page shows one snapshot, cannot write, and cannot hang."""
        with (
            db.wrap_errors(operation),
            self.pool.connection(timeout=pool_timeout_seconds) as conn,
            conn.transaction(),
        ):
            conn.execute(sqlfile.query("console_read_only"))
            conn.execute(
                sqlfile.query("set_local_statement_timeout"),
                {"ms": max(1, round(statement_timeout_seconds * 1000))},
            )
            yield RunStore(self.pool, conn)

    def succeeded_per_minute(self, minutes: int) -> list[int]:
        """Succeeded runs per minute over the last ``minutes``, oldest minute first. In a
        savepoint inside ``reading``, so a timeout here spares the rest of the page."""
        with self._conn("console") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query("console_succeeded_per_minute"), {"minutes": minutes}
            ).fetchall()
        counts = [0] * minutes
        for minutes_ago, n in rows:
            if 0 <= minutes_ago < minutes:
                counts[minutes - 1 - minutes_ago] = int(n)
        return counts
