"""The statements of the hot path that take runs by id read runs_live through runs_id_idx
whatever runs_live's statistics say, on every supported server.

When autovacuum or autoanalyze visits runs_live while the queue is empty (the usual state of a
queue that keeps up), its statistics say it holds no row, and PostgreSQL's estimate of every
index scan on it is its minimum: on 15, reading runs_job_type_id_idx (job_type, id) by its
second column alone, for `r.id = ANY(...)`, then costs exactly what reading runs_id_idx costs
(once both indexes hold some 50 pages), and the tie went to the former; 18 costs it lower
outright. The prepared statements' generic plans (planner_hints) keep such a plan until the
next re-plan. Before PostgreSQL 17 a B-tree scan bound on a later column only reads the whole
index once per value in the list: on 15 a finish of 10 runs read 1 543 pages of it where
runs_id_idx took 23 (20 000 runs since the last vacuum), and under `bench soak` (1 000 runs/s)
claims, finishes and heartbeats took up to 0.7, 0.5 and 1.7 s a call for a minute, which put
the daemon behind and its batches up to 256 runs; under a held snapshot the index, and every
lookup, grows with the time it is held. 18 skips through the index (skip scan) and the same
plan costs little there, which is why the embedded server never showed it.

runs_job_type_id_idx serves `pgtick runs --type T` (list_runs, planned with its values).
Partial on `job_type > ''` it still does, since `job_type = 'T'` implies the predicate, and a
statement that names no job type cannot read it. It still holds every run enqueue() accepts
(a job type of 1 to 200 characters); a row written by hand with an empty one is left out, and
a statement looking for '' does not read the index. (`job_type IS NOT NULL` would not do: any
join on job_type implies it, and flow control's count of held runs then read the whole index
as the rows of its predicate.)

Checked here in the states a queue leaves its statistics in: analyzed while empty after runs
went through (its pages and dead entries kept), and vacuumed while empty (truncated), then a
batch claimed; each statement as the daemon sends it (planner_hints, its generic plan).
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import sql

from pgtick.storage import db, sqlfile
from pgtick.storage.store import ClaimType, NewRun, RunStore
from tests.integration import plans

NOOP = [ClaimType("noop", 60.0, 10)]
HISTORY = 10000  # runs through runs_live first: an index of some 50 pages and more
BATCH = 20
AMBIGUOUS = "runs_live_job_type_id_idx"
_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")


def pass_through(store: RunStore, runs: int) -> None:
    """``runs`` runs enqueued, claimed and finished: the queue left empty."""
    store.enqueue_many([NewRun("noop") for _ in range(runs)])
    while claimed := store.claim("w", NOOP, 500):
        store.finish("w", [(r.id, r.attempt) for r in claimed], [])


def generic_plan(conn: db.Connection, name: str, params: dict[str, Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of ``name``'s generic plan after planner_hints, run and
    rolled back: what a daemon runs once psycopg has prepared the statement."""
    text = sqlfile.query(name, conn.schema).as_string(conn)
    names, numbered = plans.numbered(text)
    values = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
    with conn.transaction(force_rollback=True):
        conn.execute(sqlfile.query("planner_hints", conn.schema))
        conn.execute(f"PREPARE lookup_by_id AS {numbered}")
        try:
            statement = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE lookup_by_id({})")
            return "\n".join(row[0] for row in conn.execute(statement.format(values)))
        finally:
            conn.execute("DEALLOCATE lookup_by_id")


def hot_statements(held: list[Any]) -> dict[str, dict[str, Any]]:
    """Parameters of each statement that takes runs by id, for the runs ``held``."""
    n = len(held)
    claims = {
        "worker_id": "w",
        "ids": [r.id for r in held],
        "attempts": [r.attempt for r in held],
        "results": None,
    }
    low = {"lows": [min(r.run_at for r in held)], "looks": [False], "look_froms": [None]}
    return {
        "claim": plans.HOT_PATH["claim"] | low | {"limit": BATCH},
        "claim_limited": plans.HOT_PATH["claim_limited"] | low | {"limit": BATCH},
        "succeed": claims,
        "fail": claims
        | {"errors": ["boom"] * n, "error_types": ["E"] * n, "details": ["d"] * n}
        | {"delays": [5.0] * n},
        "release": claims | {"hold": 0.0},
        "acknowledge_cancel": claims,
        "heartbeat": claims | {"leases": [60.0] * n},
    }


def misreads(store: RunStore, conn: db.Connection) -> list[str]:
    """Claim a batch and plan each statement; those that read runs_live's runs by id through
    the (job_type, id) index, with the pages their plan read. The batch is let go of after."""
    store.enqueue_many([NewRun("noop") for _ in range(2 * BATCH)])
    held = store.claim("w", NOOP, BATCH)
    assert len(held) == BATCH
    found = []
    for name, params in hot_statements(held).items():
        plan = generic_plan(conn, name, params)
        if AMBIGUOUS in plan:
            pages = max(int(h or 0) + int(r or 0) for h, r in _BUFFERS.findall(plan))
            found.append(f"{name} ({pages} pages at most in one node):\n{plan}")
    store.finish("w", [(r.id, r.attempt) for r in held], [])
    pass_through(store, 0)  # and the rest of the batch
    return found


def reltuples(conn: db.Connection) -> float:
    row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'runs_live'::regclass")
    value = row.fetchone()
    assert value is not None
    return float(value[0])


def test_runs_are_taken_by_id_through_the_id_index_whatever_the_statistics(
    store: RunStore, conn: db.Connection
) -> None:
    pass_through(store, HISTORY)
    conn.execute("ANALYZE runs_live")  # autoanalyze finding the queue empty
    assert reltuples(conn) == 0
    analyzed = misreads(store, conn)
    pass_through(store, HISTORY)
    conn.execute("VACUUM (ANALYZE) runs_live")  # autovacuum finding it empty: truncated
    assert reltuples(conn) == 0
    vacuumed = misreads(store, conn)
    assert not analyzed, "analyzed while empty:\n" + "\n\n".join(analyzed)
    assert not vacuumed, "vacuumed while empty:\n" + "\n\n".join(vacuumed)


def test_runs_of_one_job_type_are_listed_through_the_type_index(conn: db.Connection) -> None:
    """What runs_job_type_id_idx is for (`pgtick runs --type T`), on every partition, the
    live one included: a statement that names the job type reads it."""
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at)"
        " SELECT CASE WHEN g % 1000 = 0 THEN 'rare' ELSE 'common' END, 'succeeded', now()"
        " FROM generate_series(1, 20000) g"
    )
    conn.execute(
        "INSERT INTO runs (job_type) SELECT CASE WHEN g % 100 = 0 THEN 'rare' ELSE 'common' END"
        " FROM generate_series(1, 5000) g"
    )
    conn.execute("ANALYZE runs")
    params = {"statuses": None, "job_type": "rare", "schedule": None, "since": None}
    text = sqlfile.query("list_runs", conn.schema).as_string(conn)
    plan = "\n".join(
        row[0]
        for row in conn.execute(
            "EXPLAIN (COSTS OFF) " + text, params | {"before": None, "limit": 51}
        )
    )
    assert re.search(r"(on|using) runs_live_job_type_id_idx\b", plan), plan
    assert re.search(r"(on|using) runs_succeeded_\w+_job_type_id_idx\b", plan), plan
