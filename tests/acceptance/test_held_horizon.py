"""Issue 18, "Must show" 4: the horizon-pin case as a test of behaviour. Another session holds a
REPEATABLE READ snapshot (on a table pgtick never reads) for the whole test, so no row version
pgtick deletes or updates meanwhile can be vacuumed away; a daemon must still claim, retry and
finish every run, each exactly once. How fast it stays under the pin is measured by
`bench queue-health`, not here."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from tests.dbhelp import Connection, NewRun, Runs

from .conftest import Cluster, wait_for

# Each wave is enqueued after the previous one finished, so later claims walk past the dead
# index entries of every run claimed before them (what a held horizon leaves behind).
WAVES = 3
RUNS_PER_WAVE = 400
RETRYING_RUNS = 10
_NOT_REMOVABLE = re.compile(r"(\d+) are dead but not yet removable")


@pytest.fixture
def pin(dsn: str) -> Iterator[Connection]:
    """A session holding a REPEATABLE READ snapshot, taken by reading an unrelated table."""
    with psycopg.connect(dsn) as session:  # not autocommit: the transaction stays open
        session.execute("CREATE TEMPORARY TABLE unrelated_report (n int)")
        session.commit()
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT count(*) FROM unrelated_report").fetchone()
        yield session
        session.rollback()


def held_xmin(conn: Connection, session: Connection) -> str:
    row = conn.execute(
        "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s", [session.info.backend_pid]
    ).fetchone()
    assert row is not None and row[0] is not None, "the pinning session holds no snapshot"
    return str(row[0])


def dead_not_removable(conn: Connection) -> int:
    """VACUUM runs' storage and return how many dead row versions it had to keep."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    tables = conn.execute(
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'pgtick' AND c.relkind = 'r'"
    ).fetchall()
    for (table,) in tables:
        conn.execute(f"VACUUM (VERBOSE) {table}")
    return sum(int(m) for notice in notices for m in _NOT_REMOVABLE.findall(notice))


@pytest.mark.timeout(240)
def test_daemon_claims_retries_and_finishes_runs_while_a_snapshot_is_held(
    cluster: Cluster, store: Runs, conn: Connection, pin: Connection
) -> None:
    xmin = held_xmin(conn, pin)
    cluster.start(cluster.config(lease="3s", heartbeat="1s", reaper="1s", poll_interval="1s"))
    retrying = [
        store.enqueue(NewRun("always_retry", {"after": 0}, max_attempts=3))
        for _ in range(RETRYING_RUNS)
    ]
    ids: list[int] = []
    for wave in range(WAVES):
        batch = store.enqueue_many(
            [NewRun("record", {"wave": wave, "n": i}) for i in range(RUNS_PER_WAVE)]
        )
        ids.extend(batch)
        wait_for(
            lambda b=frozenset(batch): b <= set(cluster.executions()),
            60,
            0.1,
            f"wave {wave} finished",
        )
    keyed = store.enqueue(NewRun("record", {"keyed": True}, idempotency_key="pinned-key"))
    assert store.enqueue(NewRun("record", {"again": True}, idempotency_key="pinned-key")) == keyed
    ids.append(keyed)

    def all_done() -> bool:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded' AND id = ANY(%s)),"
            " count(*) FILTER (WHERE status = 'dead' AND id = ANY(%s))"
            " FROM runs",
            [ids, retrying],
        ).fetchone()
        return row == (len(ids), len(retrying))

    wait_for(all_done, 60, 0.1, "every run finished")
    executions = cluster.executions()
    assert {i: executions[i] for i in ids} == dict.fromkeys(ids, 1)
    assert {i: executions[i] for i in retrying} == dict.fromkeys(retrying, 3)
    outcomes = conn.execute(
        "SELECT outcome, count(*) FROM attempts WHERE run_id = ANY(%s) GROUP BY outcome",
        [ids + retrying],
    ).fetchall()
    assert dict(outcomes) == {"succeeded": len(ids), "failed": 3 * len(retrying)}
    # The horizon really was held throughout: the same snapshot, which sees none of the runs,
    # and vacuum had to keep the dead versions the daemon left behind.
    assert held_xmin(conn, pin) == xmin
    seen = pin.execute("SELECT count(*) FROM pgtick.runs WHERE id = ANY(%s)", [ids]).fetchone()
    assert seen == (0,)
    assert dead_not_removable(conn) > 0
