"""The rollups (migration 0023, storage/rollup.py): what roll_up_runs writes per minute and per
hour is what the runs and attempts it summarises say, each minute once however often and by
however many callers it runs, insert-only, and retention drops their partitions."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from pgtick.storage import db
from pgtick.storage.store import RunStore, rollup_retention
from tests.acceptance.conftest import wait_for
from tests.integration import partitions

DAY = 86400.0
# Runs that ended 3 h 10 min to 2 h 50 min ago (two hours' worth), of two job types, and the
# attempts of the failures: 'mail' 30 succeeded (one attempt each, 2 s), 4 dead (two failed
# attempts each), 1 cancelled; 'sms' 5 succeeded after a lost attempt, 2 skipped.
SEED = """
INSERT INTO runs (job_type, status, attempts, max_attempts, started_at, finished_at)
SELECT 'mail', 'succeeded', 1, 3, t - interval '2 seconds', t
FROM (SELECT now() - interval '3 hours 10 minutes' + g * interval '40 seconds' AS t
      FROM generate_series(1, 30) g) s;
WITH dead AS (
    INSERT INTO runs (job_type, status, attempts, max_attempts, started_at, finished_at)
    SELECT 'mail', 'dead', 2, 2, now() - interval '3 hours' + g * interval '1 minute',
           now() - interval '3 hours' + g * interval '1 minute' + interval '1 second'
    FROM generate_series(1, 4) g
    RETURNING id, started_at, finished_at)
INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at, outcome, error)
SELECT id, a, 'w', started_at - (2 - a) * interval '30 seconds',
       finished_at - (2 - a) * interval '30 seconds', 'failed', 'boom'
FROM dead, generate_series(1, 2) a;
INSERT INTO runs (job_type, status, finished_at)
VALUES ('mail', 'cancelled', now() - interval '3 hours');
WITH ok AS (
    INSERT INTO runs (job_type, status, attempts, max_attempts, started_at, finished_at)
    SELECT 'sms', 'succeeded', 2, 3, now() - interval '2 hours 55 minutes',
           now() - interval '2 hours 55 minutes' + interval '1 second'
    FROM generate_series(1, 5)
    RETURNING id, started_at)
INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at, outcome)
SELECT id, 1, 'gone', started_at - interval '2 minutes', started_at - interval '1 minute', 'lost'
FROM ok;
INSERT INTO runs (job_type, status, finished_at)
SELECT 'sms', 'skipped', now() - interval '2 hours 52 minutes' FROM generate_series(1, 2);
"""
# The same figures read from runs and attempts per job type and minute, for comparison.
DIRECT = """
SELECT job_type, to_timestamp(floor(extract(epoch FROM at) / 60) * 60) AS minute,
       sum(succeeded), sum(failed), sum(lost), sum(dead), sum(cancelled), sum(skipped),
       round(sum(run_seconds)::numeric, 3)
FROM (SELECT job_type, finished_at AS at, (status = 'succeeded')::int AS succeeded,
             0 AS failed, 0 AS lost, (status = 'dead')::int AS dead,
             (status = 'cancelled')::int AS cancelled, (status = 'skipped')::int AS skipped,
             CASE WHEN status = 'succeeded'
                  THEN extract(epoch FROM finished_at - started_at) ELSE 0 END AS run_seconds
      FROM runs WHERE status IN ('succeeded', 'dead', 'cancelled', 'skipped')
      UNION ALL
      SELECT r.job_type, a.finished_at, 0, (a.outcome = 'failed')::int,
             (a.outcome = 'lost')::int, 0, 0, 0, 0
      FROM attempts a JOIN runs r ON r.id = a.run_id WHERE a.outcome IN ('failed', 'lost')) x
WHERE at < %(upto)s
GROUP BY 1, 2 ORDER BY 1, 2
"""
ROLLED = """
SELECT job_type, bucket, succeeded, failed, lost, dead, cancelled, skipped,
       round(run_seconds::numeric, 3)
FROM {table} WHERE job_type <> '' AND bucket < %(upto)s ORDER BY 1, 2
"""


def _rolled_up_to(store: RunStore) -> datetime:
    upto = store.rolled_up_to()
    assert upto is not None
    return upto


def test_minutes_and_hours_are_what_the_runs_and_attempts_say(
    store: RunStore, conn: db.Connection
) -> None:
    conn.execute(SEED)  # type: ignore[arg-type]
    # A first call reaches back a day (from the hour), an hour of minutes per step.
    minutes, caught_up = store.roll_up(DAY, pass_seconds=60)
    assert caught_up and 24 * 60 <= minutes <= 25 * 60 + 1
    upto = _rolled_up_to(store)
    assert 30 <= (store.now() - upto).total_seconds() < 90 + 5
    direct = [tuple(r) for r in conn.execute(DIRECT, {"upto": upto}).fetchall()]
    assert len(direct) > 10
    rolled = conn.execute(ROLLED.format(table="rollup_minutes"), {"upto": upto}).fetchall()
    assert [tuple(r) for r in rolled] == direct
    # Every minute rolled up is marked, runs or not, once.
    [(marks, distinct)] = conn.execute(
        "SELECT count(*), count(DISTINCT bucket) FROM rollup_minutes WHERE job_type = ''"
    ).fetchall()
    assert marks == distinct == minutes

    # The hours: those whose minutes are all rolled up, summed; the console's read gives the
    # same per hour whichever table each hour comes from.
    by_hour: dict[tuple[str, datetime], list[float]] = {}
    for job_type, minute, *figures in direct:
        hour = minute.replace(minute=0, second=0, microsecond=0)
        sums = by_hour.setdefault((job_type, hour), [0] * len(figures))
        for i, value in enumerate(figures):
            sums[i] += value
    hours = conn.execute(ROLLED.format(table="rollup_hours"), {"upto": upto}).fetchall()
    assert hours and all(b.minute == 0 for _, b, *_ in hours)
    for job_type, hour, *figures in hours:
        assert [float(f) for f in figures] == [float(f) for f in by_hour[(job_type, hour)]]
    since = (upto - timedelta(hours=5)).replace(minute=0, second=0, microsecond=0)
    for job_type in ("mail", "sms"):
        read = store.rollup_per_hour(job_type, since)
        expected = {h: v for (t, h), v in by_hour.items() if t == job_type and h >= since}
        assert {
            b.start: [b.succeeded, b.failed, b.lost, b.dead, b.cancelled, b.skipped] for b in read
        } == {h: [int(x) for x in v[:6]] for h, v in expected.items()}
    mail = store.rollup_per_hour("mail", since)
    assert sum(b.succeeded for b in mail) == 30 and sum(b.dead for b in mail) == 4
    assert sum(b.failed for b in mail) == 8 and sum(b.cancelled for b in mail) == 1
    assert abs(sum(b.run_seconds for b in mail) - 60.0) < 0.01
    sms = store.rollup_per_hour("sms", since)
    assert sum(b.lost for b in sms) == 5 and sum(b.skipped for b in sms) == 2

    # Again at once: nothing new is closed, nothing is written twice.
    assert store.roll_up(DAY)[0] in (0, 1)
    again = conn.execute(ROLLED.format(table="rollup_minutes"), {"upto": upto}).fetchall()
    assert again == rolled


def test_a_pass_stops_after_its_time_and_the_next_goes_on(store: RunStore) -> None:
    """A catch-up (the first pass reaches back a day) is spread over the reaper's passes."""
    minutes, caught_up = store.roll_up(DAY, pass_seconds=0)
    assert (minutes, caught_up) == (60, False)  # one step, then out of time
    total = minutes
    while not caught_up:
        minutes, caught_up = store.roll_up(DAY, pass_seconds=0)
        total += minutes
    assert 24 * 60 <= total <= 25 * 60 + 1


def test_callers_at_once_roll_each_minute_up_once(store: RunStore, conn: db.Connection) -> None:
    """Every daemon of a fleet calls it; the advisory lock lets one work at a time."""
    errors: list[BaseException] = []

    def call() -> None:
        try:
            store.roll_up(DAY, pass_seconds=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store.roll_up(DAY, pass_seconds=60)  # whatever a caller that found the lock taken left
    [(marks, distinct, span)] = conn.execute(
        "SELECT count(*), count(DISTINCT bucket),"
        " extract(epoch FROM max(bucket) - min(bucket))::int / 60 + 1"
        " FROM rollup_minutes WHERE job_type = ''"
    ).fetchall()
    assert marks == distinct == span


def test_the_rollups_are_insert_only(store: RunStore, conn: db.Connection) -> None:
    """No row is updated or deleted by rolling up: a snapshot held elsewhere keeps no dead
    version of them (docs/design/storage.md)."""
    conn.execute(SEED)  # type: ignore[arg-type]
    store.roll_up(DAY, pass_seconds=60)
    store.roll_up(DAY)
    [(rows,)] = conn.execute(
        "SELECT (SELECT count(*) FROM rollup_minutes) + (SELECT count(*) FROM rollup_hours)"
    ).fetchall()

    def counted() -> tuple[int, int, int]:
        [(ins, upd, dele)] = conn.execute(
            "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0),"
            " coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables"
            " WHERE relname LIKE 'rollup\\_%'"
        ).fetchall()
        return int(ins), int(upd), int(dele)

    # The statistics arrive once the writers' backends report them (within seconds).
    inserted, updated, deleted = wait_for(lambda: counted()[0] >= rows and counted(), 20)
    assert inserted == rows
    assert (updated, deleted) == (0, 0)


def test_retention_drops_the_rollups_partitions(store: RunStore, conn: db.Connection) -> None:
    """The daemons' retention pass gives the rollups' keys (rollup_retention): the minutes go
    after a day, the hours with the longest retention; `pgtick prune`'s pass (statuses only)
    leaves them."""
    old_minutes = partitions.past(conn, "rollup_minutes", (30, 29))
    old_hours = partitions.past(conn, "rollup_hours", (24 * 9, 24 * 8))
    kept_hours = partitions.past(conn, "rollup_hours", (30, 29))
    for table, hours_ago in ((old_minutes, 30), (old_hours, 24 * 9), (kept_hours, 30)):
        conn.execute(
            f"INSERT INTO {table} (job_type, bucket, succeeded)"
            " VALUES ('mail', date_trunc('hour', now()) - %s * interval '1 hour', 7)",
            [hours_ago],
        )
    week = 7 * DAY
    by_status = {"succeeded": week, "dead": week, "cancelled": week, "skipped": DAY}
    changes = store.maintain_partitions(by_status)
    assert not any(c.parent.startswith("rollup_") for c in changes)
    changes = store.maintain_partitions(rollup_retention(by_status))
    dropped = {c.table for c in changes if c.action == "dropped"}
    assert dropped == {old_minutes, old_hours}
    created = {c.parent for c in changes if c.action == "created"}
    assert created == {"rollup_minutes", "rollup_hours"}  # and the partitions ahead
    assert all(c.status is None for c in changes if c.parent.startswith("rollup_"))
    assert conn.execute("SELECT count(*) FROM rollup_hours").fetchone() == (1,)
    assert rollup_retention(by_status) == {
        **by_status,
        "rollup_hours": week,
        "rollup_minutes": DAY,
    }
