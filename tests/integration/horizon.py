"""A snapshot held by another session, as a `pg_dump` or a long report holds one: vacuum can
remove no row version deleted or updated after it began; and what a statement reads under it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import sql

from pgtick.storage import db, sqlfile


@contextlib.contextmanager
def held_snapshot(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding a REPEATABLE READ snapshot until the block ends."""
    with psycopg.connect(dsn) as session:
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT 1").fetchone()
        yield session
        session.rollback()


def statement_buffers(conn: db.Connection, name: str, params: Mapping[str, Any]) -> int:
    """Shared buffers the named statement of queries.sql touched, run by EXPLAIN ANALYZE in
    the caller's transaction (roll it back for statements that write or lock)."""
    query = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + sqlfile.query(name, conn.schema)
    plan = conn.execute(query, params).fetchone()[0]  # type: ignore[index]
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])
