"""Migration 0013: an attempt is written once, when it ends. The claim writes no attempt row
(the run's row is the open attempt: locked_by, attempts, started_at), each statement that ends
an attempt inserts it into attempts_history with its outcome, and the ``attempts`` view shows
both, as the table did. On a real PostgreSQL, without a daemon."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import psycopg
import pytest

from pgtick.storage import db, migrate
from pgtick.storage.store import ClaimType, Failure, NewRun, RunStore
from tests import dbhelp
from tests.integration.leases import expire

NOOP = [ClaimType("noop", 60.0, 10)]
COLUMNS = "id, run_id, attempt, worker_id, started_at, finished_at, outcome, error, error_type"


def _rows(conn: db.Connection, table: str, run_ids: list[int]) -> list[tuple[Any, ...]]:
    return conn.execute(
        f"SELECT {COLUMNS} FROM {table} WHERE run_id = ANY(%s) ORDER BY run_id, attempt",
        [run_ids],
    ).fetchall()


def test_a_claim_writes_no_attempt_and_the_view_shows_it_open(
    store: RunStore, conn: db.Connection
) -> None:
    ids = store.enqueue_many([NewRun("noop") for _ in range(3)])
    claimed = sorted(store.claim("w", NOOP, 3), key=lambda r: r.id)
    assert [r.id for r in claimed] == sorted(ids)
    assert _rows(conn, "attempts_history", ids) == []
    assert _rows(conn, "attempts", ids) == [
        (None, r.id, 1, "w", r.started_at, None, None, None, None) for r in claimed
    ]
    # What `pgtick show` and `logs --follow` read: the open attempt, last.
    assert [(a.attempt, a.worker_id, a.outcome) for a in store.get_attempts(ids[0])] == [
        (1, "w", None)
    ]


def test_each_end_writes_its_attempt_once(store: RunStore, conn: db.Connection) -> None:
    ok, bad, given_back, cancelled = store.enqueue_many([NewRun("noop") for _ in range(4)])
    claimed = {r.id: r for r in store.claim("w", NOOP, 4)}
    started: dict[int, datetime] = {i: r.started_at for i, r in claimed.items()}
    assert store.succeed("w", [(ok, 1)]) == {ok}
    assert [f.id for f in store.fail("w", [Failure(bad, 1, "boom", "E", "detail", 0.0)])] == [bad]
    assert store.release("w", [(given_back, 1)]) == {given_back}
    assert store.cancel([cancelled]) == [cancelled]
    # Cancelled while running: still held, its attempt still open until the holder lets go.
    assert [(r[2], r[3], r[6]) for r in _rows(conn, "attempts", [cancelled])] == [(1, "w", None)]
    assert store.acknowledge_cancel("w", [(cancelled, 1)]) == {cancelled}

    ended = _rows(conn, "attempts_history", [ok, bad, given_back, cancelled])
    assert [(r[1], r[2], r[3], r[4], r[6], r[7], r[8]) for r in ended] == [
        (ok, 1, "w", started[ok], "succeeded", None, None),
        (bad, 1, "w", started[bad], "failed", "detail", "E"),
        (given_back, 1, "w", started[given_back], "released", "released on shutdown", None),
        (cancelled, 1, "w", started[cancelled], "lost", "cancelled by operator", None),
    ]
    assert all(r[0] is not None and r[5] is not None for r in ended)  # id and end drawn then
    # The view shows the same rows, and nothing open: no run is held any more.
    assert _rows(conn, "attempts", [ok, bad, given_back, cancelled]) == ended

    # The failed run's retry is attempt 2, the released run's next claim attempt 1 again.
    again = {r.id: r.attempt for r in store.claim("w", NOOP, 4)}
    assert again == {bad: 2, given_back: 1}
    assert store.succeed("w", [(bad, 2), (given_back, 1)]) == {bad, given_back}
    assert [(a.attempt, a.outcome) for a in store.get_attempts(given_back)] == [
        (1, "released"),
        (1, "succeeded"),
    ]


def test_the_reaper_and_retry_write_the_lost_attempt_with_its_holder(
    store: RunStore, conn: db.Connection
) -> None:
    crashed = store.enqueue(NewRun("noop"))
    [first] = store.claim("w1", NOOP, 1)
    expire(conn, [crashed])
    assert [r.id for r in store.reap(lambda job_type, attempt: 60.0)] == [crashed]

    # Cancelled while running, then its holder died: retry, or the reaper, lets go for it.
    retried, reaped = store.enqueue_many([NewRun("noop"), NewRun("noop")])
    held = {r.id: r for r in store.claim("w2", NOOP, 2)}
    assert set(held) == {retried, reaped}
    assert sorted(store.cancel([retried, reaped])) == sorted([retried, reaped])
    expire(conn, [retried, reaped])
    lease_end = dict(
        conn.execute(
            "SELECT id, locked_until FROM runs WHERE id = ANY(%s)", [[retried, reaped]]
        ).fetchall()
    )
    assert store.retry([retried]) == [retried]
    assert store.reap_cancelled() == 1

    ended = _rows(conn, "attempts_history", [crashed, retried, reaped])
    assert [(r[1], r[3], r[4], r[6], r[7], r[8]) for r in ended] == [
        (crashed, "w1", first.started_at, "lost", "lease expired", "lease_expired"),
        (retried, "w2", held[retried].started_at, "lost", "cancelled by operator", None),
        (reaped, "w2", held[reaped].started_at, "lost", "cancelled by operator", None),
    ]
    ends = {r[1]: r[5] for r in ended}
    assert (ends[retried], ends[reaped]) == (lease_end[retried], lease_end[reaped])


def test_an_attempt_is_never_stored_open(conn: db.Connection) -> None:
    """No partition takes an attempt without an outcome, and the view takes no write."""
    with pytest.raises(psycopg.errors.CheckViolation, match="no partition"):
        conn.execute("INSERT INTO attempts_history (run_id, attempt, worker_id) VALUES (1, 1, 'w')")
    with pytest.raises(psycopg.Error, match='cannot insert into view "attempts"'):
        conn.execute(
            "INSERT INTO attempts (run_id, attempt, worker_id, outcome)"
            " VALUES (1, 1, 'w', 'succeeded')"
        )


SEED_0012 = """
INSERT INTO runs (job_type, status, attempts, locked_by, locked_until, started_at)
VALUES ('mail', 'running', 1, 'w-old', now() + interval '30 seconds', now() - interval '5 s'),
       ('mail', 'queued', 1, NULL, NULL, NULL),
       ('mail', 'succeeded', 1, NULL, NULL, now() - interval '1 minute');
INSERT INTO attempts (run_id, attempt, worker_id, started_at, finished_at, outcome)
SELECT id, 1, coalesce(locked_by, 'w-old'), coalesce(started_at, now() - interval '2 minutes'),
       CASE WHEN status = 'succeeded' THEN now() END,
       CASE WHEN status = 'succeeded' THEN 'succeeded' END
FROM runs;
"""


def test_migration_0013_keeps_every_attempt_and_who_may_read_it(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From 0012: the running run's open attempt reads back the same through the view (its id
    aside), an open attempt of a run no longer held (which pgtick never leaves) is closed as
    lost rather than dropped, an ended one is kept as it is, and a role that could read the
    table reads the view."""
    shipped = migrate.available()
    monkeypatch.setattr(migrate, "available", lambda: [m for m in shipped if m.version <= "0012"])
    migrate.migrate(empty_dsn, "pgtick")
    monkeypatch.undo()
    reader = f"pgtick_attempts_reader_{os.getpid()}"
    with dbhelp.connect(empty_dsn) as conn:
        conn.execute(SEED_0012)
        before = conn.execute(
            "SELECT a.run_id, a.attempt, a.worker_id, a.started_at, a.finished_at, a.outcome,"
            " r.status FROM attempts a JOIN runs r ON r.id = a.run_id ORDER BY a.run_id"
        ).fetchall()
        conn.execute(f'CREATE ROLE "{reader}"')
        conn.execute(f'GRANT USAGE ON SCHEMA pgtick TO "{reader}"')
        conn.execute(f'GRANT SELECT ON attempts TO "{reader}"')
    try:
        migrate.migrate(empty_dsn, "pgtick")
        with dbhelp.connect(empty_dsn) as conn:
            after = conn.execute(
                "SELECT a.run_id, a.attempt, a.worker_id, a.started_at, a.finished_at,"
                " a.outcome, a.error, a.id IS NULL FROM attempts a ORDER BY a.run_id"
            ).fetchall()
            running, orphan, done = before
            assert after[0] == (*running[:6], None, True)
            assert after[1][:4] == orphan[:4] and after[1][5:] == (
                "lost",
                "open attempt of a run no longer held, closed by migration 0013",
                False,
            )
            assert after[1][4] is not None
            assert after[2] == (*done[:6], None, False)
            conn.execute(f'SET ROLE "{reader}"')
            assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (3,)
            conn.execute("RESET ROLE")
    finally:
        with dbhelp.connect(empty_dsn) as conn:
            conn.execute(f'DROP OWNED BY "{reader}"')
            conn.execute(f'DROP ROLE "{reader}"')
