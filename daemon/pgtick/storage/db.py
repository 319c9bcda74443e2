"""Connections and pools; with store.py the only code that sees psycopg errors.

Connections keep no session state, so that they work behind a transaction-mode pooler
(PgBouncer) where consecutive statements may reach different server connections: no
``search_path`` (every statement names its schema, see sqlfile.py; the connection only
carries the schema's name for rendering them; the one session setting, a UTC zone's name,
changes no result: queries.sql, utc_by_name), no server-side prepared statements
unless ``database.prepared_statements`` allows them and ``behind_pooler`` finds the
connection direct (psycopg prepares a statement after 5 runs, and behind the pooler the next
transaction may land where it does not exist; the worker pool's hot statements are faster
prepared; service.py decides), no session advisory locks, and
timeouts set with ``set_config(..., is_local => true)`` inside a transaction. Autocommit: one
statement is one round trip, and the few multi-statement units use ``conn.transaction()``,
whose BEGIN names READ COMMITTED: they look a row up after waiting for its lock (a
schedule's occurrences, an idempotency key), which is exact only with a fresh snapshot per
statement, whatever ``default_transaction_isolation`` the database or role sets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.adapt
import psycopg_pool

from pgtick.errors import DatabaseError
from pgtick.observability.redact import redact_text
from pgtick.storage import sqlfile

CONNECT_TIMEOUT_SECONDS = 10
POOL_OPEN_TIMEOUT_SECONDS = 15.0
APPLICATION_NAME = "pgtick"
DB_RETRY_MIN_SECONDS = 0.2
DB_RETRY_MAX_SECONDS = 5.0
# psycopg's default: a statement run this often on one connection is prepared on the server.
# Only the worker pool uses it, and only with database.prepared_statements = true on a
# connection that goes through no pooler.
PREPARE_THRESHOLD = 5


class Connection(psycopg.Connection[Any]):
    """A psycopg connection that knows which schema pgtick's statements are for."""

    schema: str = ""


def _connect_kwargs(application_name: str, *, prepare: bool = False) -> dict[str, Any]:
    return {
        "autocommit": True,
        "connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "application_name": application_name,
        "prepare_threshold": PREPARE_THRESHOLD if prepare else None,
    }


class Ints(list[int]):
    """A list of integers for a ``bigint[]`` parameter, sent as one array literal. psycopg's
    own list dumper dumps a list element by element in Python: a finish's two lists of 264
    took 0.38 ms to dump that way, 0.08 ms as this (measured apart), once per batch of
    results, on the thread that writes them."""


class _IntsDumper(psycopg.adapt.Dumper):
    oid = psycopg.postgres.types["int8"].array_oid

    def dump(self, obj: Ints) -> bytes:
        return ("{" + ",".join(map(str, obj)) + "}").encode()


# Every connection, pgtick's and a handler's: only this type of pgtick's own is dumped so.
psycopg.adapters.register_dumper(Ints, _IntsDumper)


def retry_delay(failures: int) -> float:
    """Back-off between attempts to reach the database again (every loop uses it)."""
    return float(min(DB_RETRY_MAX_SECONDS, DB_RETRY_MIN_SECONDS * 2 ** max(0, failures - 1)))


# The names of UTC that are not "UTC" itself (tzdata's links to Etc/UTC): a pool connection
# in one of them names its zone "UTC" instead (queries.sql, utc_by_name, says why). Zones named
# after GMT are left alone: their datetimes' tzname() is "GMT".
UTC_ALIASES = frozenset(
    {"Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu"}
)


def _read_committed(conn: Connection) -> Connection:
    """Transactions begun on ``conn`` say READ COMMITTED (the module docstring says why)."""
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    return conn


def _configure(conn: Connection, schema: str) -> None:
    """Pool ``configure`` callback: the schema this connection's statements are rendered for,
    its transactions READ COMMITTED, and its time zone named "UTC" where the server's is UTC
    under another name."""
    conn.schema = schema
    _read_committed(conn)
    if conn.info.parameter_status("TimeZone") in UTC_ALIASES:
        conn.execute(sqlfile.query("utc_by_name", schema))


def describe(exc: BaseException) -> str:
    """A one-line description of a database error, without the DSN's password."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {redact_text(first)}"


@contextlib.contextmanager
def wrap_errors(operation: str) -> Iterator[None]:
    """Turn psycopg and pool errors into DatabaseError naming the operation."""
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        raise DatabaseError(f"{operation}: {describe(exc)}", unreachable=_lost(exc)) from exc


# SQLSTATEs of a server going away or not taking connections: connection exceptions (class 08),
# admin_shutdown, crash_shutdown and cannot_connect_now.
LOST_SQLSTATES = ("57P01", "57P02", "57P03")


def _lost(exc: Exception) -> bool:
    """Whether ``exc`` says the database is out of reach rather than a statement failed."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in LOST_SQLSTATES


def moved_row(exc: BaseException) -> bool:
    """Whether ``exc`` (or the psycopg error a DatabaseError wraps) is the serialization
    failure PostgreSQL raises in a statement that waited on a run's row lock while another
    transaction moved the row to another partition (a finish moves it out of runs_live):
    the statement can run again and sees the row where it is now."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    return isinstance(cause, psycopg.errors.SerializationFailure)


def lock_not_available(exc: BaseException) -> bool:
    """Whether ``exc`` (or the psycopg error a DatabaseError wraps) is a statement that gave up
    waiting for a lock (``lock_timeout``): nothing was written."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    return isinstance(cause, psycopg.errors.LockNotAvailable)


def connect(dsn: str, schema: str, *, application_name: str = APPLICATION_NAME) -> Connection:
    """A single autocommit connection for pgtick's statements on ``schema``."""
    with wrap_errors("connect"):
        conn = _read_committed(Connection.connect(dsn, **_connect_kwargs(application_name)))
        conn.schema = schema
        return conn


def connect_raw(dsn: str, *, application_name: str = APPLICATION_NAME) -> Connection:
    """An autocommit connection for statements that name their schema themselves
    (migrations, LISTEN)."""
    with wrap_errors("connect"):
        return _read_committed(Connection.connect(dsn, **_connect_kwargs(application_name)))


def behind_pooler(conn: Connection, schema: str) -> bool:
    """Whether a pooler stands between us and the server: the backend pid the server reports
    is not the one the connection was given at startup (PgBouncer hands out its own keys)."""
    row = conn.execute(sqlfile.query("backend_pid", schema)).fetchone()
    return row is not None and int(row[0]) != conn.info.backend_pid


def _check_all_if_broken(conn: Connection, pool: psycopg_pool.ConnectionPool[Connection]) -> None:
    """The checkout's check; a broken connection has the pool check every idle one now.
    After a server restart each is broken, and psycopg_pool hands them out one at a time,
    sleeping 1, 2, 4, 8 s between the failed checks: a checkout waited out its 15 s with
    the server back for 14 (a drain gave up on results it could have written)."""
    try:
        psycopg_pool.ConnectionPool.check_connection(conn)
    except Exception:
        pool.check()  # the broken ones replaced at once; this one is discarded after
        raise


def make_pool(
    dsn: str,
    schema: str,
    *,
    size: int,
    name: str = "pgtick",
    open_timeout: float = POOL_OPEN_TIMEOUT_SECONDS,
    checkout_timeout: float | None = None,
    wait: bool = True,
    prepare: bool = False,
    on_connect: Callable[[Connection], None] | None = None,
) -> psycopg_pool.ConnectionPool[Connection]:
    """A pool of ``size`` autocommit connections, checked on checkout, opened explicitly.
    ``checkout_timeout`` (default: ``open_timeout``) bounds the wait for a connection;
    ``on_connect`` runs on each new connection, on the pool's thread, before any checkout."""

    def configure(conn: Connection) -> None:
        _configure(conn, schema)
        if on_connect is not None:
            on_connect(conn)

    pool: psycopg_pool.ConnectionPool[Connection] = psycopg_pool.ConnectionPool(
        dsn,
        min_size=size,
        max_size=size,
        connection_class=Connection,
        kwargs=_connect_kwargs(name, prepare=prepare),
        configure=configure,
        # Called at checkouts only, once ``pool`` is bound.
        check=lambda conn: _check_all_if_broken(conn, pool),
        name=name,
        open=False,
        timeout=open_timeout if checkout_timeout is None else checkout_timeout,
    )
    with wrap_errors("connect"):
        # One plain connection first: if the server is unreachable this fails at once with
        # the real cause, where the pool would retry quietly and report only a timeout.
        psycopg.connect(dsn, **_connect_kwargs(name)).close()
        try:
            pool.open(wait=wait, timeout=open_timeout)
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise DatabaseError(
                f"connect: could not open {size} connections ({name}) within "
                f"{open_timeout:g}s{_why_not(dsn, name)}"
            ) from exc
        except BaseException:
            pool.close()
            raise
    return pool


def _why_not(dsn: str, name: str) -> str:
    """What the server says to one more connection (e.g. "too many clients"), for the message
    of a pool that could not fill up; "" when it accepts it."""
    try:
        psycopg.connect(dsn, **_connect_kwargs(name)).close()
    except psycopg.Error as exc:
        return f": {describe(exc)}"
    return ""
