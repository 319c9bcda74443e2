"""Issue 4 "Must show" 3, 4 and 5 with real `pgtick run` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from tests.dbhelp import Connection, NewRun, Runs

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


def _count_by_schedule(conn: Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT s.name, count(r.id) FROM schedules s "
        "LEFT JOIN runs r ON r.schedule_id = s.id AND r.scheduled_for <= now() "
        "GROUP BY s.name"
    ).fetchall()
    return dict(rows)


@pytest.mark.timeout(120)
def test_daemons_ticking_at_once_catch_up_per_policy_and_never_rematerialize(
    cluster: Cluster, conn: Connection, store: Runs
) -> None:
    """Must show 3."""
    # Half an hour away from the current minute: no occurrence is "on time" during the test.
    minute = (datetime.now(UTC).minute + 30) % 60
    config = cluster.config(HOURLY.format(minute=minute))
    first = cluster.start(config)
    first.signal(signal.SIGTERM)
    assert first.wait(20) == 0
    assert _count_by_schedule(conn) == {"hourly_latest": 0, "hourly_all": 0, "hourly_none": 0}

    # Three hours of downtime (the cursor, and when the schedules came due, three hours back),
    # then three daemons start (and tick) at the same moment.
    conn.execute(
        "UPDATE schedules SET materialized_until = now() - interval '3 hours', "
        "next_due_at = now() - interval '3 hours'"
    )
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
    assert store.prune("succeeded", "1d") == 4
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
    cluster: Cluster, conn: Connection
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


OWN_SCHEDULE = """
[schedules.mine]
job_type = "record"
cron = "0 0 1 1 *"
"""
INSERT_ROW = (
    "INSERT INTO schedules (name, job_type, cron, timezone, materialized_until) "
    "VALUES (%s, 'other_fleet', %s, %s, now())"
)


def _pauses(conn: Connection) -> dict[str, tuple[bool, str | None, str | None]]:
    rows = conn.execute("SELECT name, paused, paused_reason, paused_detail FROM schedules")
    return {name: (paused, reason, detail) for name, paused, reason, detail in rows}


@pytest.mark.timeout(120)
def test_a_refused_schedule_row_is_paused_and_the_daemon_keeps_running(
    cluster: Cluster, conn: Connection, store: Runs
) -> None:
    """Issue 7 bug 1: rows this version refuses (another fleet's job type, written by an older
    version) are paused with the reason; the daemon goes on ticking and serving its own types."""
    conn.execute(INSERT_ROW, ("legacy_range", "5-5 * * * *", "UTC"))  # before start
    config = cluster.config(OWN_SCHEDULE)
    # Tick every second, so the row inserted while running is met within the test's patience.
    config.write_text(config.read_text().replace("[ticker]\n", '[ticker]\ninterval = "1s"\n', 1))
    daemon = cluster.start(config)
    rows = _pauses(conn)
    assert rows["legacy_range"][:2] == (True, "invalid")
    assert "minute field '5-5'" in str(rows["legacy_range"][2])
    assert rows["mine"] == (False, None, None)  # the same first tick went on to the next row
    mine = conn.execute("SELECT next_due_at FROM schedules WHERE name = 'mine'").fetchone()
    assert mine is not None and mine[0] is not None

    conn.execute(INSERT_ROW, ("on_mars", "0 3 * * *", "Mars/Olympus"))  # while it runs
    wait_for(lambda: _pauses(conn)["on_mars"][0], 20, what="on_mars paused")
    assert _pauses(conn)["on_mars"][1:] == (
        "invalid",
        "schedules.on_mars.timezone: unknown time zone 'Mars/Olympus'",
    )
    run_id = store.enqueue(NewRun("record"))
    wait_for(
        lambda: (
            conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()
            == ("succeeded",)
        ),
        20,
        what="a run of the daemon's own type succeeded",
    )
    assert daemon.proc.poll() is None

    # One error line per refused row, however many ticks went by.
    invalid = [e for e in daemon.events() if e.get("event") == "schedule_invalid"]
    assert sorted(e["schedule"] for e in invalid) == ["legacy_range", "on_mars"]
    assert all(e["level"] == "error" and e["error"] for e in invalid), invalid

    listing = subprocess.run(
        [sys.executable, "-m", "pgtick", "schedules", "--config", str(config)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PGTICK_DSN": cluster.dsn},
    )  # fmt: skip
    assert (listing.returncode, listing.stderr) == (0, "")
    lines = listing.stdout.splitlines()
    assert any(line.startswith("on_mars ") and "paused (invalid)" in line for line in lines)
    assert (
        "on_mars is paused as invalid: schedules.on_mars.timezone: unknown time zone "
        "'Mars/Olympus'" in lines
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
