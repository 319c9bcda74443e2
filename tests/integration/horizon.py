"""A snapshot held by another session, as a `pg_dump` or a long report holds one: vacuum can
remove no row version deleted or updated after it began."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg


@contextlib.contextmanager
def held_snapshot(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding a REPEATABLE READ snapshot until the block ends."""
    with psycopg.connect(dsn) as session:
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT 1").fetchone()
        yield session
        session.rollback()
