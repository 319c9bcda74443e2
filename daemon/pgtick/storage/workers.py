"""Workers: the ``workers`` rows daemons register, heartbeat through and delete, and what
``pgtick status`` lists of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgtick.storage import db, sqlfile
from pgtick.storage.base import StoreBase


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    version: str
    threads: int
    job_types: Sequence[str]


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


class WorkerQueries(StoreBase):
    """The workers aggregate."""

    @staticmethod
    def connection_limit_on(conn: db.Connection) -> tuple[int, int]:
        """(connections an ordinary role may open, max_connections) of the server."""
        with db.wrap_errors("connect"):
            row = conn.execute(sqlfile.query("connection_limit", conn.schema)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def register_worker(self, info: WorkerInfo) -> None:
        with self._conn("register_worker") as conn:
            conn.execute(
                sqlfile.query("register_worker", conn.schema),
                {
                    "id": info.id,
                    "hostname": info.hostname,
                    "pid": info.pid,
                    "version": info.version,
                    "threads": info.threads,
                    "job_types": list(info.job_types),
                },
            )

    def beat_workers(self, worker_ids: Sequence[str]) -> set[str]:
        """Mark these workers alive; returns those whose row exists."""
        rows = self._all("beat_workers", "beat_workers", {"ids": list(worker_ids)})
        return {str(row[0]) for row in rows}

    def deregister_worker(self, worker_id: str) -> None:
        with self._conn("deregister_worker") as conn:
            conn.execute(sqlfile.query("deregister_worker", conn.schema), {"id": worker_id})

    def reap_workers(self, older_than_seconds: float) -> list[str]:
        rows = self._all("reap_workers", "reap_workers", {"older_than": older_than_seconds})
        return [row[0] for row in rows]

    def list_workers(self) -> list[WorkerRow]:
        return [WorkerRow(*row) for row in self._all("status", "list_workers", {})]
