"""Daemons with the default config (``database.prepared_statements`` unset, or ``true`` as
config.example.toml writes it) whose DSN points at PgBouncer in transaction mode. The default
kept server-side preparing on behind the pooler the daemon had itself detected (it logged
``notifications_unavailable``): claims and a result write failed with
``DuplicatePreparedStatement`` / ``InvalidSqlStatementName``. A detected pooler now turns
preparing off, said once at start naming the key."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.conftest import Cluster, wait_for

RUNS = 600
# What a prepared statement landing on the wrong server connection logs.
PREPARE_ERRORS = ("DuplicatePreparedStatement", "InvalidSqlStatementName", "_pg3_")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "database",
    ["", "\n[database]\nprepared_statements = true\n"],
    ids=["unset", "true_as_in_the_example"],
)
def test_three_daemons_with_the_default_config_through_pgbouncer_run_every_run_once(
    dsn: str, pooled_dsn: str, tmp_path: Path, database: str
) -> None:
    cluster = Cluster(pooled_dsn, tmp_path)
    try:
        config = cluster.config(database, threads=4, prefetch=64, poll_interval="1s")
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

            wait_for(lambda: succeeded() == RUNS, 120, interval=0.5, what="all drained")
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
            log = daemon.log()
            for error in PREPARE_ERRORS:
                assert error not in log, log
            said = [e for e in daemon.events() if e.get("event") == "prepared_statements_off"]
            assert len(said) == 1, said
            assert "database.prepared_statements" in said[0]["message"]
    finally:
        cluster.stop_all()


@pytest.mark.timeout(60)
def test_prepared_statements_false_through_pgbouncer_says_nothing(
    pooled_dsn: str, tmp_path: Path
) -> None:
    cluster = Cluster(pooled_dsn, tmp_path)
    try:
        daemon = cluster.start(cluster.config("\n[database]\nprepared_statements = false\n"))
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        assert not [e for e in daemon.events() if e.get("event") == "prepared_statements_off"]
    finally:
        cluster.stop_all()


@pytest.mark.timeout(60)
def test_a_direct_connection_keeps_preparing_and_says_nothing(dsn: str, tmp_path: Path) -> None:
    cluster = Cluster(dsn, tmp_path)
    try:
        daemon = cluster.start(cluster.config())
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        assert not [e for e in daemon.events() if e.get("event") == "prepared_statements_off"]
    finally:
        cluster.stop_all()
