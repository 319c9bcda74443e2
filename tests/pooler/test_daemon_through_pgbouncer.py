"""A daemon whose DSN points at PgBouncer in transaction mode: SIGTERM drains it (short runs
finish, long ones are released, nothing left running), a SIGKILLed one's runs are recovered by
another daemon through the pooler, and the statement timeout that bounds the metrics' read
holds through the pooler (it also bounds a wait for a lock) without leaking onto the pooler's
server connections."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from pgtick.errors import DatabaseError
from pgtick.storage import db
from pgtick.storage.store import RunStore
from tests.acceptance.conftest import Cluster, left_behind, status_counts, wait_for
from tests.dbhelp import NewRun, Runs, connect

POOLED = "\n[database]\nprepared_statements = false\n"


@pytest.mark.timeout(120)
def test_sigterm_drains_a_daemon_through_pgbouncer(
    dsn: str, pooled_dsn: str, tmp_path: Path
) -> None:
    cluster = Cluster(pooled_dsn, tmp_path)
    try:
        daemon = cluster.start(cluster.config(POOLED, grace="3s", poll_interval="1s"))
        store = Runs(dsn)
        short = store.enqueue_many([NewRun("polite", {"seconds": 1.0}) for _ in range(4)])
        long = store.enqueue_many([NewRun("polite", {"seconds": 60}) for _ in range(2)])
        wait_for(lambda: len(cluster.executions()) == 6, 20, what="all six started")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
        with connect(dsn) as conn:
            rows = dict(conn.execute("SELECT id, status FROM runs").fetchall())
            assert {rows[i] for i in short} == {"succeeded"}
            assert {rows[i] for i in long} == {"queued"}  # released for another daemon
            outcomes = conn.execute(
                "SELECT outcome FROM attempts WHERE run_id = ANY(%s)", [long]
            ).fetchall()
            assert outcomes == [("released",), ("released",)]
            assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)
        assert "does not exist" not in daemon.log()
    finally:
        cluster.stop_all()


@pytest.mark.timeout(120)
def test_a_sigkilled_daemons_runs_are_recovered_through_pgbouncer(
    dsn: str, pooled_dsn: str, tmp_path: Path
) -> None:
    cluster = Cluster(pooled_dsn, tmp_path)
    try:
        config = cluster.config(
            POOLED, threads=4, lease="3s", heartbeat="1s", reaper="1s", poll_interval="1s"
        )
        victim = cluster.start(config)
        store = Runs(dsn)
        ids = store.enqueue_many([NewRun("record", {"sleep": 2.0}) for _ in range(12)])
        wait_for(lambda: len(cluster.executions()) >= 4, 20, what="the victim at work")
        with connect(dsn) as conn:
            victim_ids = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM workers WHERE pid = ANY(%s)", [list(victim.family())]
                )
            ]
            held = {
                r[0]
                for r in conn.execute(
                    "SELECT id FROM runs WHERE status = 'running' AND locked_by = ANY(%s)",
                    [victim_ids],
                )
            }
            assert held
            for pid in victim.workers():  # the whole daemon (worker.processes above 1)
                os.kill(pid, signal.SIGKILL)
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            rescuer = cluster.start(config)
            wait_for(
                lambda: status_counts(conn) == {"succeeded": len(ids)}, 90, 0.2, "all succeeded"
            )
            # It went on claiming between the read above and the kill (a second worker
            # process starting up, say): what it left behind is read from its attempts.
            left = left_behind(conn, victim_ids, held)
            lost = conn.execute("SELECT run_id FROM attempts WHERE outcome = 'lost'").fetchall()
            assert sorted(r[0] for r in lost) == sorted(left)  # each once, and only those
        executions = cluster.executions()
        assert set(executions) == set(ids)
        assert {i for i, n in executions.items() if n > 1} <= left
        assert max(executions.values()) == 2
        rescuer.signal(signal.SIGTERM)
        assert rescuer.wait(20) == 0
    finally:
        cluster.stop_all()


def test_the_statement_timeout_holds_through_pgbouncer(dsn: str, pooled_dsn: str) -> None:
    pool = db.make_pool(pooled_dsn, "pgtick", size=2, name="pgtick-test-pooled")
    store = RunStore(pool)
    try:
        snap = store.metrics_snapshot({}, statement_timeout_seconds=0.5, pool_timeout_seconds=5)
        assert snap.dead_tuples  # it reads through the pooler
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE pgtick.runs IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(DatabaseError, match="statement timeout"):
                store.metrics_snapshot({}, statement_timeout_seconds=0.5, pool_timeout_seconds=5)
            assert time.monotonic() - started < 3.0
            locker.rollback()
        # The timeout was the transaction's own: the server connections keep their defaults.
        for _ in range(4):
            with psycopg.connect(pooled_dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
                ).fetchone()
                assert row == ("0", "0")
        assert store.metrics_snapshot(
            {}, statement_timeout_seconds=0.5, pool_timeout_seconds=5
        ).dead_tuples
    finally:
        pool.close()
