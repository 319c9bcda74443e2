"""One database outage, told once (observability/outage.py): the first failure, a line each
time the outage's length doubles, one when every loop that failed got through again; a
statement that failed on a reachable database is left to its loop."""

from __future__ import annotations

import logging

import pytest
from structlog.testing import capture_logs

from pgtick.errors import DatabaseError
from pgtick.observability.outage import DatabaseOutage, PoolWarnings

LOST = DatabaseError(
    "claim: OperationalError: connection failed\n\tIs the server running?", unreachable=True
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_20s_outage_of_five_loops_is_seven_lines() -> None:
    clock = Clock()
    outage = DatabaseOutage(clock)
    loops = ("claim", "heartbeat", "reap", "tick", "listen")
    with capture_logs() as logs:
        for step in range(100):  # 20 s, every loop failing every 0.2 s
            clock.now = step * 0.2
            for loop in loops:
                assert outage.failed(loop, LOST, 0.2)
        for loop in loops[:-1]:
            outage.succeeded(loop)
        assert outage.down  # the listener has not got through yet
        outage.succeeded("listen")
    events = [e["event"] for e in logs]
    assert events[0] == "database_unreachable"
    assert logs[0]["error"] == "claim: OperationalError: connection failed"  # one line
    # after 1, 2, 4, 8 and 16 s
    assert events[1:-1] == ["database_still_down"] * 5
    downs = [e["down_seconds"] for e in logs[1:-1]]
    assert downs == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0], abs=0.25)  # 0.2 s steps
    assert all(e["retry_in"] == 0.2 and e["failures"] > 1 for e in logs[1:-1])
    assert logs[-1]["event"] == "database_back" and logs[-1]["failures"] == 500
    assert not outage.down


def test_a_statement_refused_by_a_reachable_database_is_not_an_outage() -> None:
    outage = DatabaseOutage(Clock())
    with capture_logs() as logs:
        assert not outage.failed("claim", DatabaseError("claim: QueryCanceled: timeout"))
    assert logs == [] and not outage.down


def test_the_pools_warnings_count_into_the_outage() -> None:
    outage = DatabaseOutage(Clock())
    quiet = PoolWarnings(outage)

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("psycopg.pool", logging.WARNING, "", 0, message, None, None)

    with capture_logs() as logs:
        assert quiet.filter(record("discarding closed connection: <conn>"))  # not down yet
        assert not quiet.filter(record("error connecting in 'pgtick': connection failed: x"))
        assert not quiet.filter(record("discarding closed connection: <conn>"))
    assert [e["event"] for e in logs] == ["database_unreachable"]
    assert logs[0]["operation"] == "connect"


def test_connections_the_pool_finds_broken_are_one_outage_not_a_line_each() -> None:
    """A checkout that finds a broken connection has the pool check every idle one
    (storage/db.py): after a restart that is every connection, each a warning of psycopg's."""
    outage = DatabaseOutage(Clock())
    quiet = PoolWarnings(outage)

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("psycopg.pool", logging.WARNING, "", 0, message, None, None)

    with capture_logs() as logs:
        for _ in range(13):
            assert not quiet.filter(record("discarding broken connection: <conn>"))
        outage.succeeded("claim")
    assert [e["event"] for e in logs] == ["database_unreachable", "database_back"]
    assert logs[0]["error"].startswith("a pooled connection was broken")
