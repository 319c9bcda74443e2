"""The statements of the hot path (claim, next-due probe, succeed, fail, heartbeat) cost what
their batch costs while another session holds a snapshot: each finds its rows by the ids it
was given or by the claim index from the claimer's bound, never by walking runs_live, where
the held snapshot keeps a dead version of every run claimed and finished since (and, until
migration 0013 wrote each attempt once, attempts_open). Under a pin, ANALYZE sees such a
table nearly empty (a few live rows in many pages), and the planner was free to read the
whole attempts_open index for a batch of ten (the finish grew linearly with the pin, ``bench
queue-health --pin 900``: 0.3 -> 25 ms a call), to scan attempts_open for each finished
run, to read the id index from end to end as
the outer side of the claim's join, and the lease index for the heartbeat's
``status = 'running'`` (caught with auto_explain under ``bench queue-health``). Each plan is
taken as the daemon sends the statement (after planner_hints, base.by_index): planned for
the values, and as a prepared statement's generic plan."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtick.storage import db, sqlfile
from pgtick.storage.store import ClaimType, Failure, Lease, NewRun, RunStore
from tests.integration import plans

NOOP = [ClaimType("noop", 60.0, 10)]
HISTORY = 20000  # runs claimed and finished under the pin: dead versions kept by it
BATCH = 10
# A lookup by id reads a few pages per run; the plan this test guards against read one page
# per dead version (about HISTORY of them).
MAX_BUFFERS = 60 * BATCH
_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")


@pytest.fixture
def pin(dsn: str) -> Iterator[None]:
    """A session holding a REPEATABLE READ snapshot on a table pgtick never reads."""
    with psycopg.connect(dsn) as session:
        session.execute("CREATE TEMPORARY TABLE unrelated_report (n int)")
        session.commit()
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT count(*) FROM unrelated_report").fetchone()
        yield
        session.rollback()


def most_buffers(
    conn: db.Connection, name: str, params: dict[str, Any], *, generic: bool
) -> tuple[int, str]:
    """The largest buffer count of any node of ``name``'s plan, run and rolled back: planned
    for these values, or (``generic``) as a prepared statement's generic plan, which is what
    a daemon runs once psycopg has prepared the statement (its sixth execution on)."""
    text = sqlfile.query(name, conn.schema).as_string(conn)
    with conn.transaction(force_rollback=True):
        conn.execute(sqlfile.query("planner_hints", conn.schema))
        if generic:
            names, numbered = plans.numbered(text)
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE held_snapshot_probe AS {numbered}")
            values = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
            statement = sql.SQL(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE held_snapshot_probe({})"
            ).format(values)
            try:
                plan = "\n".join(row[0] for row in conn.execute(statement))
            finally:
                conn.execute("DEALLOCATE held_snapshot_probe")
        else:
            explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ") + sql.SQL(text)
            plan = "\n".join(row[0] for row in conn.execute(explain, params))
    executed = plan.split("\nPlanning:")[0]  # the planner's own catalog reads left out
    counts = [int(h or 0) + int(r or 0) for h, r in _BUFFERS.findall(executed)]
    return max(counts), plan


def test_hot_path_reads_only_its_batch_while_a_snapshot_is_held(
    store: RunStore, conn: db.Connection, pin: None
) -> None:
    store.enqueue_many([NewRun("noop") for _ in range(HISTORY)])
    while claimed := store.claim("w", NOOP, 500):
        store.finish("w", [(r.id, r.attempt) for r in claimed], [])
    store.enqueue_many([NewRun("noop") for _ in range(2 * BATCH)])
    held = store.claim("w", NOOP, BATCH)
    assert len(held) == BATCH
    # What autovacuum does meanwhile, with a batch running and one queued: it can remove
    # nothing, and its statistics show a few live rows in tables of thousands of versions.
    conn.execute("VACUUM (ANALYZE) runs_live")
    dead = conn.execute(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'runs_live'"
    ).fetchone()
    assert dead is not None and dead[0] >= HISTORY  # the snapshot keeps every old version
    low = min(r.run_at for r in held)  # the claimer's bound: past every run consumed
    ids = [r.id for r in held]
    attempts = [r.attempt for r in held]
    claims = {"worker_id": "w", "ids": ids, "attempts": attempts, "results": None}
    failures = [Failure(r.id, r.attempt, "boom", "ValueError", "detail", 5.0) for r in held]
    types = {"job_types": ["noop"], "leases": [60.0], "max_attempts": [10]}
    for name, params in [
        (
            "claim",
            types
            | {"worker_id": "w", "lows": [low], "looks": [False], "look_froms": [None]}
            | {"limit": BATCH},
        ),
        ("next_due", {"job_types": ["noop"], "lows": [low]}),
        ("succeed", claims),
        ("heartbeat", claims | {"leases": [60.0] * BATCH}),
        (
            "fail",
            claims
            | {
                "errors": [f.error for f in failures],
                "error_types": [f.error_type for f in failures],
                "details": [f.detail for f in failures],
                "delays": [f.retry_in_seconds for f in failures],
            },
        ),
    ]:
        for generic in (False, True):
            buffers, plan = most_buffers(conn, name, params, generic=generic)
            assert buffers <= MAX_BUFFERS, f"{name} (generic {generic}): {buffers} buffers\n{plan}"

    # And the statements still do their work: renew, then finish every one.
    beat = store.heartbeat("w", [Lease(r.id, r.attempt, 60.0) for r in held])
    assert beat.held == set(ids)
    assert store.finish("w", [(r.id, r.attempt) for r in held], [])[0] == set(ids)
