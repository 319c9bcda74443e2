"""A schedule with overlap = "skip" (the default) and a jitter longer than two ticker intervals
runs each occurrence once, whatever its catch-up. At occurrence T the run's T + offset is not
due yet, so the tick leaves the cursor just before T; two intervals later that cursor was older
than the "missed" cut, T was taken for an occurrence missed during downtime, and catchup =
"none" dropped it: no run was ever created. Each tick is the ticker's own plan(), at the times
the ticker wakes (every interval, aligned, and at each plan's next_wake)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pgtick.core.ticker import plan
from pgtick.scheduling.cron import Cron, jitter_offset
from pgtick.storage.store import ScheduleRow

TICK = 60.0
LOOKAHEAD = 60.0
JITTER = 1800.0


def _row(catchup: str, cursor: datetime, now: datetime) -> ScheduleRow:
    return ScheduleRow(
        id=1, name="nightly", job_type="report", payload={}, cron="0 3 * * *", timezone="UTC",
        max_attempts=None, catchup=catchup, catchup_limit=100, overlap="skip",
        jitter_seconds=JITTER, materialized_until=cursor, db_now=now,
    )  # fmt: skip


def _simulate(catchup: str, start: datetime, end: datetime) -> list[datetime]:
    """Run the ticker's plan at every aligned tick and early wake from start to end; return
    the occurrences it would materialize."""
    created: list[datetime] = []
    cursor = start
    now = start
    wake: datetime | None = None
    while now < end:
        aligned = datetime.fromtimestamp((now.timestamp() // TICK + 1) * TICK, UTC)
        now = min(aligned, wake) if wake is not None and wake > now else aligned
        p = plan(_row(catchup, cursor, now), lookahead_seconds=LOOKAHEAD, tick_seconds=TICK)
        created += [o.scheduled_for for o in p.occurrences]
        cursor, wake = p.until, p.next_wake
    return created


@pytest.mark.parametrize("catchup", ["latest", "none"])
def test_a_jittered_skip_schedule_runs_its_occurrence_once(catchup: str) -> None:
    occurrence = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    cron = Cron("0 3 * * *", "UTC", "nightly")
    offset = jitter_offset("nightly", occurrence, JITTER, cron.next_after(occurrence))
    assert offset > 3 * TICK  # this occurrence's run_at is more than two ticks after it
    created = _simulate(
        catchup, occurrence - timedelta(seconds=30), occurrence + timedelta(seconds=JITTER + 120)
    )
    assert created == [occurrence], f"catchup={catchup}: created {created}"
