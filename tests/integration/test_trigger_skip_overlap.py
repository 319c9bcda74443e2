"""`pgtick schedules trigger` on a schedule with overlap = "skip" (the default) while a run of it
is active enqueues nothing and says so: it inserted a second run due now, and the schedule,
which never has two runs active at once, ran twice concurrently."""

from __future__ import annotations

import pytest

from pgtick.config import ScheduleConfig
from pgtick.core import ticker
from pgtick.errors import PgtickError
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations


def _schedule(store: RunStore, overlap: str) -> None:
    schedule = ScheduleConfig(name="nightly", job_type="noop", cron="0 3 * * *", overlap=overlap)
    store.sync_schedules([ticker.schedule_def(schedule)], ["noop"])


def _active(conn: db.Connection) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT r.status FROM runs r JOIN schedules s ON s.id = r.schedule_id"
            " WHERE s.name = 'nightly' AND r.status IN ('queued', 'running', 'failed')"
            " ORDER BY r.id"
        ).fetchall()
    ]


def _claimed(conn: db.Connection, run_id: int) -> None:
    """What a daemon's claim writes: its handler is running."""
    conn.execute(
        "UPDATE runs SET status = 'running', locked_by = 'vm1:1:abc', attempts = 1,"
        " locked_until = now() + interval '1 minute', started_at = now() WHERE id = %s",
        (run_id,),
    )


@pytest.mark.parametrize(
    ("overlap", "after"), [("skip", ["running"]), ("allow", ["running", "queued"])]
)
def test_trigger_with_a_run_running_adds_one_only_when_overlap_allows(
    store: RunStore, conn: db.Connection, overlap: str, after: list[str]
) -> None:
    _schedule(store, overlap)
    first = operations.trigger_schedule(store, "nightly")
    _claimed(conn, first)
    if overlap == "skip":
        with pytest.raises(PgtickError, match=rf"has run {first} running .* not triggered"):
            operations.trigger_schedule(store, "nightly")
    else:
        operations.trigger_schedule(store, "nightly")
    assert _active(conn) == after
