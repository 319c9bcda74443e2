"""Maintenance and observation: the reaper's expired leases, retention pruning, and the reads
behind the database-derived metrics, ``pgtick status`` queues and the console's chart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb

from pgtick.storage import db, sqlfile
from pgtick.storage.base import SKIPPING_TRIES, StoreBase, set_statement_timeout
from pgtick.storage.run_values import TERMINAL_STATUSES
from pgtick.storage.runs import announce

log = structlog.get_logger("pgtick.metrics")

PRUNE_BATCH_ROWS = 1000
# `pgtick prune` tries a step that found a lock taken ("busy": no step waits in a lock's queue,
# migration 0020) again after 0.05, 0.1, 0.2 ... seconds, at most PRUNE_BUSY_RETRIES times
# (some 13 s in all), before it leaves that table's partitions to the rows' deletion.
PRUNE_BUSY_RETRIES = 10
PRUNE_BUSY_FIRST_WAIT_SECONDS = 0.05
PRUNE_BUSY_MAX_WAIT_SECONDS = 2.0
# How far ahead the terminal runs', attempts' and output's partitions are created: longer than
# a reader that blocks their creation (pg_dump holds a lock on every table it dumps) is likely
# to run, so that rows meanwhile still find their partition.
PARTITIONS_AHEAD_SECONDS = 1800.0
# A bound on one pass's steps (each creates or drops one partition), far above what a pass
# needs (a day's retention: a few partitions per parent).
MAX_PARTITION_STEPS = 10_000
REAP_BATCH_ROWS = 500
# A lease that ended is left to its holder while the holder is alive (the reaper's
# holder_not_alive, in queries.sql): its workers row shows a heartbeat within this many
# seconds, taken no earlier than LEASE_END_SLACK_SECONDS before the lease's end. A holder
# beats that late only when another session held the run's row locked at its beats; one
# stopped or dead beat last when it renewed the lease, a whole lease (MIN_LEASE_SECONDS, 1 s,
# at least) before the end. While such a lock lasts a holder beats every
# heartbeat.BLOCKED_BEAT_SECONDS, and once LEASE_END_SLACK_SECONDS / 2 before the lease ends.
HOLDER_ALIVE_SECONDS = 5.0
LEASE_END_SLACK_SECONDS = 0.5
# The partitioned tables (maintain_partitions' parents) of runs' history that are partitioned
# by the history's own times, not by their runs' finish (ended attempts, output), and the rest.
RUN_HISTORY_TABLES = ("attempts_ended", "output_chunks")
RUN_TABLES = ("runs_succeeded", "runs_dead", "runs_cancelled", "runs_skipped", "attempts_succeeded")


def busy_wait_seconds(tries: int) -> float:
    """The pause before trying a busy partition step again for the ``tries``-th time."""
    return float(min(PRUNE_BUSY_MAX_WAIT_SECONDS, PRUNE_BUSY_FIRST_WAIT_SECONDS * 2 ** (tries - 1)))


@dataclass(frozen=True)
class ReapedRun:
    id: int
    status: str
    job_type: str
    run_at: datetime
    worker_id: str | None  # the holder whose lease it was


@dataclass(frozen=True)
class ReapLook:
    """The reaper's look before a pass (reap_look)."""

    now: datetime  # the database clock
    due: bool  # a lease in the range ended and its holder is not alive: the pass may take it
    # The earliest lease in the range that ended on a run still running, taken or not (None:
    # none): the next pass's range starts no later, so one the pass cannot take now (a row
    # another session holds locked, or a live holder's) is taken as soon as it may be.
    oldest: datetime | None


def _reap_params(since: datetime | None) -> dict[str, Any]:
    """The reaper's range (ended_leases) and who counts as alive (holder_not_alive)."""
    return {"since": since, "alive": HOLDER_ALIVE_SECONDS, "slack": LEASE_END_SLACK_SECONDS}


@dataclass(frozen=True)
class PartitionChange:
    """What retention did to one partition: created, dropped, deleted (rows of a DEFAULT
    partition), or busy (a lock it would have waited for: tried again next time)."""

    action: str
    parent: str  # runs_succeeded, ..., attempts_ended, output_chunks
    table: str
    rows: int

    @property
    def status(self) -> str | None:
        """The terminal status whose runs the partition held; None for attempts and output."""
        status = self.parent.removeprefix("runs_")
        return status if status in TERMINAL_STATUSES else None


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
class HorizonHolder:
    """Something holding the database's MVCC horizon back: a session, a replication slot or
    a prepared transaction (``kind``); ``ident`` is its pid, slot name or gid."""

    kind: str  # session | slot | prepared
    ident: str
    user: str | None
    application: str | None  # application_name; a slot's type
    client: str | None  # client_addr (None: local socket, or not a session)
    state: str | None  # a session's state; a slot's active/inactive
    age_seconds: float | None  # None: not known from the database (a slot, a walsender)
    xid_age: int  # transactions since its snapshot or transaction id
    backend_type: str | None


@dataclass(frozen=True)
class MetricsSnapshot:
    """The result of the one aggregate query behind the database-derived metrics."""

    db_now: float
    queues: list[QueueCounts]
    terminal: dict[tuple[str, str], int]
    terminal_counted_at: float | None
    schedules: list[ScheduleHealth]
    horizon: list[HorizonHolder] = field(default_factory=list)  # oldest first
    sees_all_sessions: bool = True  # False: no pg_read_all_stats, other roles' are hidden
    dead_tuples: dict[str, int] = field(default_factory=dict)  # pgtick table -> dead rows
    batches_open: dict[str, int] = field(default_factory=dict)  # open | closed -> batches
    waiting_after: dict[str, int] = field(default_factory=dict)  # job type -> runs (after)


def warm_metrics_connection(conn: db.Connection, statement_timeout_seconds: float) -> None:
    """A metrics pool's ``on_connect``: the aggregate once, for no schedule, so that the new
    server session has read the catalogs of every partition and planned schedule_health()
    before a scrape waits for it (the first read on a session took 20-45 ms longer, and the
    pool's two sessions take turns: two slow scrapes of ten). A failure only leaves the
    session cold; the scrape's own read reports its errors."""
    try:
        with conn.transaction():
            set_statement_timeout(conn, statement_timeout_seconds)
            params = {"names": [], "due_at": [], "schema": conn.schema}
            conn.execute(sqlfile.query("metrics_snapshot", conn.schema), params).fetchone()
    except psycopg.Error as exc:
        log.debug("metrics_connection_not_warmed", error=db.describe(exc))


class MaintenanceQueries(StoreBase):
    """Reaping, pruning and the aggregate reads of metrics, status and the console."""

    def reap_cancelled(self, limit: int = REAP_BATCH_ROWS) -> int:
        """Let go of cancelled runs whose holder died before it could (lease expired)."""
        params = {"limit": limit, **_reap_params(None)}
        return int(self._all("reap", "reap_cancelled", params)[0][0])

    def reap_look(self, since: datetime | None = None) -> ReapLook:
        """The database clock now, whether a lease that ended at or after ``since`` (None:
        any) awaits the reaper, and the earliest such lease of a run still running."""
        [(now, due, oldest)] = self._all("reap", "reap_look", _reap_params(since))
        return ReapLook(now, bool(due), oldest)

    def reap(
        self,
        delay_for: Callable[[str, int], float],
        limit: int = REAP_BATCH_ROWS,
        since: datetime | None = None,
    ) -> list[ReapedRun]:
        """Fail or kill runs whose lease expired (at or after ``since``, if given), in one
        short transaction; wakes idle daemons for the runs that are claimable again. Again
        when a run whose lease it read as expired was finished by its holder meanwhile
        (base.SKIPPING_TRIES)."""
        return self._moving(
            "reap", lambda conn: self._reap_on(conn, delay_for, limit, since), SKIPPING_TRIES
        )

    def _reap_on(
        self,
        conn: db.Connection,
        delay_for: Callable[[str, int], float],
        limit: int,
        since: datetime | None,
    ) -> list[ReapedRun]:
        with conn.transaction():
            rows = conn.execute(
                sqlfile.query("reap_select", conn.schema), {"limit": limit, **_reap_params(since)}
            ).fetchall()
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
                    sqlfile.query("reap_mark", conn.schema),
                    {"ids": ids, "delays": delays, "workers": [row[4] for row in rows]},
                ).fetchall()
                if row[0] is not None  # not the rows of chains and batches (0025, 0026)
            ]
            # A first lost attempt is claimable at once: wake idle daemons now rather than
            # at their next poll, so recovery takes lease + reaper interval, not + a poll.
            # It keeps its run_at, behind the claimers' lower bounds: say where it is.
            announce(conn, [(r.job_type, r.run_at) for r in done if r.status == "failed"])
        return done

    def reap_holder(
        self,
        worker_id: str,
        job_types: Sequence[str],
        delay_for: Callable[[str, int], float],
    ) -> tuple[list[ReapedRun], int]:
        """A worker process of this daemon died: its running runs of ``job_types`` (whose
        handlers died with it) failed or dead at once, as the reaper would once their leases
        ended, and its cancelled ones let go of; (the runs reaped, how many let go of)."""

        def step(conn: db.Connection) -> tuple[list[ReapedRun], int]:
            params = {"worker_id": worker_id, "job_types": list(job_types)}
            with conn.transaction():
                rows = conn.execute(
                    sqlfile.query("reap_holder_select", conn.schema), params
                ).fetchall()
                done: list[ReapedRun] = []
                if rows:
                    delays = [
                        None if attempts >= (max_attempts or 1) else delay_for(jt, attempts)
                        for _, jt, attempts, max_attempts, _ in rows
                    ]
                    done = [
                        ReapedRun(*row)
                        for row in conn.execute(
                            sqlfile.query("reap_holder_mark", conn.schema),
                            {
                                "ids": [row[0] for row in rows],
                                "delays": delays,
                                "workers": [row[4] for row in rows],
                            },
                        ).fetchall()
                    ]
                    announce(conn, [(r.job_type, r.run_at) for r in done if r.status == "failed"])
                let_go = conn.execute(
                    sqlfile.query("reap_holder_cancelled", conn.schema), params
                ).fetchone()
            return done, int(let_go[0]) if let_go else 0

        return self._moving("reap", step, SKIPPING_TRIES)

    def maintain_partitions(
        self,
        retention: Mapping[str, float],
        ahead_seconds: float = PARTITIONS_AHEAD_SECONDS,
        *,
        delete_default: bool = True,
        skip: Sequence[str] = (),
        busy_retries: int = 0,
    ) -> list[PartitionChange]:
        """Create the partitions ahead and drop those past ``retention`` (seconds per terminal
        status; the attempts and output ones only when all four are given), one step per
        transaction, so that no step holds its locks longer than itself. A parent whose lock
        could not be had at once ("busy") is left for the next pass. ``delete_default``:
        also delete the DEFAULT partitions' rows past retention (``prune`` deletes those
        itself). ``skip``: partitioned tables (parents) left alone. ``busy_retries``: how many
        times a busy step is tried again, after a growing pause, before its parent is left
        for the next pass (the daemon's passes come again anyway; ``pgtick prune``'s does
        not). Returns what changed, a busy step only once it is given up; nothing when
        another caller is at it."""
        changes: list[PartitionChange] = []
        busy: list[str] = list(skip)  # the parents to skip, sent with every step
        params = {
            "retention": Jsonb(dict(retention)),
            "ahead": ahead_seconds,
            "skip": busy,
            "delete_default": delete_default,
        }

        def step(conn: db.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                sqlfile.query("maintain_partitions", conn.schema), params
            ).fetchall()

        tries: dict[str, int] = {}  # busy steps per parent
        for _ in range(MAX_PARTITION_STEPS):
            # Again when a DEFAULT partition's row that the step deletes was moved out of it
            # (an operator's `retry`) after the step's snapshot (base.SKIPPING_TRIES).
            rows = self._moving("retention", step, SKIPPING_TRIES)
            if not rows:
                break
            action, parent, table, count = rows[0]
            change = PartitionChange(str(action), str(parent), str(table), int(count))
            if change.action == "busy":
                tried = tries[change.parent] = tries.get(change.parent, 0) + 1
                if tried <= busy_retries:
                    # The CLI's own wait (prune_partitions), never a daemon loop's.
                    time.sleep(busy_wait_seconds(tried))
                    continue
                busy.append(change.parent)
            changes.append(change)
        return changes

    def prune_partitions(self, retention: Mapping[str, float]) -> list[PartitionChange]:
        """``maintain_partitions`` for ``pgtick prune --older-than`` (``retention``: every
        terminal status): ended attempts and output are partitioned by their own times, not
        their runs', so their partitions go only as far back as the oldest run the prune keeps
        (one awaiting a retry, one that succeeded after an old failure) was enqueued."""
        retries = PRUNE_BUSY_RETRIES
        changes = self.maintain_partitions(
            retention, delete_default=False, skip=RUN_HISTORY_TABLES, busy_retries=retries
        )
        seconds = min(retention.values())
        row = self._all("kept_history_age", "kept_history_age", {"seconds": seconds})
        kept = row[0][0] if row and row[0][0] is not None else 0.0
        keep = dict.fromkeys(retention, max(seconds, float(kept)))
        return changes + self.maintain_partitions(
            keep, delete_default=False, skip=RUN_TABLES, busy_retries=retries
        )

    def prune(
        self,
        status: str,
        older_than_seconds: float,
        batch: int = PRUNE_BATCH_ROWS,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal runs of ``status`` finished longer ago than given, in batches, with
        their attempts and output (what ``maintain_partitions`` left: the part of a partition
        a cutoff splits); ``on_batch`` is told each batch's count (progress)."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"only terminal runs are pruned, not {status!r}")
        params = {"status": status, "older_than": older_than_seconds, "batch": batch}

        def delete(conn: db.Connection) -> int:
            row = conn.execute(sqlfile.query("prune", conn.schema), params).fetchone()
            return int(row[0]) if row else 0

        total = 0
        while True:
            # Again when a run `retry` queued after this batch's snapshot was moved out of
            # its terminal partition before the scan reached it (base.SKIPPING_TRIES).
            deleted = self._moving("prune", delete, SKIPPING_TRIES)
            total += deleted
            if on_batch is not None:
                on_batch(deleted)
            if deleted < batch:
                return total

    def count_prunable(self, status: str, older_than_seconds: float) -> int:
        """How many runs ``prune`` would delete now."""
        params = {"status": status, "older_than": older_than_seconds}
        return int(self._all("prune", "count_prunable", params)[0][0])

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
        with (
            db.wrap_errors("metrics"),
            self.pool.connection(timeout=pool_timeout_seconds) as conn,
            conn.transaction(),
        ):
            set_statement_timeout(conn, statement_timeout_seconds)
            params = {
                "names": list(due_at),
                "due_at": list(due_at.values()),
                "schema": conn.schema,
            }
            row = conn.execute(sqlfile.query("metrics_snapshot", conn.schema), params).fetchone()
        assert row is not None
        (
            db_now,
            queues,
            terminal,
            counted_at,
            schedules,
            horizon,
            sees_all,
            dead,
            batches,
            after,
        ) = row
        return MetricsSnapshot(
            db_now=float(db_now),
            queues=[
                QueueCounts(t, int(q), int(r), int(f), int(d), o, int(s))
                for t, q, r, f, d, o, s in queues
            ],
            terminal={(t, s): int(n) for t, s, n in terminal},
            terminal_counted_at=None if counted_at is None else float(counted_at),
            schedules=[ScheduleHealth(n, bool(p), ls, ds) for n, p, ls, ds in schedules],
            horizon=[
                HorizonHolder(k, i, u, a, c, st, None if sec is None else float(sec), int(x), b)
                for k, i, u, a, c, st, sec, x, b in horizon
            ],
            sees_all_sessions=bool(sees_all),
            dead_tuples={str(t): int(n) for t, n in dead},
            batches_open={"open": int(batches[0]), "closed": int(batches[1])},
            waiting_after={str(t): int(n) for t, n in after},
        )

    def refresh_terminal_counts(self, max_age_seconds: float, timeout_seconds: float) -> bool:
        """Recount runs in terminal states if the counts are older than ``max_age_seconds``
        and no other daemon is recounting; True if this call recounted."""
        with self._conn("recount") as conn, conn.transaction():
            claimed = conn.execute(
                sqlfile.query("claim_terminal_counts_refresh", conn.schema),
                {"max_age": max_age_seconds},
            ).fetchall()
            if not claimed:
                return False
            set_statement_timeout(conn, timeout_seconds)
            conn.execute(sqlfile.query("recount_terminal_runs", conn.schema))
        return True

    def finished_per_type_minute(self, minutes: int) -> dict[str, tuple[list[int], list[int]]]:
        """Per job type, runs that succeeded and runs that went dead in each of the last
        ``minutes``, oldest minute first. In a savepoint inside ``reading``, like
        ``succeeded_per_minute``."""
        with self._conn("console") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query("console_finished_per_type_minute", conn.schema),
                {"minutes": minutes},
            ).fetchall()
        per_type: dict[str, tuple[list[int], list[int]]] = {}
        for job_type, minutes_ago, succeeded, dead in rows:
            if 0 <= minutes_ago < minutes:
                ok, failed = per_type.setdefault(str(job_type), ([0] * minutes, [0] * minutes))
                ok[minutes - 1 - minutes_ago] += int(succeeded)
                failed[minutes - 1 - minutes_ago] += int(dead)
        return per_type

    def succeeded_per_minute(self, minutes: int) -> list[int]:
        """Succeeded runs per minute over the last ``minutes``, oldest minute first. In a
        savepoint inside ``reading``, so a timeout here spares the rest of the page."""
        with self._conn("console") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query("console_succeeded_per_minute", conn.schema), {"minutes": minutes}
            ).fetchall()
        counts = [0] * minutes
        for minutes_ago, n in rows:
            if 0 <= minutes_ago < minutes:
                counts[minutes - 1 - minutes_ago] = int(n)
        return counts
