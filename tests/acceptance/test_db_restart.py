"""Issue 3 "Must show" 4: PostgreSQL restarted under a busy daemon."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgtick import db, migrate
from pgtick.embedded import EmbeddedPostgres
from pgtick.store import NewRun, RunStore

from .conftest import Cluster, wait_for

RUNS = 3000


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own: restarting the shared one would disturb other tests."""
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-restart-pg-"))
    server = EmbeddedPostgres(data_dir, throwaway=True)
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.timeout(180)
def test_database_restart_under_a_busy_daemon(own_server: EmbeddedPostgres, tmp_path: Path) -> None:
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE DATABASE restart")
    dsn = make_conninfo(own_server.dsn, dbname="restart")
    migrate.migrate(dsn, "pgtick")
    cluster = Cluster(dsn, tmp_path)
    try:
        daemon = cluster.start(cluster.config(heartbeat="1s", lease="30s"))
        pool = db.make_pool(dsn, "pgtick", size=1)
        RunStore(pool).enqueue_many([NewRun("record", {"sleep": 0.01}) for _ in range(RUNS)])
        pool.close()
        wait_for(lambda: len(cluster.executions()) > 300, 30, what="work under way")

        own_server.stop("fast")  # every connection is cut
        time.sleep(3)
        assert daemon.proc.poll() is None
        own_server.start()

        def all_done() -> bool:
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pgtick.runs WHERE status = 'succeeded'"
                ).fetchone()
            return row == (RUNS,)

        wait_for(all_done, 90, 0.5, "every run succeeded")
        assert daemon.proc.poll() is None, "the daemon kept running"
        executions = cluster.executions()
        assert len(executions) == RUNS
        assert set(executions.values()) == {1}, "no run executed twice"
        events = {e.get("event") for e in daemon.events()}
        assert events & {"claim_failed", "heartbeat_failed", "complete_failed"}, "saw the outage"
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    finally:
        cluster.stop_all()
