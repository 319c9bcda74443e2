"""What every part of the store shares: the pool, a connection pinned for a hot loop or for a
read-only page, the helpers that run one named query, and the database clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Self, TypeVar

import psycopg_pool

from pgtick.errors import DatabaseError
from pgtick.storage import db, sqlfile

Pool = psycopg_pool.ConnectionPool[db.Connection]
T = TypeVar("T")
# A write that waited on a row moved meanwhile runs again; more than a couple of moves of one
# run between two tries means something else is wrong.
MOVED_ROW_TRIES = 5
# A statement that locks many runs with SKIP LOCKED (the claim, the heartbeat, the reaper)
# fails when any row it reaches was moved after its snapshot; each failed try met another
# finish, and while a daemon drains a backlog its result writer commits one every few
# milliseconds (a beat of 2 000-5 000 leases failed two tries in three against a writer
# finishing them back to back): more tries, each a round trip.
SKIPPING_TRIES = 50


def set_statement_timeout(conn: db.Connection, seconds: float) -> None:
    """Bound the statements of the current transaction (``SET LOCAL``) to ``seconds``."""
    conn.execute(
        sqlfile.query("set_local_statement_timeout", conn.schema),
        {"ms": max(1, round(seconds * 1000))},
    )


def by_index(
    conn: db.Connection, name: str, params: Mapping[str, Any], *, lock_wait_ms: int | None = None
) -> list[tuple[Any, ...]]:
    """Run a statement of the hot path (claim, finish, heartbeat, probes) with the planner held
    to index paths: ``planner_hints`` and the statement go in one pipeline, one round trip,
    and the hints last as long as the statement's transaction (the implicit one that ends at
    the pipeline's sync, or the caller's). Why: the header of queries.sql. ``lock_wait_ms``
    bounds its waits for row locks likewise (``lock_wait``)."""
    with conn.pipeline():
        conn.execute(sqlfile.query("planner_hints", conn.schema))
        if lock_wait_ms is not None:
            conn.execute(sqlfile.query("lock_wait", conn.schema), {"ms": f"{lock_wait_ms}ms"})
        return conn.execute(sqlfile.query(name, conn.schema), params).fetchall()


class StoreBase:
    """A pool, or one connection of it pinned; the aggregates' query classes build on this."""

    def __init__(self, pool: Pool, pinned: db.Connection | None = None) -> None:
        self.pool = pool
        self._pinned = pinned

    @contextlib.contextmanager
    def pinned(self, operation: str) -> Iterator[Self]:
        """A store bound to one pooled connection, for a hot loop.

        The pool checks a connection when it is handed out; a loop that keeps one saves that
        round trip on every statement. After a DatabaseError the loop leaves this block, the
        pool drops the broken connection, and the loop pins a fresh one.
        """
        with db.wrap_errors(operation), self.pool.connection() as conn:
            yield type(self)(self.pool, conn)

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
            return conn.execute(sqlfile.query(query, conn.schema), params).fetchall()

    def _by_index(
        self, operation: str, query: str, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        """``_all`` for a statement of the hot path (``by_index``)."""
        with self._conn(operation) as conn:
            return by_index(conn, query, params)

    def _moving(
        self, operation: str, write: Callable[[db.Connection], T], tries: int = MOVED_ROW_TRIES
    ) -> T:
        """Run ``write`` (statements, or a transaction, on runs' rows), again when a row it
        locked or waited for had been moved to another partition since its snapshot
        (``db.moved_row``: nothing was written); ``tries`` times, then the error stands.
        MOVED_ROW_TRIES for writes that wait on one row, SKIPPING_TRIES for those that lock
        many with SKIP LOCKED."""
        for attempt in range(1, tries + 1):
            try:
                with self._conn(operation) as conn:
                    return write(conn)
            except DatabaseError as exc:
                if attempt == tries or not db.moved_row(exc):
                    raise
        raise AssertionError("unreachable")

    def now(self) -> datetime:
        """The database clock."""
        value: datetime = self._all("now", "db_now", {})[0][0]
        return value

    def current_user(self) -> str:
        """The role the store's connections act as."""
        return str(self._all("current_user", "current_user", {})[0][0])

    @contextlib.contextmanager
    def connection(self, operation: str = "connection") -> Iterator[db.Connection]:
        """A pooled connection for callers that need a transaction of their own."""
        with self._conn(operation) as conn:
            yield conn

    @contextlib.contextmanager
    def reading(
        self, operation: str, *, statement_timeout_seconds: float, pool_timeout_seconds: float
    ) -> Iterator[Self]:
        """A store pinned to one connection in a read-only transaction whose statements are
        bounded in time: a page shows one snapshot, cannot write, and cannot hang."""
        with (
            db.wrap_errors(operation),
            self.pool.connection(timeout=pool_timeout_seconds) as conn,
            conn.transaction(),
        ):
            conn.execute(sqlfile.query("console_read_only", conn.schema))
            conn.execute(sqlfile.query("console_no_jit", conn.schema))
            set_statement_timeout(conn, statement_timeout_seconds)
            yield type(self)(self.pool, conn)
