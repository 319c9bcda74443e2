"""A claim that reaches a run another daemon claimed and finished after the claim's snapshot
was taken, a heartbeat that reaches a run its own daemon's result writer finished after the
beat's snapshot, and a reaper that reaches an expired lease whose holder finished the run
after the reaper's snapshot. The finish moved the row out of runs_live (runs is partitioned
by status), and PostgreSQL fails the row lock with SQLSTATE 40001 instead of skipping the
row. In a fleet it happened a few times a second (4 claimers draining 20 000 runs: 6 failed
claims in 5 s, each a `claim_failed` warning, a database-error count and a retry delay), and
two beats in three of a daemon holding 2 000 runs while its writer finished them 20 at a time
(a lease the beats fail to renew for its whole length expires). The store claims, beats and
reaps again: no error, and each returns what it would have."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgtick.errors import DatabaseError
from pgtick.storage import db
from pgtick.storage.store import ClaimType, Lease, NewRun, RunStore

JOB = ClaimType("mail", 60.0, 2)
# Runs an open transaction inserts ahead of the one the claim can take, due earlier: the
# claim's scan reads their index entries (invisible to it) before it reaches that run, which
# leaves the time to move the run meanwhile.
INVISIBLE = 300_000
RACE_TRIES = 5


def _started(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``call`` in a thread of its own; its result (or the exception it raised) in the list."""
    results: list[object] = []

    def run() -> None:
        try:
            results.append(call())
        except Exception as exc:  # the test's assertion shows it
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, results


def _wait_running(other: psycopg.Connection[Any], text: str) -> None:
    """Until another session runs a statement containing ``text``."""
    deadline = time.monotonic() + 10
    while not other.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE state = 'active' AND query LIKE %s AND pid <> pg_backend_pid()",
        [f"%{text}%"],
    ).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, f"no statement with {text!r} started"


def _old_dead_run_behind_invisible_ones(
    ahead: psycopg.Connection[Any], other: psycopg.Connection[Any]
) -> int:
    """A run dead 40 days, committed, behind INVISIBLE runs dead 50 days that ``ahead``'s
    open transaction inserts: a scan for old dead runs reads those first (invisible to it),
    which leaves the time to move the target meanwhile. Returns the target's id."""
    ahead.execute(
        "INSERT INTO pgtick.runs (job_type, status, attempts, finished_at)"
        " SELECT 'mail', 'dead', 1, now() - interval '50 days' FROM generate_series(1, %s)",
        [INVISIBLE],
    )
    row = other.execute(
        "INSERT INTO pgtick.runs (job_type, status, attempts, finished_at)"
        " VALUES ('mail', 'dead', 1, now() - interval '40 days') RETURNING id"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _retried(other: psycopg.Connection[Any], target: int) -> tuple[str, ...] | None:
    """What `pgtick retry` does to a dead run: back to queued, into runs_live. Returns the
    partition it is in now."""
    return other.execute(
        "UPDATE pgtick.runs SET status = 'queued', run_at = now(), finished_at = NULL"
        " WHERE id = %s AND status = 'dead' RETURNING tableoid::regclass::text",
        [target],
    ).fetchone()


def test_a_claim_that_finds_its_run_moved_meanwhile_claims_again(
    store: RunStore, conn: db.Connection, dsn: str
) -> None:
    target = store.enqueue(NewRun("mail"))
    with (
        store.pinned("claim") as claimer,
        psycopg.connect(dsn) as ahead,
        psycopg.connect(dsn, autocommit=True) as other,
    ):
        # The same statement on the same connection first, for a type with no runs: the
        # catalog caches are then warm, and the claim below takes its snapshot at once
        # rather than after milliseconds of loading them (the move would come first).
        assert claimer.claim("w", [ClaimType("other", 60.0, 2)], 10) == []
        ahead.execute(
            "INSERT INTO pgtick.runs (job_type, run_at)"
            " SELECT 'mail', now() - interval '1 hour' FROM generate_series(1, %s)",
            [INVISIBLE],
        )  # not committed: invisible to the claim, which still reads their index entries
        claiming, results = _started(lambda: claimer.claim("w", [JOB], 10))
        # Once the claim runs (its snapshot taken, the target not reached yet), another daemon
        # claims the target and finishes it: the row moves to runs_succeeded.
        _wait_running(other, "FOR UPDATE SKIP LOCKED")
        moved = other.execute(
            "UPDATE pgtick.runs SET status = 'succeeded', attempts = 1, finished_at = now()"
            " WHERE id = %s AND status = 'queued' RETURNING tableoid::regclass::text",
            [target],
        ).fetchone()
        claiming.join(60)
        ahead.rollback()
    assert moved is not None and moved[0].startswith("pgtick.runs_succeeded"), moved
    assert results == [[]]  # claimed again, and found nothing left to claim
    status = conn.execute("SELECT status FROM runs WHERE id = %s", [target]).fetchone()
    assert status == ("succeeded",)


def test_beats_while_the_result_writer_finishes_runs_back_to_back(store: RunStore) -> None:
    ids = store.enqueue_many([NewRun("mail") for _ in range(2000)])
    claimed = store.claim("w", [JOB], len(ids))
    assert len(claimed) == len(ids)
    leases = [Lease(r.id, r.attempt, 60.0) for r in claimed]
    errors: list[str] = []
    beats: list[set[int]] = []
    writing = threading.Event()

    def beat() -> None:
        while writing.is_set():
            try:
                beats.append(store.heartbeat("w", leases).held)
            except DatabaseError as exc:
                errors.append(str(exc))

    writing.set()
    beating = threading.Thread(target=beat)
    beating.start()
    for i in range(0, len(claimed), 20):
        batch = claimed[i : i + 20]
        assert store.succeed("w", [(r.id, r.attempt) for r in batch]) == {r.id for r in batch}
    writing.clear()
    beating.join(60)
    assert errors == []
    assert len(beats) >= 5, len(beats)
    assert [len(held) for held in beats] == sorted((len(held) for held in beats), reverse=True)


def test_a_reaper_that_finds_an_expired_run_finished_meanwhile_reaps_again(
    store: RunStore, conn: db.Connection, dsn: str
) -> None:
    target = store.enqueue(NewRun("mail"))
    with (
        store.pinned("reap") as reaper,
        psycopg.connect(dsn) as ahead,
        psycopg.connect(dsn, autocommit=True) as other,
    ):
        assert reaper.reap(lambda job_type, attempt: 0.0) == []  # warm caches (see above)
        [claimed] = store.claim("w", [ClaimType("mail", 0.001, 2)], 1)
        time.sleep(0.05)  # its lease has expired; its holder has not finished it yet
        ahead.execute(
            "INSERT INTO pgtick.runs (job_type, status, locked_by, locked_until)"
            " SELECT 'mail', 'running', 'x', now() - interval '1 hour'"
            " FROM generate_series(1, %s)",
            [INVISIBLE],
        )  # expired leases before the target's, invisible to the reaper (not committed)
        reaping, results = _started(lambda: reaper.reap(lambda job_type, attempt: 0.0))
        _wait_running(other, "ORDER BY locked_until")
        assert store.succeed("w", [(target, claimed.attempt)]) == {target}  # moved
        reaping.join(60)
        ahead.rollback()
    assert results == [[]]  # reaped again, and found nothing left to reap
    status = conn.execute("SELECT status FROM runs WHERE id = %s", [target]).fetchone()
    assert status == ("succeeded",)


def _retry_during(
    dsn: str, call: Callable[[], object], text: str
) -> tuple[int, tuple[str, ...] | None, list[object]]:
    """An operator's `retry` of an old dead run while ``call`` (which deletes such runs) runs
    a statement containing ``text``; the run's id, where the retry moved it, and what ``call``
    returned. The retry may come too late on a loaded machine (the delete reached the run
    first, and the retry found nothing): then the race is run again with a new run, up to
    RACE_TRIES times, since only a retry that came first shows the case."""
    for _ in range(RACE_TRIES):
        with (
            psycopg.connect(dsn) as ahead,
            psycopg.connect(dsn, autocommit=True) as other,
        ):
            target = _old_dead_run_behind_invisible_ones(ahead, other)
            deleting, results = _started(call)
            _wait_running(other, text)
            moved = _retried(other, target)
            deleting.join(60)
            ahead.rollback()
        if moved is not None:
            return target, moved, results
        assert not any(isinstance(r, Exception) for r in results), results
    raise AssertionError(f"the retry came after the delete {RACE_TRIES} times in a row")


def test_a_prune_that_finds_a_run_retried_meanwhile_prunes_again(
    store: RunStore, conn: db.Connection, dsn: str
) -> None:
    """`pgtick prune` deletes with SKIP LOCKED too: an operator's `retry` of a dead run, moving
    it to runs_live after a batch's snapshot, made the batch fail the same way."""
    month = 30 * 86400.0
    with store.pinned("prune") as pruner:
        assert pruner.prune("dead", month) == 0  # warm caches (see above)
        target, moved, results = _retry_during(
            dsn, lambda: pruner.prune("dead", month), "FOR UPDATE SKIP LOCKED"
        )
    assert moved == ("pgtick.runs_live",), moved
    assert results == [0]  # pruned again, and found nothing left to prune
    status = conn.execute("SELECT status FROM runs WHERE id = %s", [target]).fetchone()
    assert status == ("queued",)


def test_retention_that_finds_a_default_partition_run_retried_meanwhile_runs_again(
    store: RunStore, conn: db.Connection, dsn: str
) -> None:
    """Retention deletes the DEFAULT partitions' rows past it with a plain DELETE: a run there
    that an operator's `retry` moved to runs_live after the step's snapshot failed the step
    (and with it the reaper's pass) the same way."""
    month = 30 * 86400.0
    retention = {"dead": month}
    store.maintain_partitions(retention)  # the partitions ahead: the next pass only deletes
    target, moved, results = _retry_during(
        dsn, lambda: store.maintain_partitions(retention), "maintain_partitions"
    )
    assert moved == ("pgtick.runs_live",), moved
    assert results == [[]], results  # again, and nothing left past retention
    status = conn.execute("SELECT status FROM runs WHERE id = %s", [target]).fetchone()
    assert status == ("queued",)
