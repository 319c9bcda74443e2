"""The store's reads behind the metrics and `pgtick status` on a real PostgreSQL: the shared
job-type read model on the database clock, which due occurrences started, and query plans that
read runs only through partial indexes. (Moved from tests/acceptance/test_metrics.py, which now
drives only the public surface.)"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from pgtick.storage import db, sqlfile
from pgtick.storage.store import JobTypeStats, NewRun, RunStore
from tests.integration import plans


def test_job_type_stats_counts_each_state_on_the_database_clock(
    store: RunStore, conn: db.Connection
) -> None:
    due_a = store.enqueue(NewRun("a"))
    store.enqueue(NewRun("a"))
    store.enqueue(NewRun("b"))
    conn.execute("UPDATE runs SET run_at = now() - interval '90 seconds' WHERE id = %s", [due_a])
    store.enqueue(NewRun("a", run_at=store.now().replace(year=2100)))  # scheduled
    # running with a live lease, running with an expired one, failed awaiting retry, failed due
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, locked_by, locked_until, started_at)"
        " VALUES ('b', 'running', 1, 'w', now() + interval '1 minute', now()),"
        "        ('b', 'running', 1, 'w', now() - interval '1 second', now()),"
        "        ('b', 'failed', 1, NULL, NULL, NULL)"
    )
    conn.execute(
        "INSERT INTO runs (job_type, status, run_at, attempts)"
        " VALUES ('b', 'failed', now() + interval '1 hour', 1)"
    )
    # dead: one recent, one older than a day (not counted); a succeeded run (never counted)
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at)"
        " VALUES ('c', 'dead', now() - interval '1 hour'),"
        "        ('c', 'dead', now() - interval '25 hours'),"
        "        ('c', 'succeeded', now())"
    )
    stats = {s.job_type: s for s in store.job_type_stats()}
    assert list(stats) == ["a", "b", "c"]
    a = stats["a"]
    assert (a.due, a.scheduled, a.running, a.stuck, a.awaiting_retry, a.dead_recent) == (
        2,
        1,
        0,
        0,
        0,
        0,
    )
    assert a.oldest_due_seconds == pytest.approx(90, abs=5)
    b = stats["b"]
    assert (b.due, b.scheduled, b.running, b.stuck, b.awaiting_retry, b.dead_recent) == (
        2,
        0,
        2,
        1,
        1,
        0,
    )
    assert stats["c"] == JobTypeStats("c", 0, None, 0, 0, 0, 0, 1)


def test_metrics_snapshot_says_which_due_occurrences_started(
    store: RunStore, conn: db.Connection
) -> None:
    """Started, skipped or cancelled counts as handled; queued or missing does not; an
    occurrence from before the schedule existed is not asked about."""
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, created_at) VALUES"
        " ('started', 'a', '* * * * *', now() - interval '1 day'),"
        " ('skipped', 'a', '* * * * *', now() - interval '1 day'),"
        " ('waiting', 'a', '* * * * *', now() - interval '1 day'),"
        " ('missing', 'a', '* * * * *', now() - interval '1 day'),"
        " ('new', 'a', '* * * * *', now())"
    )
    due = store.now().replace(second=0, microsecond=0) - timedelta(hours=1)
    conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, status, started_at, finished_at)"
        " SELECT id, %(due)s, 'a', st, CASE WHEN st = 'succeeded' THEN now() END,"
        "        CASE WHEN st <> 'queued' THEN now() END"
        " FROM schedules JOIN (VALUES ('started', 'succeeded'), ('skipped', 'skipped'),"
        "                             ('waiting', 'queued')) AS v(n, st) ON v.n = name",
        {"due": due},
    )
    snap = store.metrics_snapshot(
        {"started": due, "skipped": due, "waiting": due, "missing": due, "new": due},
        statement_timeout_seconds=5,
        pool_timeout_seconds=5,
    )
    started = {s.name: s.due_started for s in snap.schedules}
    assert started == {
        "started": True,
        "skipped": True,
        "waiting": False,
        "missing": False,
        "new": None,
    }
    last = {s.name: s.last_success_at for s in snap.schedules}
    assert last["started"] is not None and last["skipped"] is None


@pytest.mark.parametrize("query", ["metrics_snapshot", "job_type_stats"])
def test_observability_queries_read_runs_only_through_partial_indexes(
    conn: db.Connection, query: str
) -> None:
    """Their cost must not grow with the finished rows a big table keeps."""
    conn.execute("INSERT INTO schedules (name, job_type, cron) VALUES ('s', 'a', '* * * * *')")
    conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, status, finished_at)"
        " SELECT CASE WHEN i % 10 = 0 THEN (SELECT id FROM schedules) END,"
        "        now() - i * interval '1 second', 't' || i % 5,"
        "        (ARRAY['succeeded', 'dead', 'cancelled', 'skipped'])[1 + i % 4],"
        "        now() - i * interval '1 second'"
        " FROM generate_series(1, 50000) i"
    )
    conn.execute("INSERT INTO runs (job_type) SELECT 't' || i % 5 FROM generate_series(1, 500) i")
    conn.execute("ANALYZE runs")
    params = {
        "names": ["s"],
        "due_at": [datetime.now(UTC) - timedelta(minutes=1)],
        "schema": conn.schema,
    }
    statement = sqlfile.query(query, conn.schema).as_string(conn)
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))
    plan = plans.readable(conn, plan)
    # The finished runs are in partitions these statements do not read (the live partition
    # holds the 500 unfinished ones, read as the planner likes), but for the dead runs of the
    # last 24 hours that `pgtick status` counts: all of the test's dead runs.
    assert not re.search(r"Scan on runs_(succeeded|cancelled|skipped)", plan), plan
    for line in plan.splitlines():
        assert "Scan on runs_dead" not in line or query == "job_type_stats", plan


# -- a live `pgtick run` -----------------------------------------------------------------------
