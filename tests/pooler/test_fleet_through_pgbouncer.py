"""Three daemons whose DSN points at PgBouncer in transaction mode drain a backlog, each run
executed exactly once (checked on a direct connection), with ``database.listen_dsn`` at a
direct connection for their LISTEN and without it (idle workers then poll)."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.conftest import Cluster, wait_for

RUNS = 3000


@pytest.mark.timeout(240)
@pytest.mark.parametrize("direct_listen", [False, True], ids=["polling", "listen_dsn"])
def test_three_daemons_through_pgbouncer_run_every_run_once(
    dsn: str, pooled_dsn: str, tmp_path: Path, direct_listen: bool
) -> None:
    cluster = Cluster(pooled_dsn, tmp_path)
    extra = "\n[database]\nprepared_statements = false\n"
    if direct_listen:
        extra += f"listen_dsn = '{dsn}'\n"
    try:
        config = cluster.config(extra, threads=4, prefetch=64, poll_interval="1s")
        daemons = [cluster.start(config) for _ in range(3)]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO pgtick.runs (job_type, payload) "
                "SELECT 'record', '{}' FROM generate_series(1, %s)",
                [RUNS],
            )

            def succeeded() -> int:
                row = conn.execute(
                    "SELECT count(*) FROM pgtick.runs WHERE status = 'succeeded'"
                ).fetchone()
                assert row is not None
                return int(row[0])

            wait_for(lambda: succeeded() == RUNS, 180, interval=0.5, what="all drained")
            for daemon in daemons:
                daemon.signal(signal.SIGTERM)
                assert daemon.wait(60) == 0
            attempts = conn.execute(
                "SELECT count(*) FILTER (WHERE outcome = 'succeeded'), "
                "count(*) FILTER (WHERE outcome IS DISTINCT FROM 'succeeded' "
                "AND outcome <> 'released') FROM pgtick.attempts"
            ).fetchone()
        assert attempts == (RUNS, 0)
        executions = cluster.executions()
        assert len(executions) == RUNS and set(executions.values()) == {1}
        for daemon in daemons:
            assert "does not exist" not in daemon.log()
            # Without listen_dsn the daemon notices the pooler and says so once; with it, never.
            said = [e for e in daemon.events() if e.get("event") == "notifications_unavailable"]
            assert len(said) == (0 if direct_listen else 1), said
            if said:
                assert said[0]["message"].startswith("notifications unavailable: database.dsn")
    finally:
        cluster.stop_all()
