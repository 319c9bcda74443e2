"""operations.py over a real database: bulk changes in batches, prune per status."""

from __future__ import annotations

import threading
import time

from structlog.testing import capture_logs

from pgtick.config import RetentionConfig
from pgtick.core.reaper import Reaper, prune_interval
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations
from tests.integration import partitions


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


def test_daemon_retention_deletes_the_rows_no_partition_covers_after_their_own_age(
    store: RunStore, conn: db.Connection
) -> None:
    """Runs that finished before any partition covered their time (here: before the first
    retention pass; in life, rows written while none could be created) are in the DEFAULT
    partitions: Reaper.prune_once deletes those past [retention], per terminal status, with
    their attempts, and leaves active runs."""
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, finished_at)"
        " SELECT 'email', s, 1, now() - d * interval '1 hour'"
        " FROM unnest(ARRAY['succeeded', 'dead', 'cancelled', 'skipped']) s,"
        "      unnest(ARRAY[1, 5, 30]) d"
    )
    conn.execute("INSERT INTO runs (job_type) VALUES ('email')")
    conn.execute(
        "INSERT INTO attempts_history (run_id, attempt, worker_id, finished_at, outcome)"
        " SELECT id, 1, 'w', finished_at,"
        "        CASE WHEN status = 'succeeded' THEN 'succeeded' ELSE 'failed' END"
        " FROM runs WHERE finished_at IS NOT NULL"
    )
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
    # The attempts of the runs left, no more.
    attempts = conn.execute(
        "SELECT outcome, count(*) FROM attempts GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert attempts == [("failed", 4), ("succeeded", 1)]
    assert reaper.prune_once() == 0


def test_retention_drops_whole_partitions_and_deletes_no_row(
    store: RunStore, conn: db.Connection
) -> None:
    """Issue 18: terminal runs, their attempts and their output go by dropping the partitions
    whose rows are all past the retention: no row is deleted (no dead tuple for vacuum), and
    the partitions the rows of the next half hour go to exist before they are needed."""
    for parent in ("runs_succeeded", "attempts_succeeded", "output_chunks"):
        partitions.past(conn, parent, (30, 29))
        partitions.past(conn, parent, (2, 1))
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, finished_at)"
        " SELECT 'email', 'succeeded', 1, date_trunc('hour', now()) - d * interval '1 hour'"
        "        + g * interval '1 second'"
        " FROM unnest(ARRAY[30, 2]) d, generate_series(1, 500) g"
    )
    conn.execute(
        "INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,"
        " outcome) SELECT id, 1, 'w', finished_at, finished_at, 'succeeded' FROM runs"
    )
    conn.execute(
        "INSERT INTO output_chunks (run_id, attempt, attempt_started_at, seq, lines)"
        " SELECT id, 1, finished_at, 0, '[]' FROM runs"
    )
    retention = RetentionConfig(24 * 3600.0, 24 * 3600.0, 24 * 3600.0, 24 * 3600.0)
    reaper = Reaper(store, {}, 10.0, 20.0, retention, Metrics([], "test", 1))
    with capture_logs() as logs:
        assert reaper.prune_once() == 500
    dropped = sorted(e["table"] for e in logs if e["event"] == "partition_dropped")
    assert dropped == [
        "attempts_succeeded_past_30",
        "output_chunks_past_30",
        "runs_succeeded_past_30",
    ]
    assert [e["count"] for e in logs if e["event"] == "runs_pruned"] == [500]
    for table in ("runs", "attempts", "output_chunks"):
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row == (500,), table
    # Dropped, not deleted: no row went through the DEFAULT partitions' DELETE.
    assert not [e for e in logs if e["event"] == "partition_deleted"]
    # The next half hour has its partitions (a day's retention: 6-hour periods).
    covered = conn.execute(
        "SELECT max(to_at) >= now() + interval '30 minutes' FROM partitions"
        " WHERE parent = 'runs_succeeded'"
    ).fetchone()
    assert covered == (True,)
    with capture_logs() as again:
        assert reaper.prune_once() == 0
    assert not [e for e in again if e["event"] == "partition_dropped"]


def test_a_short_retention_is_pruned_every_eighth_of_it(
    store: RunStore, conn: db.Connection
) -> None:
    """With a 2-minute retention the daemon prunes every 15 s, not every 5 minutes: the
    table then holds about 2 minutes of runs, not up to 7 (bench soak: steady size)."""
    short = RetentionConfig(succeeded_seconds=120)
    assert prune_interval(short) == 15
    assert prune_interval(RetentionConfig()) == 300  # days of retention: every 5 minutes
    assert prune_interval(RetentionConfig(succeeded_seconds=30)) == 10  # never more often
    reaper = Reaper(
        store, {}, 0.05, 20.0, RetentionConfig(succeeded_seconds=80), Metrics([], "test", 1)
    )
    assert reaper.prune_every == 10
    old_run = (
        "INSERT INTO runs (job_type, status, attempts, finished_at)"
        " VALUES ('email', 'succeeded', 1, now() - interval '1 hour')"
    )
    conn.execute(old_run)
    # The daemon's start runs the first pass (it creates the partitions finished runs go to)...
    assert reaper.prune_once() == 1
    assert partitions.count(conn) > 0
    thread = threading.Thread(target=reaper.run)
    thread.start()
    try:
        conn.execute(old_run)
        started = time.monotonic()
        # ... the reaper the next one an interval later.
        time.sleep(5)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        while conn.execute("SELECT count(*) FROM runs").fetchone() != (0,):
            assert time.monotonic() - started < 20, "not pruned within twice its interval"
            time.sleep(0.1)
    finally:
        reaper.stop_event.set()
        thread.join(10)
