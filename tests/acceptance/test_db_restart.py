"""Issue 3 "Must show" 4: PostgreSQL restarted under a busy daemon, down for longer than the
lease, so that the leases the daemon holds expire while it cannot renew them."""

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgtick.embedded import EmbeddedPostgres
from tests.dbhelp import NewRun, Runs, connect, migrate

from .conftest import Cluster, Daemon, wait_for

RUNS = 3000
LEASE_SECONDS = 3.0


# What the daemon logs when a database operation fails.
# One outage is told once (observability/outage.py): its first failure, whichever loop met it.
FAILURES = {"database_unreachable"}


def _noticed(daemon: Daemon) -> bool:
    return any(e.get("event") in FAILURES for e in daemon.events())


@pytest.mark.timeout(180)
def test_database_down_longer_than_the_lease_under_a_busy_daemon(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    """Runs held when the server went away are finished once or reaped and run again, never
    two copies at once; none is lost and none is left running after a clean stop."""
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE DATABASE restart")
    dsn = make_conninfo(own_server.dsn, dbname="restart")
    migrate(dsn)
    cluster = Cluster(dsn, tmp_path)
    try:
        config = cluster.config(heartbeat="1s", lease=f"{LEASE_SECONDS:g}s", reaper="1s")
        daemon = cluster.start(config)
        Runs(dsn).enqueue_many([NewRun("span", {"sleep": 0.01}) for _ in range(RUNS)])
        wait_for(lambda: len(cluster.executions()) > 300, 30, what="work under way")

        own_server.stop("fast")  # every connection is cut
        stopped_at = time.monotonic()
        # Down for longer than the lease: every lease held when it went away expires.
        wait_for(
            lambda: _noticed(daemon) and time.monotonic() - stopped_at > LEASE_SECONDS + 1,
            30,
            0.2,
            "the daemon to see an outage longer than the lease",
        )
        assert daemon.proc.poll() is None, "the daemon rides out the outage"
        own_server.start()

        def all_done() -> bool:
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pgtick.runs WHERE status = 'succeeded'"
                ).fetchone()
            return row == (RUNS,)

        wait_for(all_done, 90, 0.5, "every run succeeded")
        assert daemon.proc.poll() is None, "the daemon kept running"
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0

        with connect(dsn) as conn:
            statuses = conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall()
            attempts = conn.execute(
                "SELECT run_id, attempt, outcome FROM attempts ORDER BY run_id, attempt"
            ).fetchall()
            workers = conn.execute("SELECT count(*) FROM workers").fetchone()
        assert statuses == [("succeeded", RUNS)], "none lost, none left running"
        assert workers == (0,)

        # Every run: exactly one succeeded attempt, its last; the others were lost (reaped
        # while the daemon could not renew the lease) or failed.
        by_run: dict[int, list[tuple[int, str | None]]] = defaultdict(list)
        for run_id, attempt, outcome in attempts:
            by_run[run_id].append((attempt, outcome))
        assert len(by_run) == RUNS
        for run_id, rows in by_run.items():
            outcomes = [outcome for _, outcome in rows]
            assert outcomes[-1] == "succeeded", (run_id, rows)
            assert set(outcomes[:-1]) <= {"lost", "failed"}, (run_id, rows)
            assert [attempt for attempt, _ in rows] == list(range(1, len(rows) + 1)), rows

        # What the handlers did: the succeeded attempt is one that really ran, and two
        # executions of one run never overlapped in time.
        spans: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
        for r in cluster.records():
            spans[(r["run_id"], r["attempt"])][r["event"]] = r["t"]
        succeeded = {(run_id, rows[-1][0]) for run_id, rows in by_run.items()}
        assert succeeded <= {key for key, span in spans.items() if "end" in span}
        executions: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for (run_id, _), span in spans.items():
            executions[run_id].append((span["run"], span.get("end", float("inf"))))
        for run_id, runs in executions.items():
            runs.sort()
            for (_, end), (start, _) in itertools.pairwise(runs):
                assert end <= start, f"run {run_id} ran twice at once: {runs}"
            assert len(runs) <= len(by_run[run_id])
        events = {e.get("event") for e in daemon.events()}
        assert {"database_unreachable", "database_back"} <= events, "saw the outage end"
    finally:
        cluster.stop_all()
