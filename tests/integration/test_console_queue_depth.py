"""The overview's queue depth per job type, rebuilt from runs and attempts by one query: a known
history (runs due at known minutes, started, released, retried, cancelled later) gives exactly
the depth it should at every minute of the last hour, and the query reads through indexes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from psycopg import sql

from pgtick.errors import DatabaseError
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.operations import charts
from tests.integration import plans

MINUTES = 60

# Every instant sits half a minute off the per-minute sample points (now - m minutes), so the
# seconds between building the history and reading it never move a wait across a sample.
# (job_type, status, run_at, created_at, scheduled_for, finished_at, attempts as
# (started_at, finished_at, outcome)), times as minutes from now (negative: ago).
History = tuple[
    str,
    str,
    float,
    float,
    float | None,
    float | None,
    list[tuple[float, float | None, str | None]],
]
HISTORY: list[History] = [
    # A: due 10.5 min ago, never started: waiting at minutes 0..10
    ("mail", "queued", -10.5, -10.5, None, None, []),
    # B: due 20.5 min ago, started 15.5 min ago: minutes 16..20
    ("mail", "succeeded", -20.5, -20.5, None, -15.0, [(-15.5, -15.0, "succeeded")]),
    # C: failed, its retry due in half an hour: the backoff is not a wait; its first wait
    # (ad-hoc, run_at since overwritten) is not known: nothing
    ("mail", "failed", 30.0, -30.5, None, None, [(-25.5, -25.0, "failed")]),
    # D: failed 35 min ago, retry due 5.5 min ago, not started: minutes 0..5
    ("mail", "failed", -5.5, -40.5, None, None, [(-35.5, -35.0, "failed")]),
    # E: due 8.5 min ago, running since 3.5 min ago: minutes 4..8
    ("mail", "running", -8.5, -8.5, None, None, [(-3.5, None, None)]),
    # F: a scheduled run (occurrence 58.5 min ago, materialized 70 min ago) that failed, was
    # retried from 50.5 min ago, failed again and went dead: minutes 56..58 and 46..50
    (
        "mail",
        "dead",
        -50.5,
        -70.0,
        -58.5,
        -45.0,
        [(-55.5, -55.0, "failed"), (-45.5, -45.0, "failed")],
    ),
    # G: due 12.5 min ago, started 11.5 ago, released 9.5 ago (due again at once), started
    # again 7.5 ago: minutes 12, then 8..9
    ("mail", "running", -12.5, -12.5, None, None, [(-11.5, -9.5, "released"), (-7.5, None, None)]),
    # H: due 6.5 min ago, cancelled 2.5 min ago while waiting: minutes 3..6
    ("mail", "cancelled", -6.5, -6.5, None, -2.5, []),
    # K: due 30.5 min ago but created 1.5 min ago (a catch-up): minutes 0..1
    ("mail", "queued", -30.5, -1.5, None, None, []),
    # N: due 4.5 min ago, started 2.5 ago, cancelled 1.5 ago while running (let go 1 min ago):
    # minutes 3..4, and no wait after the cancel
    ("mail", "cancelled", -4.5, -4.5, None, -1.5, [(-2.5, -1.0, "lost")]),
    # Outside the window or not due: nothing
    ("mail", "succeeded", -180.0, -180.0, None, -120.0, [(-150.0, -120.0, "succeeded")]),
    ("mail", "queued", 10.0, -1.0, None, None, []),
    # another job type: released 18.5 min ago (due again at once), started 16.5 ago, failed,
    # its retry due half a minute ago: minutes 17..18 and 0; its first wait (ad-hoc, run_at
    # since overwritten) is not known
    (
        "push",
        "failed",
        -0.5,
        -20.5,
        None,
        None,
        [(-19.5, -18.5, "released"), (-16.5, -16.0, "failed")],
    ),
    # and one waiting for three hours: every minute
    ("sync", "queued", -180.5, -180.5, None, None, []),
]
# minutes ago -> runs of "mail" waiting then (A..N above); every other minute 0
MAIL_DEPTH = {0: 3, 1: 3, 2: 2, 3: 4, 4: 5, 5: 4, 6: 3, 7: 2, 8: 3, 9: 2, 10: 1, 12: 1}
MAIL_DEPTH.update({m: 1 for m in (*range(16, 21), *range(46, 51), *range(56, 59))})


def _build(conn: db.Connection, history: list[History]) -> None:
    """Insert the history in one transaction, so every offset is from the same now()."""
    with conn.transaction():
        conn.execute(
            """
            WITH h AS (
                SELECT ordinality AS n, e->>0 AS job_type, e->>1 AS status,
                       now() + make_interval(secs => (e->>2)::float8 * 60) AS run_at,
                       now() + make_interval(secs => (e->>3)::float8 * 60) AS created_at,
                       now() + make_interval(secs => (e->>4)::float8 * 60) AS scheduled_for,
                       now() + make_interval(secs => (e->>5)::float8 * 60) AS finished_at,
                       e->6 AS attempts
                FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS x(e, ordinality)
            ), inserted AS (
                INSERT INTO runs (job_type, status, run_at, created_at, scheduled_for,
                                  finished_at, attempts, max_attempts, locked_by, locked_until,
                                  started_at)
                SELECT job_type, status, run_at, created_at, scheduled_for, finished_at,
                       jsonb_array_length(attempts), 3,
                       CASE WHEN status = 'running' THEN 'w:1:a' END,
                       CASE WHEN status = 'running' THEN now() + interval '1 minute' END,
                       -- A running run's open attempt is its row (migration 0013); every
                       -- run ever claimed keeps its last claim's time.
                       CASE WHEN jsonb_array_length(attempts) > 0
                            THEN now() + make_interval(secs => (attempts->-1->>0)::float8 * 60)
                       END
                FROM h ORDER BY n
                RETURNING id
            ), numbered AS (
                SELECT id, row_number() OVER (ORDER BY id) AS n FROM inserted
            )
            INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome)
            SELECT i.id, a.ordinality, 'w:1:a',
                   now() + make_interval(secs => (a.e->>0)::float8 * 60),
                   now() + make_interval(secs => (a.e->>1)::float8 * 60), a.e->>2
            FROM numbered i
            JOIN h ON h.n = i.n
            CROSS JOIN LATERAL jsonb_array_elements(h.attempts) WITH ORDINALITY AS a(e, ordinality)
            WHERE a.e->>2 IS NOT NULL
            """,
            (json.dumps(history),),
        )


def _oldest_first(by_minutes_ago: dict[int, int]) -> list[int]:
    return [by_minutes_ago.get(m, 0) for m in range(MINUTES - 1, -1, -1)]


def test_queue_depth_per_minute_from_a_known_history(store: RunStore, conn: db.Connection) -> None:
    _build(conn, HISTORY)
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (12,)
    with store.reading("console", statement_timeout_seconds=2, pool_timeout_seconds=2) as reader:
        depth = charts.queue_depth_per_type(reader, MINUTES)
        ov = operations.overview(reader, heartbeat_seconds=20)
    assert set(depth) == {"mail", "push", "sync"}
    assert depth["mail"] == _oldest_first(MAIL_DEPTH)
    assert depth["push"] == _oldest_first({0: 1, 17: 1, 18: 1})
    assert depth["sync"] == [1] * MINUTES
    assert ov.queue_depth_per_type == depth
    # now's depth is what the queues table shows as due
    due = {t.stats.job_type: t.stats.due for t in ov.job_types}
    assert due == {"mail": depth["mail"][-1], "push": 1, "sync": 1}


def test_queue_depth_is_the_same_from_any_reader_and_empty_without_waits(
    store: RunStore, conn: db.Connection
) -> None:
    assert charts.queue_depth_per_type(store, MINUTES) == {}
    # a run never due in the window, one finished long ago: still nothing
    _build(conn, [HISTORY[2], HISTORY[10], HISTORY[11]])
    assert charts.queue_depth_per_type(store, MINUTES) == {}
    _build(conn, [HISTORY[0]])
    first = charts.queue_depth_per_type(store, MINUTES)
    assert first == {"mail": _oldest_first(dict.fromkeys(range(11), 1))}
    assert charts.queue_depth_per_type(store, MINUTES) == first


def test_queue_depth_out_of_time_leaves_the_rest_of_the_overview(
    store: RunStore, conn: db.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A depth read that outlives the page's statement timeout is rolled back to its savepoint:
    the overview shows every other part, and the depth as not available."""
    _build(conn, HISTORY)
    slow = sql.SQL("SELECT 'mail', 0, 1 FROM pg_sleep(%(minutes)s)")
    monkeypatch.setattr(charts, "_query", lambda name, schema: slow)
    with store.reading("console", statement_timeout_seconds=0.5, pool_timeout_seconds=2) as reader:
        with pytest.raises(DatabaseError, match="QueryCanceled"):
            charts.queue_depth_per_type(reader, 2)
        ov = operations.overview(reader, heartbeat_seconds=20)
    assert ov.queue_depth_per_type is None
    assert ov.finished_per_type is not None and ov.succeeded_per_minute is not None
    assert {t.stats.job_type for t in ov.job_types} == {"mail", "push", "sync"}


def test_queue_depth_reads_through_indexes(conn: db.Connection) -> None:
    """With sequential scans priced out, the plan uses none: every table has an index path
    (the active rows' partial index, runs_finished_idx, attempts_run_idx per run)."""
    _build(conn, HISTORY)
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        statement = b"EXPLAIN " + charts._query("queue_depth_per_type_minute", "pgtick").as_bytes(
            None
        )
        plan = "\n".join(row[0] for row in conn.execute(statement, {"minutes": MINUTES}))
        plan = plans.readable(conn, plan)
    assert "Seq Scan" not in plan, plan
    # The finished runs' partitions through runs_finished_idx (the small ones' scans are left
    # out of the readable plan, their conditions stay).
    assert "attempts_run_idx" in plan and "finished_at > (now()" in plan, plan


def _attempt_probes(conn: db.Connection) -> dict[str, int]:
    """Per partition of attempts_history the depth query read, the times it was probed
    (EXPLAIN ANALYZE's loops of its scans; 0: pruned, never executed)."""
    statement = b"EXPLAIN (ANALYZE, FORMAT JSON) " + charts._query(
        "queue_depth_per_type_minute", "pgtick"
    ).as_bytes(None)
    row = conn.execute(statement, {"minutes": MINUTES}).fetchone()
    assert row is not None
    probes: dict[str, int] = {}

    def walk(node: dict[str, Any]) -> None:
        relation = node.get("Relation Name")
        if isinstance(relation, str) and relation.startswith("attempts_"):
            probes[relation] = max(probes.get(relation, 0), int(node.get("Actual Loops", 0)))
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return probes


def test_queue_depth_probes_attempts_of_claimed_runs_only_and_not_older_partitions(
    conn: db.Connection,
) -> None:
    """A backlog of runs never claimed costs no probe of attempts (it grew with the backlog: 10
    000 queued runs took 200 ms at 1 M runs), and a partition of attempts that ended before the
    runs existed is pruned, not probed once per run."""
    conn.execute(
        "CREATE TABLE attempts_ended_old PARTITION OF attempts_ended"
        " FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')"
    )
    _build(conn, HISTORY + [("mail", "queued", -1.5, -1.5, None, None, [])] * 500)
    claimed = conn.execute(
        "SELECT count(*) FROM runs WHERE started_at IS NOT NULL AND (status IN"
        " ('queued', 'running', 'failed') OR finished_at > now() - interval '1 hour')"
    ).fetchone()
    assert claimed is not None and 0 < claimed[0] <= 10
    probes = _attempt_probes(conn)
    assert probes.get("attempts_ended_old") == 0, probes
    assert 0 < max(probes.values()) <= claimed[0], probes
