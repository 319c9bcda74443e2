"""Creating a partition of a runs table does not hold up the finishes routed to it. The
partition gets the foreign key to schedules, which takes a lock on schedules that waits for
any transaction writing them (the ticker's); the maintenance step once took the parent's
ACCESS EXCLUSIVE lock first, so every run finishing into that parent waited too, up to the
step's lock_timeout (migration 0012). Since 0020 no step waits in a lock's queue (NOWAIT),
and a partition ahead is attached without the parent's ACCESS EXCLUSIVE lock at all."""

from __future__ import annotations

import threading

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


def _backend_waited_on_a_lock(conn: db.Connection, pid: int, until: threading.Thread) -> bool:
    """Whether backend ``pid`` was seen waiting on a lock before ``until`` ended."""
    while until.is_alive():
        row = conn.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        if row and row[0]:
            return True
    return False


def _finish(finisher: psycopg.Connection[object]) -> None:
    """A run finishing into runs_succeeded (its partition of now), as a finish routes it."""
    finisher.execute(
        "INSERT INTO runs (job_type, status, attempts, finished_at)"
        " VALUES ('mail', 'succeeded', 1, now())"
    )


def test_a_step_never_waits_for_schedules_in_front_of_a_finish(
    dsn: str, conn: db.Connection
) -> None:
    """A step that cannot have the schedules lock (the ticker writing) is busy at once
    (migration 0020: NOWAIT), never queued in front of a finish (0012: it queued, but no
    longer behind the parent's lock)."""
    with (
        dbhelp.connect(dsn, "pgtick") as ticker,
        dbhelp.connect(dsn, "pgtick") as maintainer,
        dbhelp.connect(dsn, "pgtick") as finisher,
    ):
        ticker.execute("BEGIN")
        ticker.execute("LOCK TABLE schedules IN ROW EXCLUSIVE MODE")  # a write in progress
        step: list[tuple[str, str, str]] = []
        thread = threading.Thread(
            target=lambda: step.extend(
                maintainer.execute(
                    STEP, [Jsonb({"succeeded": 3600}), 86400.0, OTHER_PARENTS]
                ).fetchall()
            )
        )
        thread.start()
        waited = _backend_waited_on_a_lock(conn, maintainer.info.backend_pid, thread)
        thread.join()
        finisher.execute("SET lock_timeout = '20ms'")
        _finish(finisher)
        ticker.execute("ROLLBACK")
    assert not waited, "the maintenance step waited in a lock's queue"
    # It gave up on the lock it could not get, to create the partition later.
    assert [(action, parent) for action, parent, _ in step] == [("busy", "runs_succeeded")]
    created = conn.execute(STEP, [Jsonb({"succeeded": 3600}), 86400.0, OTHER_PARENTS]).fetchall()
    assert [(action, parent) for action, parent, _ in created] == [("created", "runs_succeeded")]


def test_a_partition_ahead_is_made_while_the_parent_is_read_and_runs_finish(
    dsn: str, conn: db.Connection
) -> None:
    """Issue 44, item 2: `pgtick prune` held finishes over 100 ms on a loaded machine. A step
    that creates a partition ahead takes no lock a reader or a writer of rows waits for (0020:
    it attaches a table of its own), so it is made while a reader holds the parent, and runs
    finish meanwhile without waiting; before, the step queued for the parent's ACCESS
    EXCLUSIVE lock behind the reader, every finish queued behind the step, and the step gave
    up (busy) after its lock_timeout."""
    retention = Jsonb({"succeeded": 3600})
    # The partitions of now first (those take the parent's lock: see 0020), 30 minutes ahead.
    while conn.execute(STEP, [retention, 1800.0, OTHER_PARENTS]).fetchall():
        pass
    errors: list[str] = []
    step: list[tuple[str, str, str]] = []
    with (
        dbhelp.connect(dsn, "pgtick") as reader,
        dbhelp.connect(dsn, "pgtick") as maintainer,
        dbhelp.connect(dsn, "pgtick") as finisher,
    ):
        reader.execute("BEGIN")
        reader.execute("LOCK TABLE ONLY runs_succeeded IN ACCESS SHARE MODE")  # a query of it
        finisher.execute("SET lock_timeout = '20ms'")
        thread = threading.Thread(
            target=lambda: step.extend(
                maintainer.execute(STEP, [retention, 86400.0, OTHER_PARENTS]).fetchall()
            )
        )
        thread.start()
        while thread.is_alive():
            try:
                _finish(finisher)
            except psycopg.errors.LockNotAvailable as exc:
                errors.append(str(exc))
        thread.join()
        reader.execute("ROLLBACK")
    assert errors == [], "a finish waited on the partition maintenance's lock"
    assert [(action, parent) for action, parent, _ in step] == [("created", "runs_succeeded")]
