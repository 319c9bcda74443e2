"""Metrics and health against a real PostgreSQL: the shared job-type read model, a live
``pgtick run`` scraped over HTTP, and the endpoint's behaviour with the database gone."""

from __future__ import annotations

import pytest

from pgtick import db
from pgtick.store import JobTypeStats, NewRun, RunStore


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
