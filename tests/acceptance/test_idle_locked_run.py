"""An idle daemon does not spin while a due run is row-locked by another transaction (an
application's SELECT ... FOR UPDATE, an operator's session): the idle probe (next_due) says
"due now", the claim skips the locked row (SKIP LOCKED) and finds nothing, and the loop
probed and claimed again at once, some 2 000-2 900 transactions a second. It now waits,
doubling the wait up to the poll interval, as after a claim a limit held back."""

from __future__ import annotations

import time

import psycopg

from tests import dbhelp
from tests.acceptance.conftest import Cluster, wait_for


def _xacts(conn: dbhelp.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database"
        " WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _rate(conn: dbhelp.Connection, seconds: float) -> float:
    before = _xacts(conn)
    time.sleep(seconds)
    time.sleep(1.2)  # stats are flushed at most once a second
    after = _xacts(conn)
    time.sleep(1.2)
    settle = _xacts(conn)  # what the 1.2 s wait itself added
    return (after - before - (settle - after)) / seconds


def test_an_idle_daemon_does_not_spin_on_a_due_run_another_session_holds(
    dsn: str, conn: dbhelp.Connection, cluster: Cluster
) -> None:
    cluster.start(cluster.config(poll_interval="1s"))
    time.sleep(2.0)
    idle = _rate(conn, 3.0)
    [(held,)] = conn.execute(
        "SELECT enqueue('record', '{}', now() + interval '1 second')"
    ).fetchall()
    with psycopg.connect(dsn) as other:
        other.execute("SELECT id FROM pgtick.runs WHERE id = %s FOR UPDATE", [held])
        time.sleep(1.5)  # due now, and locked
        # The first window after the lock counted some 40 transactions a second with the
        # daemon stopped (SIGSTOP): not the daemon's. The second is the one judged.
        _rate(conn, 3.0)
        locked = _rate(conn, 3.0)
        other.rollback()
    wait_for(lambda: held in cluster.executions(), 10, what="the held run to run")
    assert locked < max(20.0, 5 * idle), (
        f"transactions per second: {idle:.1f} idle, {locked:.1f} while one due run is locked"
    )
