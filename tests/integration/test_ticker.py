"""Ticker + RunStore on a real PostgreSQL: sync, materialization, overlap, pruning."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from pgtick.config import ScheduleConfig, TickerConfig
from pgtick.core.ticker import Ticker
from pgtick.observability.metrics import Metrics
from pgtick.storage import db, sqlfile
from pgtick.storage.store import ClaimType, RunStore
from tests.integration import plans

TICK = TickerConfig(interval_seconds=60, lookahead_seconds=60, reaper_interval_seconds=10)


def ticker(store: RunStore, *schedules: ScheduleConfig, types: tuple[str, ...] = ("j",)) -> Ticker:
    return Ticker(store, list(schedules), list(types), TICK, Metrics(types, "test", 1))


def every_minute(name: str = "s", **kw: object) -> ScheduleConfig:
    return ScheduleConfig(name=name, job_type="j", cron="* * * * *", **kw)  # type: ignore[arg-type]


def rewind(conn: db.Connection, interval: str, where: str = "true") -> None:
    """As if every daemon had been down since ``interval`` ago: the cursor is that far back and
    the schedule has been due since then."""
    conn.execute(
        "UPDATE schedules SET materialized_until = now() - %s::interval, "
        f"next_due_at = now() - %s::interval WHERE {where}",
        (interval, interval),
    )


def test_sync_upserts_and_pauses_vanished_schedules_of_our_types(
    store: RunStore, conn: db.Connection
) -> None:
    ticker(store, every_minute("a"), every_minute("b")).sync()
    other = ScheduleConfig(name="theirs", job_type="other", cron="0 * * * *")
    ticker(store, other, types=("other",)).sync()
    ticker(store, every_minute("a"), every_minute("c")).sync()  # b vanished
    rows = dict(conn.execute("SELECT name, paused_reason FROM schedules").fetchall())
    assert rows == {"a": None, "b": "removed", "c": None, "theirs": None}
    store.pause_schedule("a")
    rewind(conn, "1 day")
    ticker(store, every_minute("a"), every_minute("b"), every_minute("c")).sync()
    rows = {
        name: rest
        for name, *rest in conn.execute(
            "SELECT name, paused, paused_reason, materialized_until > now() - interval '1 minute' "
            "FROM schedules"
        )
    }
    # An operator's pause survives a restart; a schedule back in the config resumes from now.
    assert rows["a"] == [True, "operator", False]
    assert rows["b"] == [False, None, True]
    assert rows["c"] == [False, None, False]


def test_concurrent_tickers_create_each_occurrence_once(
    store: RunStore, conn: db.Connection, dsn: str
) -> None:
    hourly = ScheduleConfig(name="h", job_type="j", cron="17 * * * *", catchup="all",
                            overlap="allow")  # fmt: skip
    ticker(store, hourly).sync()
    rewind(conn, "10 hours")
    cursor = "SELECT materialized_until FROM schedules WHERE name = 'h'"
    start = conn.execute(cursor).fetchone()
    pools = [db.make_pool(dsn, "pgtick", size=1) for _ in range(6)]
    barrier = threading.Barrier(len(pools))

    def tick(pool: object) -> None:
        t = ticker(RunStore(pool), hourly)  # type: ignore[arg-type]
        barrier.wait()
        for _ in range(5):
            t.tick()

    threads = [threading.Thread(target=tick, args=(p,)) for p in pools]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for p in pools:
        p.close()
    end = conn.execute(cursor).fetchone()
    assert start is not None and end is not None
    # The occurrences at :17 in (the rewound cursor, the last horizon]: ten hours and the
    # lookahead's minute hold 10 of them, or 11 when a :17 falls in that last minute.
    expected = conn.execute(
        "SELECT count(*) FROM generate_series(date_trunc('hour', %s::timestamptz)"
        " + interval '17 minutes', %s::timestamptz, interval '1 hour') g WHERE g > %s",
        (start[0], end[0], start[0]),
    ).fetchone()
    rows = conn.execute("SELECT count(*), count(DISTINCT scheduled_for) FROM runs").fetchone()
    assert expected is not None and expected[0] in (10, 11)
    assert rows == (expected[0], expected[0])  # each occurrence once, none missing


# Rewinding the cursor re-offers the current minute: move the rows already made for it out of
# the way (into the past, each to its own instant).
SHIFT_OLD_OCCURRENCES = (
    "UPDATE runs SET scheduled_for = scheduled_for - id * interval '1 day' "
    "WHERE scheduled_for > now() - interval '1 hour'"
)


def clear_of_a_minute_mark() -> None:
    """A rewind of 61 s makes one occurrence of an every-minute schedule due, and two within a
    second past a minute mark (make test at 04:11:00): start between 2 s and 55 s past one."""
    second = time.time() % 60
    if second < 2 or second > 55:
        time.sleep((62 - second) % 60)


def test_overlap_skip_records_skipped_while_a_run_is_active(
    store: RunStore, conn: db.Connection
) -> None:
    clear_of_a_minute_mark()
    t = ticker(store, every_minute("s", overlap="skip"))
    t.sync()
    rewind(conn, "61 seconds")
    t.tick()
    [claimed] = store.claim("w", [ClaimType("j", 60, 3)], 5)
    assert claimed.scheduled_for is not None
    rewind(conn, "61 seconds")
    conn.execute(SHIFT_OLD_OCCURRENCES)
    t.tick()  # the next occurrence comes due while the first one runs
    statuses = [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY id")]
    assert statuses == ["running", "skipped"]
    store.succeed("w", [(claimed.id, claimed.attempt)])
    rewind(conn, "61 seconds")
    conn.execute(SHIFT_OLD_OCCURRENCES)
    t.tick()
    statuses = [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY id")]
    assert statuses == ["succeeded", "skipped", "queued"]


def test_pruning_all_runs_never_rematerializes(store: RunStore, conn: db.Connection) -> None:
    t = ticker(store, every_minute("s", overlap="allow", catchup="all"))
    t.sync()
    rewind(conn, "30 minutes")
    t.tick()
    first = conn.execute("SELECT count(*) FROM runs").fetchone()
    assert first is not None and first[0] >= 30
    conn.execute("UPDATE runs SET status = 'succeeded', finished_at = now() - interval '8 days'")
    assert store.prune("succeeded", timedelta(days=7).total_seconds()) == first[0]
    t.tick()
    t.sync()
    t.tick()
    old = conn.execute("SELECT count(*) FROM runs WHERE scheduled_for < now()").fetchone()
    assert old == (0,)


def test_paused_schedules_are_not_materialized_and_resume_from_now(
    store: RunStore, conn: db.Connection
) -> None:
    t = ticker(store, every_minute("s", overlap="allow", catchup="all"))
    t.sync()
    store.pause_schedule("s")
    rewind(conn, "30 minutes")
    t.tick()
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    store.resume_schedule("s")
    t.tick()
    old = conn.execute(
        "SELECT count(*) FROM runs WHERE scheduled_for < now() - interval '2 minutes'"
    )
    assert old.fetchone() == (0,)


# --- A schedule row this version refuses (issue 7 bug 1) ----------------------------------------

# Rows an older version (or a hand) wrote that this version refuses, of a job type this daemon
# does not handle, and what the pause must say about each.
BAD_ROWS = {
    "legacy_range": ("5-5 * * * *", "UTC", "schedules.legacy_range.cron: minute field '5-5'"),
    "on_mars": ("0 3 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
}


def insert_bad_rows(conn: db.Connection) -> None:
    for name, (cron, zone, _) in BAD_ROWS.items():
        conn.execute(
            "INSERT INTO schedules (name, job_type, cron, timezone, materialized_until) "
            "VALUES (%s, 'other', %s, %s, now())",
            (name, cron, zone),
        )


def paused_rows(conn: db.Connection) -> dict[str, tuple[bool, str | None, str | None]]:
    rows = conn.execute("SELECT name, paused, paused_reason, paused_detail FROM schedules")
    return {name: (paused, reason, detail) for name, paused, reason, detail in rows}


def test_a_tick_pauses_rows_it_refuses_and_still_materializes_the_good_schedule(
    store: RunStore, conn: db.Connection
) -> None:
    t = ticker(store, every_minute("good", overlap="allow", catchup="all"))
    t.sync()
    insert_bad_rows(conn)
    rewind(conn, "3 minutes")
    result = t.tick()  # raised ScheduleError before: every daemon exited at its first tick
    assert result.created >= 3
    good = conn.execute(
        "SELECT count(*) FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.name = 'good' AND r.status = 'queued'"
    ).fetchone()
    assert good is not None and good[0] >= 3
    rows = paused_rows(conn)
    assert rows["good"] == (False, None, None)
    for name, (_, _, expected) in BAD_ROWS.items():
        paused, reason, detail = rows[name]
        assert (paused, reason) == (True, "invalid"), name
        assert detail is not None and expected in detail, detail
        assert "\n" not in detail
    assert conn.execute("SELECT count(*) FROM runs WHERE job_type = 'other'").fetchone() == (0,)
    # The listing carries the reason and the detail.
    listed = {s.name: s for s in store.list_schedules()}
    assert listed["on_mars"].paused_reason == "invalid"
    assert listed["on_mars"].paused_detail == rows["on_mars"][2]


def test_resuming_a_row_still_refused_pauses_it_again_and_a_valid_sync_unpauses_it(
    store: RunStore, conn: db.Connection
) -> None:
    t = ticker(store, every_minute("good"))
    t.sync()
    insert_bad_rows(conn)
    t.tick()
    assert store.resume_schedule("legacy_range")
    assert paused_rows(conn)["legacy_range"] == (False, None, None)
    t.tick()  # still refused: paused again, the tick carries on
    assert paused_rows(conn)["legacy_range"][:2] == (True, "invalid")

    # The config of the daemon that owns job type 'other' now declares valid definitions.
    fixed = [
        ScheduleConfig(name="legacy_range", job_type="other", cron="5 * * * *"),
        ScheduleConfig(name="on_mars", job_type="other", cron="0 3 * * *", timezone="UTC"),
    ]
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '1 day'")
    ticker(store, *fixed, types=("other",)).sync()
    rows = conn.execute(
        "SELECT name, paused, paused_reason, paused_detail, next_due_at, "
        "materialized_until > now() - interval '1 minute' FROM schedules "
        "WHERE job_type = 'other' ORDER BY name"
    ).fetchall()
    # Un-paused, continuing from now (no catch-up of the refused period), due at the next tick.
    assert rows == [
        ("legacy_range", False, None, None, None, True),
        ("on_mars", False, None, None, None, True),
    ]
    t.tick()
    assert not any(paused for paused, _, _ in paused_rows(conn).values())


# --- A tick touches only the due schedules (issue 7 bug 7) --------------------------------------

YEARLY = [ScheduleConfig(name=f"y{i:02d}", job_type="j", cron="0 0 1 1 *") for i in range(50)]


def row_versions(conn: db.Connection) -> dict[str, tuple[str, str]]:
    """Each schedule's (xmin, xmax): xmin changes when a transaction updates the row; xmax
    becomes the id of the last transaction that locked it (FOR UPDATE) and stays after it ends."""
    rows = conn.execute("SELECT name, xmin::text, xmax::text FROM schedules").fetchall()
    return {name: (xmin, xmax) for name, xmin, xmax in rows}


def test_a_tick_locks_and_updates_only_the_due_schedule(
    store: RunStore, conn: db.Connection
) -> None:
    t = ticker(store, *YEARLY)
    t.sync()
    first = t.tick()  # every schedule is new (next_due_at unknown): all of them are planned
    assert first.schedules == 50
    rewind(conn, "1 second", "name = 'y07'")
    before = row_versions(conn)
    result = t.tick()
    after = row_versions(conn)
    assert result.schedules == 1
    # Neither updated (xmin) nor even locked (xmax): only y07's row version changed.
    assert [name for name in before if after[name] != before[name]] == ["y07"]
    assert after["y07"][0] != before["y07"][0]
    # Each schedule waits for its next occurrence (1 January) minus the lookahead.
    assert conn.execute(
        "SELECT count(*) FROM schedules WHERE next_due_at > now() + interval '1 hour'"
    ).fetchone() == (50,)
    # The early wake is the earliest next_due_at of all enabled schedules, not only the due one.
    earliest = conn.execute("SELECT min(next_due_at) FROM schedules WHERE NOT paused").fetchone()
    assert earliest is not None and result.next_wake == earliest[0]
    cursor = conn.execute(
        "SELECT materialized_until > now() - interval '1 minute' FROM schedules WHERE name = 'y07'"
    ).fetchone()
    assert cursor == (True,)


def test_sync_of_a_changed_schedule_makes_it_due_at_the_next_tick(
    store: RunStore, conn: db.Connection
) -> None:
    t = ticker(store, every_minute("a", overlap="allow"), every_minute("b", overlap="allow"))
    t.sync()
    t.tick()
    assert conn.execute("SELECT count(*) FROM schedules WHERE next_due_at > now()").fetchone() == (
        2,
    )
    ticker(store, every_minute("a", overlap="allow", jitter_seconds=5.0),
           every_minute("b", overlap="allow")).sync()  # fmt: skip
    due = conn.execute("SELECT name FROM schedules WHERE next_due_at IS NULL").fetchall()
    assert due == [("a",)]
    store.pause_schedule("b")
    store.resume_schedule("b")
    due = conn.execute("SELECT name FROM schedules WHERE next_due_at IS NULL ORDER BY 1")
    assert due.fetchall() == [("a",), ("b",)]


# --- Query plans of the ticker's and the listing's schedule queries ------------------------------


def explain(conn: db.Connection, name: str) -> tuple[str, int]:
    """The plan's text and the pages it really touched (run under ANALYZE, rolled back)."""
    statement = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sqlfile.query(
        name, "pgtick"
    ).as_bytes(None)
    with conn.transaction(force_rollback=True):
        row = conn.execute(statement).fetchone()
        text = conn.execute(b"EXPLAIN " + sqlfile.query(name, "pgtick").as_bytes(None)).fetchall()
    assert row is not None
    top = row[0][0]["Plan"]
    plan = plans.readable(conn, "\n".join(r[0] for r in text))
    return plan, top["Shared Hit Blocks"] + top["Shared Read Blocks"]


@pytest.mark.timeout(120)
def test_tick_and_listing_queries_read_through_their_indexes(conn: db.Connection) -> None:
    """5 000 schedules of which 3 are due, 20 000 runs of one schedule: a tick reads the due
    schedules through schedules_next_due_idx, and the listing finds each schedule's last run
    with one backward probe of (schedule_id, scheduled_for), not by reading its runs."""
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, next_due_at) "
        "SELECT 's' || g, 'j', '0 0 1 1 *', "
        "CASE WHEN g <= 3 THEN now() - interval '1 second' ELSE now() + g * interval '1 hour' END "
        "FROM generate_series(1, 5000) g"
    )
    conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, status, finished_at) "
        "SELECT 1, now() - g * interval '1 minute', 'j', 'succeeded', now() "
        "FROM generate_series(1, 20000) g"
    )
    conn.execute("ANALYZE schedules")
    conn.execute("ANALYZE runs")
    plan, pages = explain(conn, "lock_due_schedules")
    assert "schedules_next_due_idx" in plan and "Seq Scan" not in plan, plan
    assert pages < 50, (pages, plan)
    plan, pages = explain(conn, "next_schedule_due")
    assert "schedules_next_due_idx" in plan and "Seq Scan" not in plan, plan
    assert pages < 20, (pages, plan)
    # The listing reads every schedule, but of the 20 000 runs only the last.
    conn.execute("DELETE FROM schedules WHERE id > 20")
    conn.execute("VACUUM ANALYZE schedules")
    plan, pages = explain(conn, "list_schedules")
    assert "Index Scan Backward using runs_schedule_occurrence_idx" in plan, plan
    assert "Seq Scan on runs" not in plan, plan
    # A backward probe per partition of runs, whatever their size: twice the schedule's runs
    # cost the same pages (reading its 20 000 runs alone would take more than 200).
    conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, status, finished_at) "
        "SELECT 1, now() - interval '1 year' - g * interval '1 minute', 'j', 'succeeded', "
        "now() - interval '1 hour' FROM generate_series(1, 20000) g"
    )
    conn.execute("ANALYZE runs")
    _, doubled = explain(conn, "list_schedules")
    assert doubled < pages + 20, (pages, doubled, plan)
    # Nor by the runs of no schedule made since (a schedule's triggered runs are found by the
    # same index, not by walking runs_id_idx back from the newest run past these).
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at) "
        "SELECT 'j', 'succeeded', now() FROM generate_series(1, 20000) g"
    )
    conn.execute("ANALYZE runs")
    plan, others = explain(conn, "list_schedules")
    assert others < pages + 20, (pages, others, plan)
