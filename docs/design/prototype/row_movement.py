"""What happens to a session waiting on a run's row lock when the holder moves the row to
another partition (a finish under in-place partitioning: `runs` LIST-partitioned by status),
and, for comparison, when the holder deletes it (design H's finish: DELETE from the queue,
INSERT into the history). Not part of the package; run from the repository's venv:

    .venv/bin/python docs/design/prototype/row_movement.py

It starts a throwaway embedded PostgreSQL (pgtick.embedded) and prints one line per case.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import psycopg

from pgtick.embedded import EmbeddedPostgres

SCHEMA = """
CREATE TABLE t (id bigint PRIMARY KEY, status text NOT NULL, locked_until timestamptz);
CREATE TABLE p (id bigint NOT NULL, status text NOT NULL, finished_at timestamptz,
                locked_until timestamptz) PARTITION BY LIST (status);
CREATE TABLE p_live PARTITION OF p FOR VALUES IN ('queued', 'running', 'failed');
CREATE TABLE p_done PARTITION OF p FOR VALUES IN ('succeeded', 'dead', 'cancelled', 'skipped')
    PARTITION BY RANGE (finished_at);
CREATE TABLE p_done_default PARTITION OF p_done DEFAULT;
"""

CASES = [
    # (what, the holder's statement, the waiter's statement)
    ("partitioned: a heartbeat UPDATE waits for a finish that moves the row",
     "UPDATE p SET status = 'succeeded', finished_at = now() WHERE id = 1",
     "UPDATE p SET locked_until = now() WHERE id = ANY('{1,2}') AND status = 'running' "
     "RETURNING id"),
    ("partitioned: FOR UPDATE waits for the move",
     "UPDATE p SET status = 'succeeded', finished_at = now() WHERE id = 1",
     "SELECT id FROM p WHERE id = 1 AND status = 'running' FOR UPDATE"),
    ("partitioned: FOR UPDATE SKIP LOCKED while the move is uncommitted",
     "UPDATE p SET status = 'succeeded', finished_at = now() WHERE id = 1",
     "SELECT id FROM p WHERE id = 1 AND status = 'running' FOR UPDATE SKIP LOCKED"),
    ("one table: a heartbeat UPDATE waits for a finish that deletes the row",
     "DELETE FROM t WHERE id = 1",
     "UPDATE t SET locked_until = now() WHERE id = ANY('{1,2}') AND status = 'running' "
     "RETURNING id"),
]


def main() -> None:
    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="row-movement-")), throwaway=True)
    try:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            print(admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            admin.execute(SCHEMA)
            for what, holder_sql, waiter_sql in CASES:
                admin.execute("TRUNCATE t, p")
                admin.execute("INSERT INTO t VALUES (1, 'running', now()), (2, 'running', now())")
                admin.execute("INSERT INTO p VALUES (1, 'running', NULL, now()), "
                              "(2, 'running', NULL, now())")
                print(f"{what}: {race(server.dsn, holder_sql, waiter_sql)}")
    finally:
        server.close()


def race(dsn: str, holder_sql: str, waiter_sql: str) -> str:
    """The waiter's outcome when it blocks on (or skips) the holder's row lock."""
    outcome: dict[str, str] = {}

    def wait() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as waiter:
                outcome["got"] = f"rows {waiter.execute(waiter_sql).fetchall()}"
        except psycopg.Error as exc:
            outcome["got"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"

    with psycopg.connect(dsn) as holder:
        holder.execute(holder_sql)
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # the waiter is blocked on the row lock (or has skipped it)
        holder.commit()
        waiter.join()
    return outcome["got"]


if __name__ == "__main__":
    main()
