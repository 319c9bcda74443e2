"""Upgrade: the time ``pgtick migrate`` takes to bring an install at the schema before the
storage cut-over (migration 0010, runs partitioned) with ``--runs`` runs (1 000 000) to this
version, and that it keeps every row.

The install is seeded in bulk with SQL as that schema's daemons wrote it: runs in every state
(mostly succeeded and dead, as a history kept for weeks is), an attempt for every run that
started, an idempotency key on a tenth of them, output for a hundredth. ``migrate`` runs as
an operator runs it (``python -m pgtick migrate --force``; --force because the cut-over
refuses while daemons heartbeat, and the seed registers none, so it only says what the
operator does). Before and after, per state: how many runs, the sum of their ids and of their
attempts, and the attempts and output rows: the same, or the part fails.

The old schema can only be had from the migration runner (``pgtick.storage.migrate`` with the
files before 0010), the one place this part reaches past the public surface.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from pgtick.storage import migrate

DEFAULT_RUNS = 1_000_000
CUT_OVER = "0010"
# The seed's runs by state, per 1 000 runs.
MIX = (
    ("queued", 10),
    ("running", 1),
    ("failed", 5),
    ("succeeded", 850),
    ("dead", 100),
    ("cancelled", 20),
    ("skipped", 14),
)
SEED_RUNS = """
INSERT INTO runs (job_type, payload, idempotency_key, status, run_at, attempts, max_attempts,
                  locked_by, locked_until, last_error, error_type, started_at, finished_at,
                  created_at, updated_at)
SELECT 'job' || g %% 7, jsonb_build_object('n', g),
       CASE WHEN g %% 10 = 0 THEN 'key-' || g END,
       s.status, t, CASE WHEN s.status IN ('queued', 'skipped') THEN 0 ELSE 1 END, 3,
       CASE WHEN s.status = 'running' THEN 'old-daemon' END,
       CASE WHEN s.status = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN s.status IN ('failed', 'dead') THEN 'boom' END,
       CASE WHEN s.status IN ('failed', 'dead') THEN 'RuntimeError' END,
       CASE WHEN s.status NOT IN ('queued', 'skipped') THEN t END,
       CASE WHEN s.status IN ('succeeded', 'dead', 'cancelled', 'skipped')
            THEN t + interval '1 second' END,
       t, t
FROM generate_series(1, %(runs)s) g
CROSS JOIN LATERAL (SELECT now() - interval '14 days' * (1 - g::float8 / %(runs)s) AS t) AS w
JOIN (SELECT status, sum(n) OVER (ORDER BY ord) - n AS lo, sum(n) OVER (ORDER BY ord) AS hi
      FROM unnest(%(statuses)s::text[], %(counts)s::int[]) WITH ORDINALITY AS m(status, n, ord)
     ) AS s ON g %% 1000 >= s.lo AND g %% 1000 < s.hi
"""
SEED_ATTEMPTS = """
INSERT INTO attempts (run_id, attempt, worker_id, started_at, finished_at, outcome, error,
                      error_type)
SELECT id, 1, 'old-daemon', started_at,
       CASE WHEN status <> 'running' THEN started_at + interval '1 second' END,
       CASE status WHEN 'succeeded' THEN 'succeeded' WHEN 'running' THEN NULL
                   WHEN 'cancelled' THEN 'lost' ELSE 'failed' END,
       last_error, error_type
FROM runs WHERE started_at IS NOT NULL
"""
SEED_OUTPUT = """
INSERT INTO output_chunks (run_id, attempt, attempt_started_at, seq, lines)
SELECT id, 1, started_at, 0, '[[0, "stdout", "hello"]]'
FROM runs WHERE started_at IS NOT NULL AND id % 100 = 0
"""
CENSUS = """
SELECT status, count(*), sum(id), sum(attempts), count(idempotency_key)
FROM runs GROUP BY status ORDER BY status
"""
ROW_COUNTS = "SELECT (SELECT count(*) FROM attempts), (SELECT count(*) FROM output_chunks)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help=f"runs in the install ({DEFAULT_RUNS})"
    )


def check(args: argparse.Namespace) -> None:
    if args.runs < 1000:
        raise common.BenchError("--runs must be at least 1000", 2)


def census(dsn: str) -> dict[str, Any]:
    with common.connect(dsn) as conn:
        return {
            "runs": [list(row) for row in conn.execute(CENSUS).fetchall()],
            "attempts_output": list(common.one(conn, ROW_COUNTS)),
        }


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    record.options = {"runs": args.runs}
    with common.fresh_database(admin_dsn, "upgrade", pgtick_schema=False) as dsn:
        shipped = migrate.available
        before_cut = [m for m in shipped() if m.version < CUT_OVER]
        migrate.available = lambda: before_cut
        try:
            migrate.migrate(dsn, "pgtick")
        finally:
            migrate.available = shipped
        started = time.monotonic()
        with common.connect(dsn) as conn:
            conn.execute(
                SEED_RUNS,
                {
                    "runs": args.runs,
                    "statuses": [s for s, _ in MIX],
                    "counts": [n for _, n in MIX],
                },
            )
            conn.execute(SEED_ATTEMPTS)
            conn.execute(SEED_OUTPUT)
            conn.execute("VACUUM ANALYZE")
        seeded_in = time.monotonic() - started
        before = census(dsn)
        print(f"seeded {args.runs:,} runs in {seeded_in:.0f} s; migrating", flush=True)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pgtick", "migrate", "--force"],
            capture_output=True,
            text=True,
            env={**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""},
            check=False,
        )
        elapsed = time.monotonic() - started
        if done.returncode != 0:
            raise common.BenchError(f"migrate failed: {common.tail(done.stderr)}", 1)
        after = census(dsn)
    kept = before == after
    result = {
        "runs": args.runs,
        "attempts": before["attempts_output"][0],
        "output_chunks": before["attempts_output"][1],
        "migrate_seconds": round(elapsed, 1),
        "runs_per_second": round(args.runs / elapsed),
        "rows_kept": kept,
    }
    record.results = result
    print(
        common.table(
            ["runs", "attempts", "output", "migrate s", "runs/s", "every row kept"],
            [
                [
                    f"{args.runs:,}",
                    f"{result['attempts']:,}",
                    f"{result['output_chunks']:,}",
                    result["migrate_seconds"],
                    f"{result['runs_per_second']:,}",
                    "yes" if kept else "NO",
                ]
            ],
        )
    )
    if not kept:
        raise common.BenchError(f"rows differ: before {before}, after {after}", 1)
