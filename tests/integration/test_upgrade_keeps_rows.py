"""Issue 18, "Must show" 4: an install at the 0005 schema (the last release before the storage
redesign) with runs in every state, written as that version's daemons wrote them, migrated to
this version's head: every run, attempt, effect and schedule reads back the same, row for row,
through the public ``runs`` / ``attempts`` names, and idempotency keys stay taken.

The seed is raw SQL against the 0005 tables on purpose: it must keep describing the old
schema however the store's code changes."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from pgtick.errors import MigrationError
from pgtick.storage import db, migrate
from pgtick.storage.store import ClaimType, RunStore
from tests import dbhelp

BASE_VERSION = "0005"

RUN_COLUMNS = (
    "id, schedule_id, scheduled_for, job_type, payload, idempotency_key, status, run_at,"
    " attempts, max_attempts, locked_by, locked_until, last_error, error_type, started_at,"
    " finished_at, created_at, updated_at"
)
ATTEMPT_COLUMNS = "run_id, attempt, worker_id, started_at, finished_at, outcome, error, error_type"

# One run per state and per way of getting there, with the attempts and effects that version
# recorded. Times are relative to now() so leases are live or expired as named.
SEED = """
INSERT INTO schedules (name, job_type, cron, overlap, materialized_until, next_due_at)
VALUES ('nightly', 'report', '0 3 * * *', 'skip', now(), now() + interval '1 day');
INSERT INTO workers (id, hostname, pid, version, threads, job_types)
VALUES ('w-old', 'host-a', 4242, '0.9.0', 4, '{report,mail}');

INSERT INTO runs (job_type, payload, run_at, idempotency_key)
VALUES ('mail', '{"to": "a"}', now() - interval '1 minute', NULL),            -- queued, due
       ('mail', '{"to": "b"}', now() + interval '1 hour', 'mail-b');          -- queued, ahead
INSERT INTO runs (job_type, status, attempts, max_attempts, locked_by, locked_until, started_at)
VALUES ('mail', 'running', 1, 3, 'w-old', now() + interval '50 seconds',
        now() - interval '10 seconds'),                                       -- running, live
       ('mail', 'running', 2, 3, 'w-gone', now() - interval '5 seconds',
        now() - interval '70 seconds');                                       -- lease expired
INSERT INTO runs (job_type, status, run_at, attempts, max_attempts, last_error, error_type,
                  started_at)
VALUES ('mail', 'failed', now() + interval '30 seconds', 1, 3, 'smtp down', 'OSError',
        now() - interval '2 seconds');                                        -- awaiting retry
INSERT INTO runs (job_type, status, attempts, max_attempts, last_error, error_type, started_at,
                  finished_at, idempotency_key)
VALUES ('mail', 'dead', 3, 3, 'no such user', 'Fail', now() - interval '1 hour',
        now() - interval '59 minutes', 'mail-dead'),                          -- dead
       ('mail', 'succeeded', 1, 3, NULL, NULL, now() - interval '2 days',
        now() - interval '2 days', 'mail-ok');                                -- succeeded
INSERT INTO runs (job_type, status, finished_at)
VALUES ('mail', 'cancelled', now() - interval '3 minutes');                   -- cancelled, queued
INSERT INTO runs (job_type, status, attempts, max_attempts, locked_by, locked_until, started_at,
                  finished_at)
VALUES ('mail', 'cancelled', 1, 3, 'w-old', now() + interval '40 seconds',
        now() - interval '20 seconds', now() - interval '1 second');          -- cancelled, held
INSERT INTO runs (schedule_id, scheduled_for, job_type, status, run_at, attempts, max_attempts,
                  started_at, finished_at)
SELECT s.id, t, 'report', st, t, a, 3, CASE WHEN a > 0 THEN t END,
       t + interval '1 second'
FROM schedules s,
     (VALUES (now() - interval '2 days', 'succeeded', 1),
             (now() - interval '1 day', 'skipped', 0)) AS o(t, st, a);        -- occurrences

INSERT INTO attempts (run_id, attempt, worker_id, started_at, finished_at, outcome, error,
                      error_type)
SELECT r.id, a.n, a.worker, r.started_at - make_interval(secs => a.back), a.fin, a.outcome,
       a.err, a.etype
FROM runs r
JOIN (VALUES
    ('running', 1, 'w-old', 0, NULL::timestamptz, NULL, NULL, NULL),
    ('failed', 1, 'w-old', 0, now() - interval '1 second', 'failed', 'smtp down', 'OSError'),
    ('succeeded', 1, 'w-old', 5, now() - interval '2 days', 'released', NULL, NULL),
    ('succeeded', 1, 'w-old', 0, now() - interval '2 days', 'succeeded', NULL, NULL),
    ('dead', 1, 'w-old', 600, now() - interval '69 minutes', 'failed', 'timeout', 'Timeout'),
    ('dead', 2, 'w-old', 300, now() - interval '64 minutes', 'lost', 'lease expired', NULL),
    ('dead', 3, 'w-old', 0, now() - interval '59 minutes', 'failed', 'no such user', 'Fail'),
    ('cancelled', 1, 'w-old', 0, NULL, NULL, NULL, NULL)
) AS a(status, n, worker, back, fin, outcome, err, etype)
  ON a.status = r.status AND r.started_at IS NOT NULL
 AND (r.status <> 'running' OR r.locked_by = 'w-old');
INSERT INTO attempts (run_id, attempt, worker_id, started_at, finished_at, outcome, error,
                      error_type)
SELECT id, 1, 'w-gone', started_at - interval '2 minutes', started_at - interval '1 second',
       'lost', 'lease expired', 'lease_expired'
FROM runs WHERE locked_by = 'w-gone';
INSERT INTO attempts (run_id, attempt, worker_id, started_at)
SELECT id, 2, 'w-gone', started_at FROM runs WHERE locked_by = 'w-gone';

INSERT INTO effects (key, run_id)
SELECT 'invoice-' || id, id FROM runs WHERE status IN ('succeeded', 'dead');
INSERT INTO effects (key, run_id) VALUES ('orphan-effect', NULL);
"""


def snapshot(conn: dbhelp.Connection) -> dict[str, list[Any]]:
    """Everything an operator or a test reads back, in a stable order."""
    return {
        "runs": conn.execute(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY id").fetchall(),
        "attempts": conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts"
            " ORDER BY run_id, attempt, started_at, outcome NULLS LAST"
        ).fetchall(),
        "effects": conn.execute(
            "SELECT key, run_id, created_at FROM effects ORDER BY key"
        ).fetchall(),
        "schedules": conn.execute("SELECT * FROM schedules ORDER BY id").fetchall(),
        "workers": conn.execute("SELECT * FROM workers ORDER BY id").fetchall(),
    }


def test_upgrade_from_0005_keeps_every_row(empty_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = migrate.available()
    base = [m for m in shipped if m.version <= BASE_VERSION]
    assert [m.version for m in base][-1] == BASE_VERSION
    monkeypatch.setattr(migrate, "available", lambda: base)
    migrate.migrate(empty_dsn, "pgtick")
    monkeypatch.undo()
    with dbhelp.connect(empty_dsn) as conn:
        conn.execute(SEED)
        before = snapshot(conn)
        states = {row[6] for row in before["runs"]}
        assert states == set(dbhelp.STATUSES)  # the seed covers every state
        assert len(before["attempts"]) == 12

    # The migrations before the storage cut-over (0010) apply under running daemons; the
    # cut-over waits for every daemon to stop. The seed's daemon row is of one stopped a moment
    # ago without deregistering (killed), which the operator forces past.
    with pytest.raises(MigrationError, match="0010_partition_runs"):
        migrate.migrate(empty_dsn, "pgtick")
    with capture_logs() as logs:
        applied = migrate.migrate(empty_dsn, "pgtick", force=True)
    # The copy reports its progress per table (rows, rate, time left; on a terminal too).
    copied = {(e["what"], e["done"]) for e in logs if e["event"] == "progress" and e["final"]}
    assert copied == {("migrate runs", 11), ("migrate attempts", 12)}, logs
    assert applied == [f"{m.version}_{m.name}" for m in shipped if m.version >= "0010"]

    with dbhelp.connect(empty_dsn) as conn:
        migrate.check_current(conn, "pgtick")
        after = snapshot(conn)
        for part in before:
            # Columns added since come after the old ones (schedules: SELECT *).
            kept = [row[: len(old)] for row, old in zip(after[part], before[part], strict=True)]
            assert kept == before[part], part
        # Flow control (0007): every existing run and schedule has the default priority, and
        # no run a concurrency key.
        assert conn.execute(
            "SELECT count(*) FILTER (WHERE priority <> 0 OR concurrency_key IS NOT NULL) FROM runs"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM schedules WHERE priority <> 0").fetchone() == (0,)
        # Idempotency keys stay taken, whatever state their run is in; new ids come after.
        ids = {row[5]: row[0] for row in before["runs"] if row[5] is not None}
        for key, run_id in ids.items():
            again = conn.execute("SELECT enqueue('mail', '{}', NULL, %s)", [key]).fetchone()
            assert again == (run_id,), key
        fresh = conn.execute("SELECT enqueue('mail')").fetchone()
        assert fresh is not None and fresh[0] > max(row[0] for row in before["runs"])
        due = [row[0] for row in before["runs"] if row[6] == "queued" and row[5] is None]
        expired = [row[0] for row in before["runs"] if row[10] == "w-gone"]

    # The migrated runs carry on under this version: the due one is claimed (then the new
    # one), the one whose old holder vanished is recovered by the reaper and claimed again
    # at its third attempt, and nothing not yet due or still held is touched.
    pool = db.make_pool(empty_dsn, "pgtick", size=2, name="pgtick-test")
    try:
        store = RunStore(pool)
        mail = [ClaimType("mail", 30.0, 3)]
        assert [r.id for r in store.claim("w-new", mail, 10)] == [*due, fresh[0]]
        assert [(r.id, r.status) for r in store.reap(lambda _type, _attempts: 0.0)] == [
            (expired[0], "failed")
        ]
        assert store.reap_cancelled() == 0  # its holder's lease is still live
        again = store.claim("w-new", mail, 10)
        assert [(r.id, r.attempt) for r in again] == [(expired[0], 3)]
        outcomes = [(a.attempt, a.outcome) for a in store.get_attempts(expired[0])]
        assert outcomes == [(1, "lost"), (2, "lost"), (3, None)]
    finally:
        pool.close()
