"""operations.py over a real database: bulk changes in batches, prune per status."""

from __future__ import annotations

import threading
import time

import pytest
from structlog.testing import capture_logs

from pgtick.config import RetentionConfig
from pgtick.core import reaper as reaper_mod
from pgtick.core.reaper import Reaper, prune_interval
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations


def test_bulk_retry_runs_in_batches_and_touches_only_its_runs(
    store: RunStore, conn: db.Connection
) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, max_attempts, finished_at)"
        " SELECT CASE WHEN g % 4 = 0 THEN 'other' ELSE 'email' END, 'dead', 2, 2, now()"
        " FROM generate_series(1, 40) g"
    )
    bulk, count = operations.plan_bulk(store, operations.RETRY, "dead", "email", None)
    assert count == 30
    assert operations.run_bulk(store, bulk, batch=7) == 30
    counts = dict(
        conn.execute("SELECT job_type || ':' || status, count(*) FROM runs GROUP BY 1").fetchall()
    )
    assert counts == {"email:queued": 30, "other:dead": 10}
    # A retried run that had used up its attempts gets one more.
    assert conn.execute(
        "SELECT DISTINCT max_attempts FROM runs WHERE job_type = 'email'"
    ).fetchall() == [(3,)]
    assert operations.run_bulk(store, bulk, batch=7) == 0


def test_daemon_retention_prunes_each_status_after_its_own_age(
    store: RunStore, conn: db.Connection
) -> None:
    """Reaper.prune_once applies [retention] per terminal status and leaves active runs."""
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, finished_at)"
        " SELECT 'email', s, 1, now() - d * interval '1 hour'"
        " FROM unnest(ARRAY['succeeded', 'dead', 'cancelled', 'skipped']) s,"
        "      unnest(ARRAY[1, 5, 30]) d"
    )
    conn.execute("INSERT INTO runs (job_type) VALUES ('email')")
    conn.execute("INSERT INTO attempts (run_id, attempt, worker_id) SELECT id, 1, 'w' FROM runs")
    retention = RetentionConfig(
        succeeded_seconds=2 * 3600,
        dead_seconds=24 * 3600,
        cancelled_seconds=10 * 3600,
        skipped_seconds=0.5 * 3600,
    )
    reaper = Reaper(store, {}, 10.0, 20.0, retention, Metrics([], "test", 1))
    assert reaper.prune_once() == 2 + 1 + 1 + 3
    left = conn.execute(
        "SELECT status, array_agg(round(extract(epoch FROM now() - finished_at) / 3600)::int"
        " ORDER BY finished_at DESC) FROM runs GROUP BY status ORDER BY status"
    ).fetchall()
    assert left == [
        ("cancelled", [1, 5]),
        ("dead", [1, 5]),
        ("queued", [None]),
        ("succeeded", [1]),
    ]
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (6,)
    assert reaper.prune_once() == 0


def test_a_long_retention_pass_logs_its_progress_and_a_short_one_does_not(
    store: RunStore, conn: db.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18: a retention pass longer than the progress period logs `progress` events
    (rows so far, rate) while it deletes; a pass within the period logs only its count."""
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at)"
        " SELECT 'email', 'succeeded', now() - interval '30 days' FROM generate_series(1, 2500)"
    )
    retention = RetentionConfig(86400.0, 86400.0, 86400.0, 86400.0)
    reaper = Reaper(store, {}, 10.0, 20.0, retention, Metrics([], "test", 1))
    with capture_logs() as quiet:
        assert reaper.prune_once() == 2500
    assert [e["event"] for e in quiet] == ["runs_pruned"]

    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at)"
        " SELECT 'email', 'dead', now() - interval '30 days' FROM generate_series(1, 2500)"
    )
    monkeypatch.setattr(reaper_mod, "PRUNE_PROGRESS_EVERY_SECONDS", 0.0)
    with capture_logs() as logs:
        assert reaper.prune_once() == 2500
    progress = [(e["what"], e["done"], e["final"]) for e in logs if e["event"] == "progress"]
    assert progress == [
        ("retention dead", 1000, False),
        ("retention dead", 2000, False),
        ("retention dead", 2500, False),
        ("retention dead", 2500, True),
    ]


def test_a_short_retention_is_pruned_every_eighth_of_it(
    store: RunStore, conn: db.Connection
) -> None:
    """With a 2-minute retention the daemon prunes every 15 s, not every 5 minutes: the
    table then holds about 2 minutes of runs, not up to 7 (bench soak: steady size)."""
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, finished_at)"
        " VALUES ('email', 'succeeded', 1, now() - interval '1 hour')"
    )
    short = RetentionConfig(succeeded_seconds=120)
    assert prune_interval(short) == 15
    assert prune_interval(RetentionConfig()) == 300  # days of retention: every 5 minutes
    assert prune_interval(RetentionConfig(succeeded_seconds=30)) == 10  # never more often
    reaper = Reaper(
        store, {}, 0.05, 20.0, RetentionConfig(succeeded_seconds=80), Metrics([], "test", 1)
    )
    assert reaper.prune_every == 10
    started = time.monotonic()
    thread = threading.Thread(target=reaper.run)
    thread.start()
    try:
        while conn.execute("SELECT count(*) FROM runs").fetchone() != (0,):
            assert time.monotonic() - started < 20, "not pruned within twice its interval"
            time.sleep(0.1)
        assert time.monotonic() - started >= 9.5  # the first prune waits one interval
    finally:
        reaper.stop_event.set()
        thread.join(10)
