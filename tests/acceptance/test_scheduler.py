"""Issue 4 "Must show" 3, 4 and 5 with real `pgtick run` processes."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import pytest

from pgtick import db
from pgtick.store import RunStore

from .conftest import Cluster, wait_for

HOURLY = """
[schedules.hourly_latest]
job_type = "record"
cron = "{minute} * * * *"
catchup = "latest"
overlap = "allow"

[schedules.hourly_all]
job_type = "record"
cron = "{minute} * * * *"
catchup = "all"
overlap = "allow"

[schedules.hourly_none]
job_type = "record"
cron = "{minute} * * * *"
catchup = "none"
overlap = "allow"
"""


def _count_by_schedule(conn: db.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT s.name, count(r.id) FROM schedules s "
        "LEFT JOIN runs r ON r.schedule_id = s.id AND r.scheduled_for <= now() "
        "GROUP BY s.name"
    ).fetchall()
    return dict(rows)


@pytest.mark.timeout(120)
def test_daemons_ticking_at_once_catch_up_per_policy_and_never_rematerialize(
    cluster: Cluster, conn: db.Connection, store: RunStore
) -> None:
    """Must show 3."""
    # Half an hour away from the current minute: no occurrence is "on time" during the test.
    minute = (datetime.now(UTC).minute + 30) % 60
    config = cluster.config(HOURLY.format(minute=minute))
    first = cluster.start(config)
    first.signal(signal.SIGTERM)
    assert first.wait(20) == 0
    assert _count_by_schedule(conn) == {"hourly_latest": 0, "hourly_all": 0, "hourly_none": 0}

    # Three hours of downtime, then three daemons start (and tick) at the same moment.
    conn.execute("UPDATE schedules SET materialized_until = now() - interval '3 hours'")
    daemons = [cluster.start(config, wait=False) for _ in range(3)]
    for daemon in daemons:
        cluster.wait_registered(daemon)
    expected = {"hourly_latest": 1, "hourly_all": 3, "hourly_none": 0}
    assert _count_by_schedule(conn) == expected
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone() == (4,)
        ),
        20,
        what="catch-up runs done",
    )
    assert set(cluster.executions().values()) == {1}
    assert all("UniqueViolation" not in d.log() for d in daemons)

    # Prune every run; restart and tick again: nothing old comes back.
    conn.execute("UPDATE runs SET finished_at = now() - interval '30 days'")
    assert store.prune("succeeded", 86400) == 4
    for daemon in daemons:
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    again = [cluster.start(config, wait=False) for _ in range(3)]
    for daemon in again:
        cluster.wait_registered(daemon)
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    assert _count_by_schedule(conn) == {"hourly_latest": 0, "hourly_all": 0, "hourly_none": 0}


LIVE = """
[schedules.precise]
job_type = "pickup"
cron = "* * * * *"

[schedules.long]
job_type = "polite"
cron = "* * * * *"
payload = { seconds = 150 }
"""


@pytest.mark.timeout(240)
def test_every_minute_runs_start_on_time_and_long_runs_skip_overlaps(
    cluster: Cluster, conn: db.Connection
) -> None:
    """Must show 4 (overlap skip with a 150 s handler) and 5 (precision within 1 s), over
    live minutes with the default lookahead."""
    daemon = cluster.start(cluster.config(LIVE, grace="1s"))
    started = time.time()

    def done() -> bool:
        precise = conn.execute(
            "SELECT count(*) FROM runs r JOIN schedules s ON s.id = r.schedule_id "
            "WHERE s.name = 'precise' AND r.status = 'succeeded'"
        ).fetchone()
        skipped = conn.execute("SELECT count(*) FROM runs WHERE status = 'skipped'").fetchone()
        running = conn.execute(
            "SELECT count(*) FROM runs r JOIN schedules s ON s.id = r.schedule_id "
            "WHERE s.name = 'long' AND r.status IN ('running', 'queued', 'failed')"
        ).fetchone()
        assert running is not None and running[0] <= 1, "two runs of 'long' at once"
        return bool(precise and precise[0] >= 2 and skipped and skipped[0] >= 1)

    wait_for(done, 190, 0.5, "two precise runs and one skipped long run")
    assert time.time() - started < 190
    delays = conn.execute(
        "SELECT s.name, extract(epoch FROM r.started_at - r.scheduled_for) "
        "FROM runs r JOIN schedules s ON s.id = r.schedule_id WHERE r.started_at IS NOT NULL"
    ).fetchall()
    assert {name for name, _ in delays} == {"precise", "long"}
    assert all(0 <= float(d) < 1.0 for _, d in delays), delays
    long_runs = conn.execute(
        "SELECT r.status, r.scheduled_for FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.name = 'long' ORDER BY r.scheduled_for"
    ).fetchall()
    assert long_runs[0][0] == "running"
    assert {status for status, _ in long_runs[1:]} == {"skipped"}
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
