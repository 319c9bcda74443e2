"""Connections and pools; with store.py the only code that sees psycopg errors.

Every connection runs with ``search_path`` set to the configured schema, so queries.sql never
names the schema, and in autocommit mode: one statement is one round trip, and the few
multi-statement units use ``conn.transaction()`` explicitly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool

from pgtick.errors import DatabaseError
from pgtick.storage import sqlfile

CONNECT_TIMEOUT_SECONDS = 10
POOL_OPEN_TIMEOUT_SECONDS = 15.0
APPLICATION_NAME = "pgtick"
DB_RETRY_MIN_SECONDS = 0.2
DB_RETRY_MAX_SECONDS = 5.0

Connection = psycopg.Connection[Any]


def _connect_kwargs(application_name: str) -> dict[str, Any]:
    return {
        "autocommit": True,
        "connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "application_name": application_name,
    }


def retry_delay(failures: int) -> float:
    """Back-off between attempts to reach the database again (every loop uses it)."""
    return float(min(DB_RETRY_MAX_SECONDS, DB_RETRY_MIN_SECONDS * 2 ** max(0, failures - 1)))


def set_search_path(conn: Connection, schema: str) -> None:
    """Point unqualified names at the pgtick schema (pool ``configure`` callback)."""
    conn.execute(sqlfile.with_schema("set_search_path", schema))


def describe(exc: BaseException) -> str:
    """A one-line description of a database error, without the DSN's password."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first}"


@contextlib.contextmanager
def wrap_errors(operation: str) -> Iterator[None]:
    """Turn psycopg and pool errors into DatabaseError naming the operation."""
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        raise DatabaseError(f"{operation}: {describe(exc)}") from exc


def connect(dsn: str, schema: str, *, application_name: str = APPLICATION_NAME) -> Connection:
    """A single autocommit connection with the schema on its search_path."""
    with wrap_errors("connect"):
        conn = psycopg.connect(dsn, **_connect_kwargs(application_name))
        try:
            set_search_path(conn, schema)
        except BaseException:
            conn.close()
            raise
        return conn


def connect_raw(dsn: str, *, application_name: str = APPLICATION_NAME) -> Connection:
    """An autocommit connection that leaves search_path alone (migrations, LISTEN)."""
    with wrap_errors("connect"):
        return psycopg.connect(dsn, **_connect_kwargs(application_name))


def make_pool(
    dsn: str,
    schema: str,
    *,
    size: int,
    name: str = "pgtick",
    open_timeout: float = POOL_OPEN_TIMEOUT_SECONDS,
    wait: bool = True,
) -> psycopg_pool.ConnectionPool[Connection]:
    """A pool of ``size`` autocommit connections, checked on checkout, opened explicitly."""
    pool: psycopg_pool.ConnectionPool[Connection] = psycopg_pool.ConnectionPool(
        dsn,
        min_size=size,
        max_size=size,
        kwargs=_connect_kwargs(name),
        configure=lambda conn: set_search_path(conn, schema),
        check=psycopg_pool.ConnectionPool.check_connection,
        name=name,
        open=False,
        timeout=open_timeout,
    )
    with wrap_errors("connect"):
        # One plain connection first: if the server is unreachable this fails at once with
        # the real cause, where the pool would retry quietly and report only a timeout.
        psycopg.connect(dsn, **_connect_kwargs(name)).close()
        try:
            pool.open(wait=wait, timeout=open_timeout)
        except BaseException:
            pool.close()
            raise
    return pool
