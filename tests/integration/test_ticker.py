"""Ticker + RunStore on a real PostgreSQL: sync, materialization, overlap, pruning."""

from __future__ import annotations

import threading
from datetime import timedelta

from pgtick import db
from pgtick.config import ScheduleConfig, TickerConfig
from pgtick.metrics import Metrics
from pgtick.store import ClaimType, RunStore
from pgtick.ticker import Ticker

TICK = TickerConfig(interval_seconds=60, lookahead_seconds=60, reaper_interval_seconds=10)


def ticker(store: RunStore, *schedules: ScheduleConfig, types: tuple[str, ...] = ("j",)) -> Ticker:
    return Ticker(store, list(schedules), list(types), TICK, Metrics(types, "test", 1))


def every_minute(name: str = "s", **kw: object) -> ScheduleConfig:
    return ScheduleConfig(name=name, job_type="j", cron="* * * * *", **kw)  # type: ignore[arg-type]


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
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '1 day'")
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
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '10 hours'")
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
    rows = conn.execute(
        "SELECT count(*), count(DISTINCT scheduled_for), min(scheduled_for) > now() - interval "
        "'10 hours' FROM runs"
    ).fetchone()
    assert rows is not None and rows[0] == rows[1] and rows[0] in (9, 10) and rows[2]


# Rewinding the cursor re-offers the current minute: move the rows already made for it out of
# the way (into the past, each to its own instant).
SHIFT_OLD_OCCURRENCES = (
    "UPDATE runs SET scheduled_for = scheduled_for - id * interval '1 day' "
    "WHERE scheduled_for > now() - interval '1 hour'"
)


def test_overlap_skip_records_skipped_while_a_run_is_active(
    store: RunStore, conn: db.Connection
) -> None:
    t = ticker(store, every_minute("s", overlap="skip"))
    t.sync()
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '61 seconds'")
    t.tick()
    [claimed] = store.claim("w", [ClaimType("j", 60, 3)], 5)
    assert claimed.scheduled_for is not None
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '61 seconds'")
    conn.execute(SHIFT_OLD_OCCURRENCES)
    t.tick()  # the next occurrence comes due while the first one runs
    statuses = [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY id")]
    assert statuses == ["running", "skipped"]
    store.succeed("w", [claimed.id])
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '61 seconds'")
    conn.execute(SHIFT_OLD_OCCURRENCES)
    t.tick()
    statuses = [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY id")]
    assert statuses == ["succeeded", "skipped", "queued"]


def test_pruning_all_runs_never_rematerializes(store: RunStore, conn: db.Connection) -> None:
    t = ticker(store, every_minute("s", overlap="allow", catchup="all"))
    t.sync()
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '30 minutes'")
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
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '30 minutes'")
    t.tick()
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    store.resume_schedule("s")
    t.tick()
    old = conn.execute(
        "SELECT count(*) FROM runs WHERE scheduled_for < now() - interval '2 minutes'"
    )
    assert old.fetchone() == (0,)
