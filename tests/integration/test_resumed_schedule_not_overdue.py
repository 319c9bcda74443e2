"""A schedule paused by the operator over one of its occurrences, then resumed, continues from
now: the occurrence in the paused period is deliberately never created. `status` (and
pgtick_schedules_overdue, the same rule) reported the schedule overdue until its next
occurrence had started: for a daily schedule, up to a day of `status` exit 5 and a
PgtickScheduleOverdue alert pointing at stalled tickers and dead daemons."""

from __future__ import annotations

from datetime import timedelta

from pgtick.config import ScheduleConfig, TickerConfig
from pgtick.core import ticker
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations


def test_a_resumed_schedule_is_not_overdue_for_the_occurrence_it_was_paused_over(
    store: RunStore, conn: db.Connection
) -> None:
    now = store.now()
    two_hours_ago = now - timedelta(hours=2)
    # Daily, at a time of day two hours ago: its latest occurrence is two hours old.
    cron = f"{two_hours_ago.minute} {two_hours_ago.hour} * * *"
    schedule = ScheduleConfig(name="daily_report", job_type="noop", cron=cron)
    store.sync_schedules([ticker.schedule_def(schedule)], ["noop"])
    # The schedule exists for days (its history is older than the occurrence in question).
    conn.execute(
        "UPDATE schedules SET created_at = now() - interval '3 days', "
        "materialized_until = now() - interval '3 hours'"
    )

    # The operator paused it before today's occurrence (simulated: paused now, the
    # occurrence two hours ago has no run, as it has none while paused) and resumes it now.
    operations.pause_schedule(store, "daily_report")
    operations.resume_schedule(store, "daily_report")
    # The daemon's next tick: continues from now, nothing for the paused period (by design).
    t = ticker.Ticker(store, [schedule], ["noop"], TickerConfig(), Metrics(["noop"], "t", 1))
    t.tick()
    [(runs,)] = conn.execute("SELECT count(*) FROM runs").fetchall()
    assert runs == 0  # the paused period is not caught up, as documented

    st = operations.status(store, heartbeat_seconds=20.0, tick_interval_seconds=60.0)
    [sched] = st.schedules
    assert not sched.overdue, (
        "a schedule resumed from now is reported overdue for the occurrence it was paused "
        f"over; status problems: {st.problems}"
    )
    assert st.healthy, st.problems
