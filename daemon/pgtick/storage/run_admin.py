"""The operator's side of runs: the reads behind ``pgtick runs``, ``pgtick show``, the console
and the bulk verbs, and the actions ``retry`` and ``cancel``. Apart from ``runs.py``, which is
the daemon's hot path (enqueue, claim, heartbeat, finish), because none of these runs per run
and their records are the full rows an operator reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgtick.storage import db, sqlfile
from pgtick.storage.base import StoreBase
from pgtick.storage.run_values import TERMINAL_STATUSES, TIMED_OUT_RUNNING
from pgtick.storage.runs import wake


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
    priority: int = 0
    concurrency_key: str | None = None
    after_on: Any = None  # what it waits for (`after`, migration 0027)

    @property
    def timed_out_running(self) -> bool:
        """Past its timeout, its Python handler has not returned yet: still held, its attempt
        written when the handler returns (mark_timed_out)."""
        return (
            self.status == "running"
            and self.error_type == "timeout"
            and (self.last_error or "").endswith(TIMED_OUT_RUNNING)
        )


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
    result: Any = None  # what the attempt's handler returned (migration 0024)


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
class EffectKey:
    """A side effect a run recorded (``effects``)."""

    key: str
    created_at: datetime


class RunAdminQueries(StoreBase):
    """Reads and actions of ``pgtick runs``/``show``/``retry``/``cancel`` and the console."""

    def retry(self, run_ids: Sequence[int]) -> list[int]:
        """failed/dead/cancelled -> queued now; returns the ids that changed."""

        def write(conn: db.Connection) -> list[tuple[Any, ...]]:
            with conn.transaction():
                rows: list[tuple[Any, ...]] = conn.execute(
                    sqlfile.query("retry", conn.schema), {"ids": list(run_ids)}
                ).fetchall()
                rows = [row for row in rows if row[0] is not None]  # not batches' (0026)
                wake(conn, (row[1] for row in rows))
            return rows

        return sorted(row[0] for row in self._moving("retry", write))

    def held_after_cancel(self, run_ids: Sequence[int]) -> list[tuple[int, str, int]]:
        """Cancelled runs among these whose holder has not let go: (id, holder, seconds left
        on its lease)."""
        rows = self._all("retry", "held_after_cancel", {"ids": list(run_ids)})
        return [(int(i), str(holder), int(left)) for i, holder, left in rows]

    def cancel(self, run_ids: Sequence[int]) -> list[int]:
        """Non-terminal -> cancelled; returns the ids that changed."""
        params = {"ids": list(run_ids)}
        rows = self._moving(
            "cancel",
            lambda conn: conn.execute(sqlfile.query("cancel", conn.schema), params).fetchall(),
        )
        return sorted(row[0] for row in rows if row[0] is not None)

    def get_run(self, run_id: int) -> Run | None:
        rows = self._all("get_run", "get_run", {"id": run_id})
        return Run(*rows[0]) if rows else None

    def get_attempts(self, run_id: int) -> list[Attempt]:
        return [Attempt(*row) for row in self._all("get_attempts", "get_attempts", {"id": run_id})]

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

    def filter_count(
        self, statuses: Sequence[str], job_type: str | None, schedule: str | None
    ) -> int:
        """How many runs of ``statuses`` match the job type and schedule (None: any)."""
        params = {"statuses": list(statuses), "job_type": job_type, "schedule": schedule}
        return int(self._all("filter_count", "filter_count", params)[0][0])

    def filter_ids(
        self,
        statuses: Sequence[str],
        job_type: str | None,
        schedule: str | None,
        limit: int,
        among: Sequence[int] | None = None,
    ) -> list[int]:
        """The ids of ``filter_count``'s runs, oldest first, at most ``limit``; with ``among``,
        only those of these ids that match."""
        params = {
            "statuses": list(statuses),
            "job_type": job_type,
            "schedule": schedule,
            "ids": None if among is None else sorted(among),
            "limit": limit,
        }
        return [int(r[0]) for r in self._all("filter_ids", "filter_ids", params)]

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
