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


def test_trigger_of_a_skip_schedule_with_a_run_running_enqueues_nothing(
    store: RunStore, conn: db.Connection
) -> None:
    _schedule(store, "skip")
    first = operations.trigger_schedule(store, "nightly")
    _claimed(conn, first)
    with pytest.raises(PgtickError, match=rf"has run {first} running .* not triggered"):
        operations.trigger_schedule(store, "nightly")
    assert _active(conn) == ["running"]


def test_trigger_of_an_allow_schedule_adds_a_run_beside_the_running_one(
    store: RunStore, conn: db.Connection
) -> None:
    _schedule(store, "allow")
    first = operations.trigger_schedule(store, "nightly")
    _claimed(conn, first)
    operations.trigger_schedule(store, "nightly")
    assert _active(conn) == ["running", "queued"]
