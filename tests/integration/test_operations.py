"""operations.py over a real database: bulk changes in batches, prune per status."""

from __future__ import annotations

from pgtick import db, operations
from pgtick.store import RunStore


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
