"""Creating a partition of a runs table does not hold up the finishes routed to it while it
waits for the schedules table. The partition gets the foreign key to schedules, which takes a
lock on schedules that waits for any transaction writing them (the ticker's); the
maintenance step once took the parent's ACCESS EXCLUSIVE lock first, so every run finishing
into that parent waited too, up to the step's lock_timeout (migration 0012)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgtick.storage import db
from tests import dbhelp

# Timing bars: run alone, after the parallel part of `make test` (docs/development.md).
pytestmark = pytest.mark.serial

OTHER_PARENTS = [
    "attempts_ended",
    "attempts_succeeded",
    "output_chunks",
    "runs_cancelled",
    "runs_dead",
    "runs_skipped",
]
STEP = "SELECT action, parent, table_name FROM maintain_partitions(%s, %s, %s)"


def _backend_waits_on_a_lock(conn: db.Connection, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return bool(row and row[0])


def test_a_finish_is_not_held_while_a_partition_waits_for_schedules(
    dsn: str, conn: db.Connection
) -> None:
    step: list[tuple[str, str, str]] = []
    with (
        dbhelp.connect(dsn, "pgtick") as ticker,
        dbhelp.connect(dsn, "pgtick") as maintainer,
        dbhelp.connect(dsn, "pgtick") as finisher,
    ):
        ticker.execute("BEGIN")
        ticker.execute("LOCK TABLE schedules IN ROW EXCLUSIVE MODE")  # a write in progress
        pid = maintainer.info.backend_pid

        def maintain() -> None:
            step.extend(
                maintainer.execute(
                    STEP, [Jsonb({"succeeded": 3600}), 86400.0, OTHER_PARENTS]
                ).fetchall()
            )

        thread = threading.Thread(target=maintain)
        thread.start()
        deadline = time.monotonic() + 5
        while not _backend_waits_on_a_lock(conn, pid):
            assert time.monotonic() < deadline, "the maintenance step never waited"
        # The step waits (for schedules): a run finishing into runs_succeeded goes through.
        finisher.execute("SET lock_timeout = '20ms'")
        try:
            finisher.execute(
                "INSERT INTO runs (job_type, status, attempts, finished_at)"
                " VALUES ('mail', 'succeeded', 1, now())"
            )
        except psycopg.errors.LockNotAvailable:
            pytest.fail("a finish waited on the partition maintenance's lock")
        finally:
            thread.join()
            ticker.execute("ROLLBACK")
    # It gave up on the lock it could not get (lock_timeout), to create the partition later.
    assert [(action, parent) for action, parent, _ in step] == [("busy", "runs_succeeded")]
    created = conn.execute(STEP, [Jsonb({"succeeded": 3600}), 86400.0, OTHER_PARENTS]).fetchall()
    assert [(action, parent) for action, parent, _ in created] == [("created", "runs_succeeded")]
