"""Cost of a run's claim and finish in three shapes of `runs`, unpinned: today's one table (A),
the table partitioned in place by status with the terminal partition by `finished_at` (P: the
finish is a cross-partition UPDATE; the claim's indexes only on the live partition, the
history's only on the terminal one), and a hot table plus a history table (H: the finish is a
DELETE ... RETURNING feeding an INSERT). Same columns and indexes as pgtick's `runs` where they
apply. Not part of the package; run from the repository's venv on an idle machine:

    .venv/bin/python docs/design/prototype/move_cost.py [--runs 100000] [--rounds 3]

It starts a throwaway embedded PostgreSQL (pgtick.embedded), and prints per shape and round the
wall time per run of claiming (batches of 64, FOR UPDATE SKIP LOCKED) and of finishing
(batches of 500), one client, statements prepared as the daemon's are by default.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from pgtick.embedded import EmbeddedPostgres

COLUMNS = """
    id bigint NOT NULL, schedule_id bigint, scheduled_for timestamptz, job_type text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}', idempotency_key text, status text NOT NULL,
    priority integer NOT NULL DEFAULT 0, concurrency_key text,
    run_at timestamptz NOT NULL DEFAULT now(), attempts integer NOT NULL DEFAULT 0,
    max_attempts integer, locked_by text, locked_until timestamptz, last_error text,
    error_type text, started_at timestamptz, finished_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now()
"""
HOT_INDEXES = """
CREATE INDEX ON {t} (job_type, priority DESC, run_at, id) WHERE status IN ('queued', 'failed');
CREATE INDEX ON {t} (locked_until) WHERE status = 'running';
CREATE INDEX ON {t} (job_type) WHERE locked_by IS NOT NULL;
CREATE INDEX ON {t} (schedule_id) WHERE status IN ('queued', 'running', 'failed');
"""
DONE_INDEXES = """
CREATE INDEX ON {t} (status, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX ON {t} (job_type, id);
CREATE INDEX ON {t} (schedule_id, finished_at) WHERE status = 'succeeded';
"""
SHAPES = {
    "A one table": f"""
        CREATE TABLE runs ({COLUMNS}, PRIMARY KEY (id));
        {HOT_INDEXES.format(t="runs")}{DONE_INDEXES.format(t="runs")}
    """,
    "P partitioned in place": f"""
        CREATE TABLE runs ({COLUMNS}) PARTITION BY LIST (status);
        CREATE TABLE runs_live PARTITION OF runs (PRIMARY KEY (id))
            FOR VALUES IN ('queued', 'running', 'failed');
        CREATE TABLE runs_succeeded PARTITION OF runs FOR VALUES IN ('succeeded')
            PARTITION BY RANGE (finished_at);
        CREATE TABLE runs_succeeded_today PARTITION OF runs_succeeded
            FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day');
        CREATE TABLE runs_succeeded_default PARTITION OF runs_succeeded DEFAULT;
        CREATE UNIQUE INDEX ON runs_succeeded_today (id);
        {HOT_INDEXES.format(t="runs_live")}{DONE_INDEXES.format(t="runs_succeeded")}
    """,
    "H hot table + history": f"""
        CREATE TABLE runs ({COLUMNS}, PRIMARY KEY (id));
        {HOT_INDEXES.format(t="runs")}
        CREATE TABLE history ({COLUMNS}) PARTITION BY RANGE (finished_at);
        CREATE TABLE history_today PARTITION OF history
            FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day');
        CREATE INDEX ON history (id);
        {DONE_INDEXES.format(t="history")}
    """,
}
CLAIM = """
WITH picked AS (
    SELECT id FROM runs WHERE job_type = 'noop' AND status IN ('queued', 'failed')
      AND priority = 0 AND run_at <= now()
    ORDER BY priority DESC, run_at, id LIMIT 64 FOR UPDATE SKIP LOCKED
)
UPDATE runs r SET status = 'running', locked_by = 'w', locked_until = now() + interval '60 s',
    attempts = r.attempts + 1, started_at = now(), updated_at = now()
FROM picked WHERE r.id = picked.id AND r.status IN ('queued', 'failed')
RETURNING r.id, r.attempts
"""
FINISH = {
    "A one table": """
        UPDATE runs SET status = 'succeeded', finished_at = now(), locked_by = NULL,
            locked_until = NULL, updated_at = now()
        WHERE id = ANY(%(ids)s) AND locked_by = 'w' AND status = 'running' RETURNING id""",
    "H hot table + history": """
        WITH gone AS (
            DELETE FROM runs WHERE id = ANY(%(ids)s) AND locked_by = 'w' AND status = 'running'
            RETURNING *
        )
        INSERT INTO history
        SELECT id, schedule_id, scheduled_for, job_type, payload, idempotency_key, 'succeeded',
               priority, concurrency_key, run_at, attempts, max_attempts, NULL, NULL,
               last_error, error_type, started_at, now(), created_at, now()
        FROM gone RETURNING id""",
}
FINISH["P partitioned in place"] = FINISH["A one table"]


def measure(dsn: str, shape: str, runs: int) -> tuple[float, float]:
    """Microseconds per run of claiming and of finishing ``runs`` runs in a fresh database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS m CASCADE")
        conn.execute("CREATE SCHEMA m")
        conn.execute("SET search_path = m")
        conn.execute(SHAPES[shape])
        conn.execute(
            "INSERT INTO runs (id, job_type, status, run_at) "
            "SELECT g, 'noop', 'queued', now() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, %s) g",
            [runs],
        )
        conn.execute("VACUUM ANALYZE")
        claimed: list[int] = []
        started = time.perf_counter()
        while len(claimed) < runs:
            got = conn.execute(CLAIM).fetchall()
            assert got, "the claim found nothing"
            claimed.extend(row[0] for row in got)
        claim_us = (time.perf_counter() - started) / runs * 1e6
        # Statistics of a table whose rows are now all running (not queued): without them the
        # finish's plan walks every running row per batch.
        conn.execute("ANALYZE")
        started = time.perf_counter()
        for i in range(0, runs, 500):
            done = conn.execute(FINISH[shape], {"ids": claimed[i : i + 500]}).fetchall()
            assert len(done) == len(claimed[i : i + 500])
        finish_us = (time.perf_counter() - started) / runs * 1e6
        left = conn.execute("SELECT count(*) FROM runs WHERE status <> 'succeeded'").fetchone()
        assert left == (0,)
        return claim_us, finish_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="move-cost-")), throwaway=True)
    results: dict[str, list[tuple[float, float]]] = {shape: [] for shape in SHAPES}
    try:
        for round_ in range(1, args.rounds + 1):
            for shape in SHAPES:
                claim_us, finish_us = measure(server.dsn, shape, args.runs)
                results[shape].append((claim_us, finish_us))
                print(f"round {round_} {shape}: claim {claim_us:.1f} us/run, "
                      f"finish {finish_us:.1f} us/run", flush=True)
    finally:
        server.close()
    print(f"\nmedian of {args.rounds} rounds, {args.runs} runs each:")
    for shape, rows in results.items():
        claim = statistics.median(r[0] for r in rows)
        finish = statistics.median(r[1] for r in rows)
        print(f"  {shape:24} claim {claim:6.1f} us/run  finish {finish:6.1f} us/run  "
              f"both {claim + finish:6.1f}")


if __name__ == "__main__":
    main()
