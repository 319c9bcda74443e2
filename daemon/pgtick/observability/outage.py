"""One daemon's database outage, told once: every loop (claim, heartbeat, reaper, ticker,
listener, completer) and psycopg's pool fail together when the database goes away, and each
used to log every retry (issue 44: some 110 warnings, many of them multi-line, for a 20-second
outage). Now the first failure is logged (``database_unreachable``, the error's first line),
then a ``database_still_down`` line with the count and the next retry each time the outage's
length doubles (1, 2, 4, ... s, then every ``STILL_DOWN_MAX_EVERY_SECONDS``), and one
``database_back`` line with how long it lasted once every loop that failed has got through
again (a loop whose pool is still backing off keeps the outage open: no back-and-down
flapping while they catch up). The per-operation counts stay in
``pgtick_db_errors_total``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import structlog

from pgtick.errors import DatabaseError

log = structlog.get_logger("pgtick.database")

STILL_DOWN_FIRST_AFTER_SECONDS = 1.0
STILL_DOWN_MAX_EVERY_SECONDS = 60.0
# psycopg's own warnings while the database is away: its pool's failed connection attempts
# (counted as failures) and the connections it throws away (only noise once we know).
POOL_CONNECT_FAILED = "error connecting in "
POOL_OPERATION = "connect"
# A connection found broken by the check every idle one gets once a checkout finds one
# (storage/db.py): a failure of the pool's, told once with the outage, not a line each.
POOL_BROKEN = "discarding broken connection"
POOL_BROKEN_ERROR = "a pooled connection was broken (the server restarted or ended it)"
CONSEQUENCES = ("discarding closed connection", "error ignored terminating")


def first_line(error: object) -> str:
    """An error as one line: psycopg's messages go on with hints over several."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0].strip()


class DatabaseOutage:
    """Whether this process reaches the database, fed by every loop's failures and successes;
    thread-safe, and a success while up costs one attribute read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._failures = 0
        self._failing: set[str] = set()  # the loops' operations not through yet
        self._retry_in: float | None = None  # the latest retry delay a loop gave
        self._next_line_after = 0.0  # seconds into the outage of the next still-down line

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, operation: str, error: object, retry_in: float | None = None) -> bool:
        """A database operation failed; ``retry_in``: when its loop tries again. False, and
        nothing told, for a statement that failed on a database in reach (the caller says
        that one itself)."""
        if isinstance(error, DatabaseError) and not error.unreachable:
            return False
        with self._lock:
            now = self._clock()
            self._failures += 1
            if operation != POOL_OPERATION:  # the pool never says it got through
                self._failing.add(operation)
            if retry_in is not None:
                self._retry_in = retry_in
            if self._down_since is None:
                self._down_since = now
                self._next_line_after = STILL_DOWN_FIRST_AFTER_SECONDS
                log.warning(
                    "database_unreachable",
                    operation=operation,
                    error=first_line(error),
                    retry_in=retry_in,
                )
                return True
            down_for = now - self._down_since
            if down_for < self._next_line_after:
                return True
            self._next_line_after = min(
                2 * self._next_line_after, down_for + STILL_DOWN_MAX_EVERY_SECONDS
            )
            log.warning(
                "database_still_down",
                failures=self._failures,
                down_seconds=round(down_for, 1),
                retry_in=self._retry_in,
                operation=operation,
                error=first_line(error),
                failing=sorted(self._failing),
            )
        return True

    def succeeded(self, operation: str) -> None:
        """A loop's database operation worked: the end of an outage once every loop that
        failed has said so."""
        if self._down_since is None:
            return
        with self._lock:
            self._failing.discard(operation)
            if self._down_since is None or self._failing:
                return
            down_for = self._clock() - self._down_since
            log.info("database_back", down_seconds=round(down_for, 1), failures=self._failures)
            self._down_since = None
            self._failures = 0


class PoolWarnings(logging.Filter):
    """psycopg's warnings told through ``outage``: a failed connection attempt of its pool is
    a failure like any loop's, and a connection it discards during an outage is not news."""

    def __init__(self, outage: DatabaseOutage) -> None:
        super().__init__()
        self._outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message.startswith(POOL_CONNECT_FAILED):
            self._outage.failed(POOL_OPERATION, message.partition(": ")[2] or message)
            return False
        if message.startswith(POOL_BROKEN):
            self._outage.failed(POOL_OPERATION, POOL_BROKEN_ERROR)
            return False
        return not (self._outage.down and message.startswith(CONSEQUENCES))


def tell_pool_warnings(outage: DatabaseOutage) -> None:
    """Route psycopg's and its pool's warnings through ``outage`` (``PoolWarnings``), in place
    of an earlier daemon's in this process."""
    for name in ("psycopg", "psycopg.pool"):
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, PoolWarnings)]:
            logger.removeFilter(old)
        logger.addFilter(PoolWarnings(outage))
